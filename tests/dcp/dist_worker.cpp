// One rank of the distributed dcp tests (tests/dcp/distributed_test.cpp), run by
// `stowage launch` or the test itself with torchrun's environment. It joins the group
// and runs its commands in order, checking every result itself:
//
//   save DIR      saves the test state, sharded over this world, into DIR
//   load DIR      loads DIR into this world's layout and checks every value
//   async DIR     two async_saves in a row on every rank, then a load
//   fail DIR      a save in which rank 1 fails mid-write: every rank must raise an
//                 error naming rank 1, DIR must keep its previous checkpoint; then a
//                 successful save (the resume)
//   dieR DIR      a save in which rank R dies mid-write: the others must fail
//                 within the group's timeout (STOWAGE_TEST_TIMEOUT_MS; check-ins:
//                 STOWAGE_TEST_CHECK_IN_MS) with an error naming rank R, and commit
//                 nothing
//   early DIR     saves, loads and async_saves in which rank 1 fails before the first
//                 collective (a Stateful that throws, an undefined tensor, an empty
//                 path): every rank must raise a DistributedCheckpointError naming rank 1 within
//                 seconds, and the group must stay usable
//   reject DIR    async_save with PendingSave::kReject while only rank 1 has a save in
//                 flight: every rank must reject, naming rank 1, and the save in
//                 flight must still complete
//   empty DIR     saves and loads shardings with empty shards: one where an empty
//                 shard starts where another rank's starts, then random ones with empty
//                 pieces anywhere (the same random choices on every rank), each loaded
//                 into another random sharding and checked
//
// Exit status 0 when every check held; 1 with a message otherwise.
#include <stowage/dcp/dcp.h>
#include <stowage/dist/process_group.h>
#include <stowage/error.h>
#include <stowage/state/stateful.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>
#include <random>
#include <set>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <cerrno>
#include <unistd.h>

namespace dcp = stowage::dcp;
namespace dist = stowage::dist;

