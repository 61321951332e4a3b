#include "cli/cli_util.h"

#include <torch/version.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

namespace stowage::testing {
namespace {
namespace fs = std::filesystem;

TEST(Launch, GivesEachRankTorchrunsEnvironment) {
  const fs::path dir = fs::temp_directory_path() / ("stowage-launch-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const auto result = run_command(stowage_binary() + " launch --nproc 3 -- sh -c 'echo $RANK $LOCAL_RANK $WORLD_SIZE " +
                                  "$MASTER_ADDR $MASTER_PORT > " + dir.string() + "/rank$RANK'");
  ASSERT_EQ(result.status, 0) << result.output;
  std::set<std::string> ports;
  for (int rank = 0; rank < 3; ++rank) {
    std::ifstream in(dir / ("rank" + std::to_string(rank)));
    int r = -1, local = -1, world = -1;
    std::string addr, port;
    in >> r >> local >> world >> addr >> port;
    EXPECT_EQ(r, rank);
    EXPECT_EQ(local, rank);
    EXPECT_EQ(world, 3);
    EXPECT_EQ(addr, "127.0.0.1");
    ports.insert(port);
  }
  EXPECT_EQ(ports.size(), 1u) << "every rank must rendezvous on the same port";
  fs::remove_all(dir);
}

TEST(Launch, AFailingRankStopsTheOthersAndSetsTheExitStatus) {
  const auto result =
      run_command(stowage_binary() + " launch --nproc 3 -- sh -c 'if [ $RANK = 1 ]; then exit 7; fi; exec sleep 600'");
  EXPECT_EQ(result.status, 7) << result.output;
  EXPECT_NE(result.output.find("rank 1 exited with status 7"), std::string::npos) << result.output;
}

TEST(Launch, MissingCommandIsAnError) {
  const auto result = run_command(stowage_binary() + " launch --nproc 2");
  EXPECT_NE(result.status, 0);
  EXPECT_NE(result.output.find("command"), std::string::npos) << result.output;
}

TEST(Cli, VersionAndHelpListTheSubcommands) {
  const auto version = run_command(stowage_binary() + " --version");
  EXPECT_EQ(version.status, 0);
  EXPECT_NE(version.output.find("stowage 0."), std::string::npos) << version.output;
  // The LibTorch it was built against, and whether CUDA is in.
  EXPECT_NE(version.output.find(std::string("\nLibTorch ") + TORCH_VERSION + "\n"), std::string::npos)
      << version.output;
  EXPECT_NE(version.output.find("\nCUDA"), std::string::npos) << version.output;
  const auto help = run_command(stowage_binary() + " --help");
  EXPECT_EQ(help.status, 0);
  for (const char* name : {"train", "ckpt", "bench", "launch"}) {
    EXPECT_NE(help.output.find(name), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace stowage::testing
