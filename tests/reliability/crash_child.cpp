// The child of the crash-consistency trials (crash_test.cpp): saves generation after
// generation until its parent kills it, and reports each commit on stdout.
//
//   crash_child DIR MODE SINGLE_FILE THREADS OVERWRITE START
//   crash_child DIR memory START
//
// MODE is sync (save), async (async_save staged by the writer) or async_bg (async_save
// staged on a DefaultStager's thread). With OVERWRITE 1 every generation replaces the
// checkpoint in DIR; with 0 generation g goes to DIR/gen-<g> with overwrite off. It
// prints "ready" once its state is built and "committed <g>" after each commit.
//
// With MODE memory it is one rank of the job the launcher's environment describes
// (RANK, WORLD_SIZE, GROUP_RANK, LOCAL_WORLD_SIZE, ...) and saves step after step, from
// START, into the memory tier under DIR (dcp/memory_tier.h), each save replicated to its
// peer node; "committed <s>" follows a save of step s that reported no error.

#include "reliability/generations.h"

#include <stowage/dcp/dcp.h>
#include <stowage/dcp/memory_tier.h>
#include <stowage/dist/world.h>

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <unistd.h>

namespace {

void say(const std::string& line) {
  const std::string text = line + "\n";
  // One write per line straight to the pipe: what was said before a kill arrives whole.
  if (::write(STDOUT_FILENO, text.data(), text.size()) != static_cast<ssize_t>(text.size())) std::_Exit(3);
}

int save_into_memory_tier(const std::string& root, int64_t step) {
  using namespace stowage;
  const dist::World world = dist::join_world(dist::ProcessGroupOptions().timeout(std::chrono::seconds(30)));
  dcp::MemoryTier tier(dcp::MemoryTierOptions(root).save_every(1), dcp::node_layout_from_env(world.size), world.group);
  StateDict state = reliability::generation_state(reliability::memory_tier_generation(world.rank, step));
  say("ready");
  for (;; ++step) {
    const dcp::MemorySaveReport report = tier.save(step, state);
    const std::string error = !report.error.empty()         ? report.error
                              : report.previous_replication ? report.previous_replication->error
                                                            : "";
    if (!error.empty()) {
      std::fprintf(stderr, "crash_child: %s\n", error.c_str());
      return 1;
    }
    if (report.previous_replication) say(fmt::format("replicated {}", report.previous_replication->step));
    say(fmt::format("committed {}", step));
    reliability::fill_generation(state, reliability::memory_tier_generation(world.rank, step + 1));
  }
}

int save_generations(int argc, char** argv) {
  using namespace stowage;
  if (argc != 7) {
    std::fprintf(stderr, "usage: crash_child DIR sync|async|async_bg SINGLE_FILE THREADS OVERWRITE START\n");
    return 2;
  }
  const std::string root = argv[1];
  const std::string mode = argv[2];
  const bool single_file = std::atoi(argv[3]) != 0;
  const int64_t threads = std::atoll(argv[4]);
  const bool overwrite = std::atoi(argv[5]) != 0;
  int64_t generation = std::atoll(argv[6]);

  const auto options = dcp::FileSystemWriterOptions().single_file_per_rank(single_file).thread_count(threads);
  const auto directory_of = [&](int64_t g) { return overwrite ? root : fmt::format("{}/gen-{:06d}", root, g); };
  StateDict state = reliability::generation_state(generation);
  dcp::DefaultStager background_stager;
  say("ready");
  try {
    for (;; ++generation) {
      dcp::FileSystemWriter writer(directory_of(generation),
                                   dcp::FileSystemWriterOptions(options).overwrite(overwrite));
      if (mode == "sync") {
        dcp::save(state, writer);
        reliability::fill_generation(state, generation + 1);
      } else {
        dcp::AsyncSaveResponse response =
            dcp::async_save(state, writer, mode == "async_bg" ? &background_stager : nullptr);
        response.staging_completion.get();
        // Training goes on while the snapshot is written: the checkpoint must still
        // hold this generation exactly.
        reliability::fill_generation(state, generation + 1);
        response.upload_completion.get();
      }
      say(fmt::format("committed {}", generation));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "crash_child: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[2]) == "memory") {
    try {
      return save_into_memory_tier(argv[1], std::atoll(argv[3]));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "crash_child: %s\n", e.what());
      return 1;
    }
  }
  return save_generations(argc, argv);
}
