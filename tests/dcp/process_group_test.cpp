// Process groups in one process: the environment contract, byte collectives, and the
// distributed save/load steps with a group of one (errors travel as CheckpointError).

#include "dcp/test_util.h"

#include <stowage/build_info.h>
#include <stowage/error.h>

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>

#include <signal.h>
#include <unistd.h>

namespace stowage::dcp {
namespace {

using testing::ScratchDir;

ProcessGroup group_of_one() {
  return init_process_group("127.0.0.1", testing::free_port(), 0, 1,
                            ProcessGroupOptions().timeout(std::chrono::seconds(20)));
}

TEST(DcpProcessGroup, TheEnvironmentIsCheckedNamingTheVariable) {
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  setenv("WORLD_SIZE", "1", 1);
  unsetenv("RANK");
  try {
    init_process_group_from_env();
    ADD_FAILURE() << "joined without RANK";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RANK"), std::string::npos) << e.what();
  }
  setenv("RANK", "two", 1);
  EXPECT_THROW(init_process_group_from_env(), InvalidArgument);
  setenv("RANK", "1", 1);  // not within a world of 1
  EXPECT_THROW(init_process_group_from_env(), InvalidArgument);
  EXPECT_THROW(init_process_group("127.0.0.1", 29500, 0, 1, ProcessGroupOptions().timeout(std::chrono::milliseconds(0))),
               InvalidArgument);
  EXPECT_THROW(
      init_process_group("127.0.0.1", 29500, 0, 1, ProcessGroupOptions().check_in_timeout(std::chrono::milliseconds(0))),
      InvalidArgument);
  for (const char* name : {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"}) unsetenv(name);
}

TEST(DcpProcessGroup, TensorCollectivesUseGlooOnTheCpuAndNcclForCudaTensors) {
  const ProcessGroup group = group_of_one();
  EXPECT_EQ(group.backend_name(c10::Device(c10::kCPU)), "gloo");
  at::Tensor cpu = at::arange(4, at::kFloat);
  group.all_reduce_sum(cpu);
  EXPECT_TRUE(cpu.equal(at::arange(4, at::kFloat)));
  const c10::Device cuda(c10::kCUDA, 0);
  if (!build_info().with_cuda) {
    EXPECT_THROW(group.backend_name(cuda), InvalidArgument);
    at::Tensor meta = at::zeros({4}, at::TensorOptions().device(c10::kMeta));
    EXPECT_THROW(group.all_reduce_sum(meta), InvalidArgument);
    return;
  }
  EXPECT_EQ(group.backend_name(cuda), "nccl");
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible: the NCCL collective itself is not run";
  at::Tensor on_device = at::arange(4, at::TensorOptions().dtype(at::kFloat).device(cuda));
  group.all_reduce_sum(on_device);
  group.broadcast(on_device, 0);
  EXPECT_TRUE(on_device.cpu().equal(at::arange(4, at::kFloat)));
}

TEST(DcpProcessGroup, ByteCollectivesOfAGroupOfOne) {
  const ProcessGroup group = group_of_one();
  EXPECT_EQ(group.rank(), 0);
  EXPECT_EQ(group.size(), 1);
  const std::string bytes("a\0b", 3);
  EXPECT_EQ(group.all_gather(bytes), std::vector<std::string>{bytes});
  EXPECT_EQ(group.gather(bytes, 0), std::vector<std::string>{bytes});
  EXPECT_EQ(group.scatter({bytes}, 0), bytes);
  EXPECT_EQ(group.broadcast("", 0), "");
  group.barrier();
  const ProcessGroup async_group = group.async_save_group();
  EXPECT_EQ(async_group.all_gather("x"), std::vector<std::string>{"x"});
}

void program_sigpipe_handler(int) {}

sighandler_t sigpipe_disposition() {
  struct sigaction current {};
  sigaction(SIGPIPE, nullptr, &current);
  return current.sa_handler;
}

// A peer's death must reach c10d as EPIPE, not kill the survivor with SIGPIPE; a
// handler the program installed itself is left alone.
TEST(DcpProcessGroup, JoiningIgnoresSigpipeUnlessTheProgramHandlesIt) {
  std::signal(SIGPIPE, SIG_DFL);
  group_of_one();
  EXPECT_EQ(sigpipe_disposition(), SIG_IGN);

  std::signal(SIGPIPE, program_sigpipe_handler);
  group_of_one();
  EXPECT_EQ(sigpipe_disposition(), &program_sigpipe_handler);
  std::signal(SIGPIPE, SIG_DFL);
}

TEST(DcpProcessGroup, ErrorsOfAGroupSaveOrLoadAreCheckpointErrorsAndChangeNothing) {
  const ScratchDir dir;
  const ProcessGroup group = group_of_one();
  StateDict state;
  state.insert("w", torch::ones({4}));
  save(state, dir.path(), group);

  StateDict bad;
  bad.insert("w", torch::Tensor());
  try {
    save(bad, dir.path(), group);
    ADD_FAILURE() << "saved an undefined tensor";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(e.step(), "plan");
    ASSERT_EQ(e.failures().count(0), 1u);
    EXPECT_NE(e.failures().at(0).find("'w'"), std::string::npos) << e.what();
  }
  StateDict target;
  target.insert("w", torch::zeros({5}));
  EXPECT_THROW(load(target, dir.path(), {}, group), CheckpointError);
  EXPECT_TRUE(torch::equal(target.at("w").toTensor(), torch::zeros({5})));
  target.insert_or_assign("w", torch::zeros({4}));
  load(target, dir.path(), {}, group);  // the first save is still the checkpoint
  EXPECT_TRUE(torch::equal(target.at("w").toTensor(), torch::ones({4})));

  // async_save on a group: the error reaches the futures, not the caller.
  FileSystemWriter writer(dir.path());
  const AsyncSaveResponse response = async_save(bad, writer, nullptr, {}, group);
  EXPECT_THROW(response.upload_completion.get(), CheckpointError);
  const AsyncSaveResponse good = async_save(state, writer, nullptr, {}, group);
  EXPECT_EQ(good.upload_completion.get().world_size, 1);
}

}  // namespace
}  // namespace stowage::dcp
