// dist::join_world and dist::rank_device read the job from the environment as torchrun
// sets it: a job of one has no group; an accelerator named without an index is the
// rank's LOCAL_RANK one.

#include <stowage/dist/world.h>
#include <stowage/error.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace stowage::dist {
namespace {

// Sets (or, with nullopt, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(JoinWorld, AJobOfOneHasNoGroup) {
  for (const std::optional<std::string>& size : {std::optional<std::string>(), std::optional<std::string>("1")}) {
    const ScopedEnv world_size("WORLD_SIZE", size);
    const World world = join_world();
    EXPECT_FALSE(world.group.has_value());
    EXPECT_EQ(world.rank, 0);
    EXPECT_EQ(world.size, 1);
  }
}

TEST(JoinWorld, ASeveralRankJobWithoutItsVariablesIsRefused) {
  const ScopedEnv world_size("WORLD_SIZE", "2");
  const ScopedEnv rank("RANK", std::nullopt);
  EXPECT_THROW(join_world(), InvalidArgument);
}

TEST(RankDevice, AnAcceleratorWithoutAnIndexIsTheLocalRanks) {
  const ScopedEnv local_rank("LOCAL_RANK", "3");
  EXPECT_EQ(rank_device(c10::Device("cuda")), c10::Device("cuda:3"));
  EXPECT_EQ(rank_device(c10::Device("cuda:1")), c10::Device("cuda:1"));
  EXPECT_EQ(rank_device(c10::Device("cpu")), c10::Device("cpu"));
  {
    const ScopedEnv unset("LOCAL_RANK", std::nullopt);
    EXPECT_EQ(rank_device(c10::Device("cuda")), c10::Device("cuda"));
  }
  const ScopedEnv bad("LOCAL_RANK", "x1");
  try {
    rank_device(c10::Device("cuda"));
    ADD_FAILURE() << "took LOCAL_RANK x1";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("LOCAL_RANK 'x1'"));
  }
}

}  // namespace
}  // namespace stowage::dist