namespace {

int64_t g_rank = 0;
int64_t g_world = 1;

#define REQUIRE(condition, ...)                                                                        \
  do {                                                                                                 \
    if (!(condition))                                                                                  \
      throw std::runtime_error(                                                                        \
          fmt::format("rank {}: check failed: {}: {}", g_rank, #condition, fmt::format(__VA_ARGS__))); \
  } while (0)

// The split of `size` into `world` parts, the first ones one longer (uneven shards).
std::pair<int64_t, int64_t> split(int64_t size, int64_t world, int64_t rank) {
  const int64_t base = size / world;
  const int64_t extra = size % world;
  const int64_t length = base + (rank < extra ? 1 : 0);
  const int64_t offset = rank * base + std::min(rank, extra);
  return {offset, length};
}

// The global tensors, the same on every rank and in every run (`generation` shifts them).
torch::Tensor global_rows(double generation) {  // sharded by rows
  return torch::arange(11 * 6, torch::kFloat).reshape({11, 6}) + generation;
}
torch::Tensor global_cols(double generation) {  // sharded by columns
  return torch::arange(7 * 9, torch::kDouble).reshape({7, 9}) * 0.5 + generation;
}
torch::Tensor global_big(double generation) {  // 1 MiB: four checksum blocks
  return torch::arange(256 * 1024, torch::kFloat).reshape({256, 1024}) + generation;
}
torch::Tensor replicated(int i, double generation) {
  return torch::full({256 + i}, float(i) + generation);  // over 1 KiB: more than the shards' imbalance
}

c10::IValue shard(const torch::Tensor& global, int64_t dim, const torch::Tensor& local_source) {
  const auto [offset, length] = split(global.size(dim), g_world, g_rank);
  std::vector<int64_t> offsets(global.dim(), 0);
  offsets[dim] = offset;
  torch::Tensor local = local_source.defined() ? local_source : global.narrow(dim, offset, length).clone();
  return dcp::sharded_tensor(local, global.sizes().vec(), offsets);
}

// The state of this rank: sharded, replicated and non-tensor entries, some nested.
// With `fill` the tensors hold the checkpoint's values; otherwise garbage to overwrite.
stowage::StateDict make_state(double generation, bool fill) {
  const auto garbage = [&](const torch::Tensor& global, int64_t dim) {
    const auto [offset, length] = split(global.size(dim), g_world, g_rank);
    (void)offset;
    std::vector<int64_t> sizes = global.sizes().vec();
    sizes[dim] = length;
    return torch::full(sizes, -7, global.options());
  };
  stowage::StateDict state;
  const torch::Tensor rows = global_rows(generation);
  const torch::Tensor cols = global_cols(generation);
  const torch::Tensor big = global_big(generation);
  state.insert("rows", shard(rows, 0, fill ? torch::Tensor() : garbage(rows, 0)));
  state.insert("big", shard(big, 0, fill ? torch::Tensor() : garbage(big, 0)));
  c10::impl::GenericDict model(c10::StringType::get(), c10::AnyType::get());
  model.insert("cols", shard(cols, 1, fill ? torch::Tensor() : garbage(cols, 1)));
  for (int i = 0; i < 4; ++i) {
    model.insert("rep" + std::to_string(i), fill ? replicated(i, generation) : torch::zeros({256 + i}));
  }
  model.insert("scale", fill ? torch::tensor(2.5 + generation) : torch::tensor(0.0));
  state.insert("model", model);
  state.insert("step", fill ? int64_t(1000 + generation) : int64_t(-1));
  state.insert("name", fill ? std::string("gen") + std::to_string(int(generation)) : std::string("none"));
  return state;
}

torch::Tensor local_of(const c10::IValue& value) {
  return dcp::as_sharded_tensor(value)->local();
}

void check_state(const stowage::StateDict& state, double generation) {
  const auto expect_shard = [&](const char* name, const c10::IValue& value, const torch::Tensor& global, int64_t dim) {
    const auto [offset, length] = split(global.size(dim), g_world, g_rank);
    REQUIRE(torch::equal(local_of(value), global.narrow(dim, offset, length)), "{} differs (generation {})", name,
            generation);
  };
  expect_shard("rows", state.at("rows"), global_rows(generation), 0);
  expect_shard("big", state.at("big"), global_big(generation), 0);
  const auto model = state.at("model").toGenericDict();
  expect_shard("cols", model.at("cols"), global_cols(generation), 1);
  for (int i = 0; i < 4; ++i) {
    REQUIRE(torch::equal(model.at("rep" + std::to_string(i)).toTensor(), replicated(i, generation)), "rep{} differs",
            i);
  }
  REQUIRE(model.at("scale").toTensor().item<double>() == 2.5 + generation, "scale differs");
  REQUIRE(state.at("step").toInt() == int64_t(1000 + generation), "step is {}", state.at("step").toInt());
  REQUIRE(state.at("name").toStringRef() == "gen" + std::to_string(int(generation)), "name differs");
}

// What the metadata of a save with this world must say.
void check_metadata(const dcp::Metadata& metadata) {
  REQUIRE(metadata.world_size == g_world, "world_size {}", metadata.world_size);
  std::set<int64_t> writers;
  for (int i = 0; i < 4; ++i) {
    const dcp::EntryMetadata* rep = metadata.find("model.rep" + std::to_string(i));
    REQUIRE(rep != nullptr && rep->chunks.size() == 1, "replicated rep{} must be written exactly once", i);
    writers.insert(rep->chunks[0].rank);
  }
  // Fewest bytes planned so far: the replicated tensors spread over the ranks.
  REQUIRE(static_cast<int64_t>(writers.size()) == std::min<int64_t>(g_world, 4),
          "replicated tensors written by {} ranks", writers.size());
  const dcp::EntryMetadata* cols = metadata.find("model.cols");
  REQUIRE(cols != nullptr && static_cast<int64_t>(cols->chunks.size()) == g_world, "cols has {} chunks",
          cols->chunks.size());
  for (const dcp::TensorChunk& chunk : cols->chunks) {
    REQUIRE(chunk.box.offsets[1] == split(9, g_world, chunk.rank).first, "cols chunk of rank {} misplaced", chunk.rank);
  }
  REQUIRE(metadata.find("step") != nullptr && metadata.find("step")->value.toInt() >= 1000, "step missing");
}

double generation_of(const std::string& dir) {
  // Each directory gets its own values, so a load from the wrong one fails.
  return static_cast<double>(std::hash<std::string>{}(dir) % 97);
}

void save_command(const dist::ProcessGroup& group, const std::string& dir) {
  const dcp::Metadata metadata = dcp::save(make_state(generation_of(dir), true), dir, group);
  check_metadata(metadata);
}

void load_command(const dist::ProcessGroup& group, const std::string& dir) {
  stowage::StateDict state = make_state(generation_of(dir), false);
  dcp::load(state, dir, {}, group);
  check_state(state, generation_of(dir));
  // Only the overlapping bytes (in whole checksum blocks) are read: a row shard of
  // "big" touches at most two partial blocks per saved chunk beyond its own bytes.
  stowage::StateDict big;
  big.insert("big", make_state(0, false).at("big"));
  dcp::FileSystemReader reader(dir);
  dcp::load(big, reader, dcp::LoadOptions().allow_partial_load(true), group);
  const dcp::Metadata metadata = reader.read_metadata();
  const int64_t own = local_of(big.at("big")).numel() * 4;
  const int64_t bound = own + 2 * dcp::kChecksumBlockBytes * static_cast<int64_t>(metadata.find("big")->chunks.size());
  REQUIRE(reader.bytes_read() <= bound, "read {} bytes of 'big' for a shard of {} bytes", reader.bytes_read(), own);
  if (g_world > 1)
    REQUIRE(reader.bytes_read() < 256 * 1024 * 4, "read the whole of 'big' ({} bytes)", reader.bytes_read());
}

void async_command(const dist::ProcessGroup& group, const std::string& dir) {
  dcp::FileSystemWriter writer(dir);
  stowage::StateDict first = make_state(1, true);
  stowage::StateDict second = make_state(2, true);
  const dcp::AsyncSaveResponse a = dcp::async_save(first, writer, nullptr, {}, group);
  a.staging_completion.get();
  // Training goes on: the caller's group keeps running collectives meanwhile.
  group.barrier();
  const auto all = group.all_gather(std::to_string(g_rank));
  REQUIRE(static_cast<int64_t>(all.size()) == g_world, "all_gather during async_save");
  dcp::FileSystemWriter other_writer(dir + "-b");
  const dcp::AsyncSaveResponse b = dcp::async_save(second, other_writer, nullptr, {}, group);
  check_metadata(a.upload_completion.get());
  check_metadata(b.upload_completion.get());
  stowage::StateDict state = make_state(1, false);
  dcp::load(state, dir, {}, group);
  check_state(state, 1);
  state = make_state(2, false);
  dcp::load(state, dir + "-b", {}, group);
  check_state(state, 2);
}

// The shard of `global` along `dim` that this rank holds when the ranks' pieces end at
// `cuts` (ascending, world - 1 of them, repeats making empty pieces); an empty piece
// sits at `empty_offset` (any offset of the dimension is a valid place for it).
c10::IValue piece(const torch::Tensor& global, int64_t dim, const std::vector<int64_t>& cuts, int64_t empty_offset,
                  bool fill) {
  const int64_t begin = g_rank == 0 ? 0 : cuts[g_rank - 1];
  const int64_t end = g_rank == g_world - 1 ? global.size(dim) : cuts[g_rank];
  std::vector<int64_t> offsets(global.dim(), 0);
  offsets[dim] = begin == end ? empty_offset : begin;
  const torch::Tensor local = global.narrow(dim, begin, end - begin).clone();
  return dcp::sharded_tensor(fill ? local : torch::full_like(local, -1), global.sizes().vec(), offsets);
}

// A random sharding of every tensor of `globals`, drawn from `random` (seeded alike on
// every rank), with empty pieces as likely as not.
stowage::StateDict random_sharding(const std::vector<torch::Tensor>& globals, std::mt19937& random, bool fill) {
  stowage::StateDict state;
  for (size_t i = 0; i < globals.size(); ++i) {
    const torch::Tensor& global = globals[i];
    const int64_t dim = std::uniform_int_distribution<int64_t>(0, global.dim() - 1)(random);
    const int64_t size = global.size(dim);
    std::vector<int64_t> cuts;
    for (int64_t r = 1; r < g_world; ++r) {
      // Cuts at the ends or repeated make empty pieces: one in three cuts is at an end.
      const int64_t kind = std::uniform_int_distribution<int64_t>(0, 2)(random);
      cuts.push_back(kind == 0 ? 0 : kind == 1 ? size : std::uniform_int_distribution<int64_t>(0, size)(random));
    }
    std::sort(cuts.begin(), cuts.end());
    const int64_t empty_offset = std::uniform_int_distribution<int64_t>(0, size)(random);
    state.insert("t" + std::to_string(i), piece(global, dim, cuts, empty_offset, fill));
  }
  return state;
}

void empty_command(const dist::ProcessGroup& group, const std::string& dir) {
  // Rank 0 holds all 97 elements, every other rank an empty shard at offset 0; then
  // loaded the other way round, the last rank holding all of it.
  const torch::Tensor t = torch::arange(97, torch::kFloat);
  stowage::StateDict state;
  const bool holds_all = g_rank == 0;
  state.insert("t", dcp::sharded_tensor(holds_all ? t : t.narrow(0, 0, 0), {97}, {0}));
  dcp::save(state, dir, group);
  const bool loads_all = g_rank == g_world - 1;
  const torch::Tensor into = loads_all ? torch::zeros({97}) : torch::zeros({0});
  stowage::StateDict target;
  target.insert("t", dcp::sharded_tensor(into, {97}, {loads_all ? 0 : 97}));
  dcp::load(target, dir, {}, group);
  if (loads_all) REQUIRE(torch::equal(into, t), "t differs");

  std::mt19937 random(20261201);
  for (int round = 0; round < 8; ++round) {
    std::vector<torch::Tensor> globals;
    for (int i = 0; i < 12; ++i) {
      std::vector<int64_t> shape;
      const int64_t dims = std::uniform_int_distribution<int64_t>(1, 3)(random);
      for (int64_t d = 0; d < dims; ++d) shape.push_back(std::uniform_int_distribution<int64_t>(0, 6)(random));
      torch::manual_seed(round * 100 + i);
      globals.push_back(torch::randn(shape));
    }
    const std::string round_dir = fmt::format("{}-{}", dir, round);
    dcp::save(random_sharding(globals, random, /*fill=*/true), round_dir, group);
    stowage::StateDict loaded = random_sharding(globals, random, /*fill=*/false);
    dcp::load(loaded, round_dir, {}, group);
    for (size_t i = 0; i < globals.size(); ++i) {
      const auto shard = dcp::as_sharded_tensor(loaded.at("t" + std::to_string(i)));
      torch::Tensor expected = globals[i];
      for (int64_t d = 0; d < expected.dim(); ++d) {
        expected = expected.narrow(d, shard->box().offsets[d], shard->box().sizes[d]);
      }
      REQUIRE(torch::equal(shard->local(), expected), "round {}: t{} of shape [{}] differs", round, i,
              fmt::join(globals[i].sizes(), ", "));
    }
  }
}

// Fails (or dies) on rank `culprit` once its first chunk is written.
class FailingWriter : public dcp::FileSystemWriter {
 public:
  FailingWriter(const std::string& dir, bool die, int64_t culprit = 1)
      : FileSystemWriter(dir), dir_(dir), die_(die), culprit_(culprit) {}

 protected:
  void on_item_written(const dcp::WriteResult& result) override {
    if (g_rank != culprit_) return;
    if (die_) _exit(3);
    throw stowage::IoError(fmt::format("injected disk failure after writing '{}'", result.fqn), dir_, "write", EIO);
  }

 private:
  std::string dir_;
  bool die_;
  int64_t culprit_;
};

void fail_command(const dist::ProcessGroup& group, const std::string& dir) {
  dcp::save(make_state(1, true), dir, group);
  FailingWriter failing(dir, /*die=*/false);
  try {
    dcp::save(make_state(2, true), failing, group);
    REQUIRE(false, "the save with a failing rank succeeded");
  } catch (const dcp::DistributedCheckpointError& e) {
    REQUIRE(e.step() == "write" && e.failures().size() == 1 && e.failures().count(1) == 1, "{}", e.what());
    REQUIRE(std::string(e.what()).find("injected disk failure") != std::string::npos, "{}", e.what());
    // The rank's IoError travels with its fields.
    const dcp::RankFailure& failure = e.failures().at(1);
    REQUIRE(failure.kind == dcp::RankFailure::Kind::kIo && failure.operation == "write" &&
                failure.error_number == EIO && failure.path == dir,
            "{}: kind {}, operation '{}', errno {}, path '{}'", e.what(), static_cast<int>(failure.kind),
            failure.operation, failure.error_number, failure.path);
  }
  group.barrier();  // every rank has cleaned up
  stowage::StateDict state = make_state(0, false);
  dcp::load(state, dir, {}, group);
  check_state(state, 1);  // the previous checkpoint
  // Resume: the next save on the same group succeeds.
  dcp::save(make_state(3, true), dir, group);
  state = make_state(0, false);
  dcp::load(state, dir, {}, group);
  check_state(state, 3);
  // Nothing of the failed save is left: every data file belongs to the checkpoint.
  const dcp::Metadata metadata = dcp::FileSystemReader(dir).read_metadata();
  const std::vector<std::string> files = metadata.files();
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    REQUIRE(name == dcp::kMetadataFileName || std::find(files.begin(), files.end(), name) != files.end(),
            "stray file '{}'", name);
  }
}

void die_command(const dist::ProcessGroup& group, const std::string& dir, int64_t dying_rank) {
  dcp::save(make_state(1, true), dir, group);
  FailingWriter dying(dir, /*die=*/true, dying_rank);
  const auto start = std::chrono::steady_clock::now();
  try {
    dcp::save(make_state(2, true), dying, group);
    REQUIRE(false, "the save with a dead rank succeeded");
  } catch (const dcp::DistributedCheckpointError& e) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << fmt::format("rank {} failed after {:.1f} s: {}\n", g_rank, seconds, e.what());
    REQUIRE(seconds < group.timeout().count() / 1000.0 + 5, "took {} s", seconds);
    REQUIRE(e.failures().count(dying_rank) == 1, "the dead rank {} is not named: {}", dying_rank, e.what());
    REQUIRE(e.failures().at(dying_rank).kind == dcp::RankFailure::Kind::kUnresponsive, "{}", e.what());
  }
  // The group is out of step for good: its next collective fails at once, saying why.
  const auto again = std::chrono::steady_clock::now();
  try {
    group.barrier();
    REQUIRE(false, "a barrier succeeded on a group that lost rank {}", dying_rank);
  } catch (const dist::CollectiveError& e) {
    REQUIRE(std::string(e.what()).find("failed in an earlier collective") != std::string::npos, "{}", e.what());
    REQUIRE(std::count(e.unresponsive_ranks().begin(), e.unresponsive_ranks().end(), dying_rank) == 1, "{}", e.what());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - again).count();
  REQUIRE(seconds < group.timeout().count() / 2000.0, "the barrier took {} s", seconds);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs `operation` (`what`), which must raise on every rank a DistributedCheckpointError of `step`
// naming rank 1 with `cause`, long before the group's timeout: no rank waited for one
// that had given up.
template <typename Operation>
void expect_rank1_failure(const dist::ProcessGroup& group, const char* what, const std::string& step,
                          const std::string& cause, Operation&& operation) {
  const auto start = std::chrono::steady_clock::now();
  try {
    operation();
    REQUIRE(false, "{} succeeded", what);
  } catch (const dcp::DistributedCheckpointError& e) {
    REQUIRE(e.step() == step && e.failures().size() == 1 && e.failures().count(1) == 1, "{}: {}", what, e.what());
    REQUIRE(e.failures().at(1).message.find(cause) != std::string::npos, "{}: {}", what, e.what());
  }
  const double seconds = seconds_since(start);
  REQUIRE(seconds < group.timeout().count() / 2000.0, "{} took {:.1f} s", what, seconds);
  std::cout << fmt::format("rank {}: {} failed everywhere after {:.2f} s\n", g_rank, what, seconds);
}

class ThrowingStateful : public stowage::Stateful {
 public:
  stowage::StateDict state_dict() override { throw stowage::Error("injected state_dict failure"); }
  void load_state_dict(const stowage::StateDict&) override {}
};

// The test state, with rank 1's entry `key` replaced by `value`.
stowage::StateDict with_rank1_entry(stowage::StateDict state, const std::string& key, const c10::IValue& value) {
  if (g_rank == 1) state.insert_or_assign(key, value);
  return state;
}

void early_command(const dist::ProcessGroup& group, const std::string& dir) {
  REQUIRE(g_world == 2, "early needs 2 ranks");
  dcp::save(make_state(1, true), dir, group);
  const c10::IValue throwing = stowage::as_ivalue(c10::make_intrusive<ThrowingStateful>());
  const c10::IValue undefined = torch::Tensor();

  expect_rank1_failure(group, "save with a throwing Stateful", "plan", "injected state_dict failure",
                       [&] { dcp::save(with_rank1_entry(make_state(2, true), "name", throwing), dir, group); });
  expect_rank1_failure(group, "save with an undefined tensor", "plan", "'step'",
                       [&] { dcp::save(with_rank1_entry(make_state(2, true), "step", undefined), dir, group); });
  expect_rank1_failure(group, "save to an empty path", "plan", "path is empty",
                       [&] { dcp::save(make_state(2, true), g_rank == 1 ? std::string() : dir, group); });
  expect_rank1_failure(group, "load from an empty path", "load", "path is empty", [&] {
    stowage::StateDict state = make_state(0, false);
    dcp::load(state, g_rank == 1 ? std::string() : dir, {}, group);
  });
  expect_rank1_failure(group, "load into a throwing Stateful", "load", "injected state_dict failure", [&] {
    stowage::StateDict state = with_rank1_entry(make_state(0, false), "name", throwing);
    dcp::load(state, dir, dcp::LoadOptions().allow_partial_load(true), group);
  });
  dcp::FileSystemWriter writer(dir);
  expect_rank1_failure(group, "async_save with a throwing Stateful", "plan", "injected state_dict failure", [&] {
    const dcp::AsyncSaveResponse response =
        dcp::async_save(with_rank1_entry(make_state(2, true), "name", throwing), writer, nullptr, {}, group);
    if (g_rank == 1) {
      try {
        response.staging_completion.get();
        REQUIRE(false, "staging succeeded with a throwing Stateful");
      } catch (const stowage::Error& e) {
        REQUIRE(std::string(e.what()).find("injected") != std::string::npos, "{}", e.what());
      }
    }
    response.upload_completion.get();
  });
  expect_rank1_failure(group, "async_save with an undefined tensor", "plan", "'step'", [&] {
    dcp::async_save(with_rank1_entry(make_state(2, true), "step", undefined), writer, nullptr, {}, group)
        .upload_completion.get();
  });

  // Nothing was committed, and both groups still work.
  stowage::StateDict state = make_state(0, false);
  dcp::load(state, dir, {}, group);
  check_state(state, 1);
  check_metadata(dcp::async_save(make_state(3, true), writer, nullptr, {}, group).upload_completion.get());
  check_metadata(dcp::save(make_state(4, true), dir, group));
  state = make_state(0, false);
  dcp::load(state, dir, {}, group);
  check_state(state, 4);
}

// Holds rank 1's writes at a gate until it opens.
class GatedWriter : public dcp::FileSystemWriter {
 public:
  explicit GatedWriter(const std::string& dir) : FileSystemWriter(dir) {}
  void open() { open_ = true; }

 protected:
  void on_item_written(const dcp::WriteResult&) override {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (g_rank == 1 && !open_ && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  std::atomic<bool> open_{false};
};

void reject_command(const dist::ProcessGroup& group, const std::string& dir) {
  REQUIRE(g_world == 2, "reject needs 2 ranks");
  GatedWriter gated(dir);
  dcp::FileSystemWriter spare(dir + "-spare");
  const dcp::AsyncSaveOptions reject = dcp::AsyncSaveOptions().if_save_pending(dcp::PendingSave::kReject);
  const dcp::AsyncSaveResponse first = dcp::async_save(make_state(1, true), gated, nullptr, reject, group);
  first.staging_completion.get();
  // Rank 1's save now waits at its gate (and rank 0's for rank 1's writes). Rank 1
  // passes that writer again, rank 0 a free one: only rank 1 would reject.
  dcp::StorageWriter& writer = g_rank == 1 ? static_cast<dcp::StorageWriter&>(gated) : spare;
  expect_rank1_failure(group, "async_save rejected on rank 1", "start", "still in flight",
                       [&] { dcp::async_save(make_state(2, true), writer, nullptr, reject, group); });
  REQUIRE(!has_pending_save(spare), "a save started on rank {} although rank 1 rejected", g_rank);
  gated.open();
  check_metadata(first.upload_completion.get());
  // The background saves are still in step.
  check_metadata(dcp::async_save(make_state(3, true), spare, nullptr, reject, group).upload_completion.get());
  stowage::StateDict state = make_state(0, false);
  dcp::load(state, dir, {}, group);
  check_state(state, 1);
  state = make_state(0, false);
  dcp::load(state, dir + "-spare", {}, group);
  check_state(state, 3);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const char* timeout = std::getenv("STOWAGE_TEST_TIMEOUT_MS");
    const char* check_in = std::getenv("STOWAGE_TEST_CHECK_IN_MS");
    const dist::ProcessGroup group = dist::init_process_group_from_env(
        dist::ProcessGroupOptions()
            .timeout(std::chrono::milliseconds(timeout ? std::atoll(timeout) : 60000))
            .check_in_timeout(std::chrono::milliseconds(check_in ? std::atoll(check_in) : 10000)));
    g_rank = group.rank();
    g_world = group.size();
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string command = argv[i];
      const std::string dir = argv[i + 1];
      if (command == "save") {
        save_command(group, dir);
      } else if (command == "load") {
        load_command(group, dir);
      } else if (command == "async") {
        async_command(group, dir);
      } else if (command == "fail") {
        fail_command(group, dir);
      } else if (command.rfind("die", 0) == 0) {
        die_command(group, dir, std::stoll(command.substr(3)));
      } else if (command == "early") {
        early_command(group, dir);
      } else if (command == "reject") {
        reject_command(group, dir);
      } else if (command == "empty") {
        empty_command(group, dir);
      } else {
        throw std::runtime_error("unknown command " + command);
      }
    }
    std::cout << fmt::format("rank {} of {}: ok\n", g_rank, g_world);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << fmt::format("rank {} of {}: {}\n", g_rank, g_world, e.what());
    return 1;
  }
}
