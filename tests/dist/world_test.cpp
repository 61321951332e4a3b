// dist::join_world and dist::rank_device read the job from the environment as torchrun
// sets it: a job of one has no group; a device named without an index is the rank's
// LOCAL_RANK one, or the first without LOCAL_RANK.

#include <stowage/dist/world.h>
#include <stowage/error.h>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#if defined(STOWAGE_WITH_SIM)
#include <stowage/sim/sim.h>
#endif

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

// The one reading of the launcher's integers: unset or empty is nothing, digits are a
// count, anything else names the variable and its value.
TEST(LauncherCount, ReadsDigitsAndNamesAnythingElse) {
  {
    const ScopedEnv unset("GROUP_RANK", std::nullopt);
    EXPECT_EQ(launcher_count("GROUP_RANK"), std::nullopt);
  }
  {
    const ScopedEnv empty("GROUP_RANK", "");
    EXPECT_EQ(launcher_count("GROUP_RANK"), std::nullopt);
  }
  {
    const ScopedEnv set("GROUP_RANK", "12");
    EXPECT_EQ(launcher_count("GROUP_RANK"), 12);
  }
  for (const char* bad : {"-1", " 2", "3 ", "1e3", "0x10", "99999999999999999999"}) {
    const ScopedEnv set("GROUP_RANK", bad);
    try {
      launcher_count("GROUP_RANK");
      ADD_FAILURE() << "took GROUP_RANK='" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(fmt::format("GROUP_RANK='{}' is not a non-negative integer", bad)));
    }
  }
}

TEST(RankDevice, AnAcceleratorWithoutAnIndexIsTheLocalRanks) {
  const ScopedEnv local_rank("LOCAL_RANK", "3");
  EXPECT_EQ(rank_device(c10::Device("cuda")), c10::Device("cuda:3"));
  EXPECT_EQ(rank_device(c10::Device("cuda:1")), c10::Device("cuda:1"));
  EXPECT_EQ(rank_device(c10::Device("cpu")), c10::Device("cpu"));
  {
    const ScopedEnv unset("LOCAL_RANK", std::nullopt);
    EXPECT_EQ(rank_device(c10::Device("cuda")), c10::Device("cuda:0"));
  }
  const ScopedEnv bad("LOCAL_RANK", "x1");
  try {
    rank_device(c10::Device("cuda"));
    ADD_FAILURE() << "took LOCAL_RANK x1";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("LOCAL_RANK='x1' is not a non-negative integer"));
  }
}

// Whatever the device type, with no device present: without LOCAL_RANK (a job of one
// process) the first device, with it the rank's; always an index, but for the CPU.
TEST(RankDevice, EveryDeviceTypeButTheCpuGetsAnIndex) {
  std::vector<c10::DeviceType> types = {c10::kCUDA, c10::kXLA, c10::DeviceType::PrivateUse1};
#if defined(STOWAGE_WITH_SIM)
  sim::register_device();
  EXPECT_EQ(c10::Device("sim").type(), c10::DeviceType::PrivateUse1);  // the simulator is PrivateUse1
#endif
  for (const c10::DeviceType type : types) {
    SCOPED_TRACE(c10::DeviceTypeName(type));
    {
      const ScopedEnv unset("LOCAL_RANK", std::nullopt);
      EXPECT_EQ(rank_device(c10::Device(type)), c10::Device(type, 0));
    }
    {
      const ScopedEnv empty("LOCAL_RANK", "");
      EXPECT_EQ(rank_device(c10::Device(type)), c10::Device(type, 0));
    }
    const ScopedEnv local_rank("LOCAL_RANK", "1");
    EXPECT_EQ(rank_device(c10::Device(type)), c10::Device(type, 1));
    EXPECT_EQ(rank_device(c10::Device(type, 0)), c10::Device(type, 0));
  }
  const ScopedEnv unset("LOCAL_RANK", std::nullopt);
  EXPECT_EQ(rank_device(c10::Device("cpu")), c10::Device("cpu"));
#if defined(STOWAGE_WITH_SIM)
  EXPECT_EQ(rank_device(c10::Device("sim")), c10::Device("sim:0"));
  EXPECT_EQ(rank_device(c10::Device("sim")).str(), "sim:0");
#endif
}

}  // namespace
}  // namespace stowage::dist
