// The stowage tool's numeric options answer a bad value with what is wrong with it, in
// every subcommand: "abc is not an integer", "-1 is below the minimum of 1", never
// CLI11's "not in range 0.000000 to 17976931348623157…" (a 309-digit number). Command lines
// are parsed in this process (cli/in_process.h); a few go through the built tool, as a
// user runs it.
#include "cli/cli_util.h"
#include "cli/in_process.h"

#include "cli_numbers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace stowage::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct NumericOption {
  std::string command;  // the subcommand, e.g. "bench swap"
  std::string option;
  long long minimum;
  long long maximum = 0;  // 0: the option type's largest
  std::string tail;       // what else the command line needs to parse
};

const std::vector<NumericOption> kIntegerOptions = {
    {"train", "--steps", 1},
    {"train", "--batch", 1},
    {"train", "--seq-len", 1},
    {"train", "--layers", 1},
    {"train", "--width", 1},
    {"train", "--heads", 1},
    {"train", "--seed", 0},
    {"train", "--threads", 1},
    {"train", "--recompute-segments", 0},
    {"train", "--swap-times", 0},
    {"train", "--ckpt-every", 0},
    {"train", "--keep", 1},
    {"train", "--log-every", 1},
    {"train", "--nproc", 1},
    {"bench activation", "--blocks", 1},
    {"bench activation", "--width", 1},
    {"bench activation", "--batch", 1},
    {"bench activation", "--repetitions", 1},
    {"bench activation", "--segments", 1},
    {"bench swap", "--params", 1},
    {"bench swap", "--tensors", 1},
    {"bench swap", "--warmup-steps", 0},
    {"bench swap", "--steps", 1},
    {"bench swap", "--cpu-cache-mib", 0},
    {"bench dcp", "--size-mib", 1},
    {"bench dcp", "--nproc", 1, 64},
    {"bench interop", "--size-mib", 1},
    {"bench interop", "--tensors", 1},
    {"launch", "--nproc", 1, 1024, " -- true"},
    {"launch", "--master-port", 0, 65535, " -- true"},
    {"launch", "--grace", 0, 0, " -- true"},
    {"train", "--max-save-failures", 0, 0, ""},
};

std::string command_line(const NumericOption& o, const std::string& value) {
  return o.command + " " + o.option + " " + value + o.tail;
}

// A bad value is refused before any command runs.
CommandResult run_with(const NumericOption& o, const std::string& value) {
  return run_in_process(command_line(o, value));
}

void expect_refused(const CommandResult& result, const std::string& message) {
  EXPECT_NE(result.status, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr(message));
  EXPECT_THAT(result.output, Not(HasSubstr("179769313486231570")));
  EXPECT_THAT(result.output, Not(HasSubstr("not in range")));
}

// One value below the minimum per option shows that it has its validator, with the
// right minimum; the validators' other answers are tested as units below.
TEST(Options, EveryIntegerOptionNamesWhatIsWrongWithItsValue) {
  for (const NumericOption& o : kIntegerOptions) {
    SCOPED_TRACE(o.command + " " + o.option);
    const std::string below = std::to_string(o.minimum - 1);
    expect_refused(run_with(o, below),
                   o.option + ": " + below + " is below the minimum of " + std::to_string(o.minimum));
    if (o.maximum > 0) {
      const std::string above = std::to_string(o.maximum + 1);
      expect_refused(run_with(o, above),
                     o.option + ": " + above + " is above the maximum of " + std::to_string(o.maximum));
    }
  }
  expect_refused(run_with(kIntegerOptions[0], "abc"), "--steps: abc is not an integer");
}

// The built tool says the same, with the usage status, for its own options and for those
// of stowage-bench, which it runs.
TEST(Options, TheToolRefusesABadValueWithTheUsageStatus) {
  for (const NumericOption& o : {kIntegerOptions.front(), NumericOption{"bench swap", "--steps", 1}}) {
    SCOPED_TRACE(o.command + " " + o.option);
    const CommandResult result = run_command(stowage_binary() + " " + command_line(o, "abc"));
    expect_refused(result, o.option + ": abc is not an integer");
    EXPECT_EQ(result.status, 2) << result.output;
  }
}

TEST(Options, IntegerValidation) {
  using cli::detail::integer_problem;
  const long long int64_min = std::numeric_limits<int64_t>::min();
  const unsigned long long int64_max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(integer_problem("1", 1, int64_max), "");
  EXPECT_EQ(integer_problem("+7", 1, int64_max), "");
  EXPECT_EQ(integer_problem("0", 0, 0), "");
  EXPECT_EQ(integer_problem("-0", 0, 10), "");
  EXPECT_EQ(integer_problem("9223372036854775807", 1, int64_max), "");
  EXPECT_EQ(integer_problem("-9223372036854775808", int64_min, int64_max), "");
  EXPECT_EQ(integer_problem("18446744073709551615", 0, std::numeric_limits<uint64_t>::max()), "");
  for (const char* bad : {"abc", "", "-", "+", "2.5", "1e3", " 1", "1 ", "0x10", "--1", "12abc"}) {
    EXPECT_EQ(integer_problem(bad, 1, int64_max), std::string(bad) + " is not an integer");
  }
  EXPECT_EQ(integer_problem("0", 1, int64_max), "0 is below the minimum of 1");
  EXPECT_EQ(integer_problem("-1", 0, int64_max), "-1 is below the minimum of 0");
  EXPECT_EQ(integer_problem("-9223372036854775809", int64_min, int64_max),
            "-9223372036854775809 is below the minimum of -9223372036854775808");
  EXPECT_EQ(integer_problem("-99999999999999999999999", 1, int64_max),
            "-99999999999999999999999 is below the minimum of 1");
  EXPECT_EQ(integer_problem("65", 1, 64), "65 is above the maximum of 64");
  EXPECT_EQ(integer_problem("9223372036854775808", 1, int64_max),
            "9223372036854775808 is above the maximum of 9223372036854775807");
  EXPECT_EQ(integer_problem("99999999999999999999999", 1, int64_max),
            "99999999999999999999999 is above the maximum of 9223372036854775807");
}

TEST(Options, NumberValidation) {
  using cli::detail::positive_number_problem;
  for (const char* good : {"3e-3", "1", "0.5", "1E2", ".5"}) EXPECT_EQ(positive_number_problem(good), "") << good;
  for (const char* bad : {"abc", "", "1e", "0.1x", " 1", "1,5"}) {
    EXPECT_EQ(positive_number_problem(bad), std::string(bad) + " is not a number");
  }
  EXPECT_EQ(positive_number_problem("0"), "0 is not positive");
  EXPECT_EQ(positive_number_problem("-1e-3"), "-1e-3 is not positive");
  EXPECT_EQ(positive_number_problem("inf"), "inf is not a finite number");
  EXPECT_EQ(positive_number_problem("nan"), "nan is not a finite number");
  EXPECT_EQ(positive_number_problem("1e999"), "1e999 is not a finite number");
}

TEST(Options, TheLearningRateMustBeAPositiveNumber) {
  const NumericOption lr{"train", "--lr", 0};
  expect_refused(run_with(lr, "abc"), "--lr: abc is not a number");
  expect_refused(run_with(lr, "0"), "--lr: 0 is not positive");
  expect_refused(run_with(lr, "-1e-3"), "--lr: -1e-3 is not positive");
  expect_refused(run_with(lr, "inf"), "--lr: inf is not a finite number");
}

TEST(Options, ShardSizesReadAsHuggingFaceWritesThem) {
  using stowage::cli::parse_byte_size;
  EXPECT_EQ(parse_byte_size("5GB"), int64_t(5'000'000'000));
  EXPECT_EQ(parse_byte_size("5gb"), int64_t(5'000'000'000));
  EXPECT_EQ(parse_byte_size("512MiB"), int64_t(512) << 20);
  EXPECT_EQ(parse_byte_size("200KB"), 200'000);
  EXPECT_EQ(parse_byte_size("4096"), 4096);
  EXPECT_EQ(parse_byte_size("4096B"), 4096);
  for (const char* bad : {"", "GB", "0", "0GB", "5 GB", "-5GB", "1.5GB", "5XB", "9223372036854775807KB"}) {
    EXPECT_EQ(parse_byte_size(bad), std::nullopt) << bad;
  }
  const NumericOption shard{"ckpt export", "--max-shard-size", 0, 0, " some-dir --out x.safetensors"};
  expect_refused(run_with(shard, "5XB"), "5XB is not a positive size such as 5GB, 512MiB or 4096");
}

TEST(Options, GracePeriodsReadAsSchedulersWriteThem) {
  using std::chrono::milliseconds;
  using stowage::cli::parse_duration;
  EXPECT_EQ(parse_duration("30s"), milliseconds(30'000));
  EXPECT_EQ(parse_duration("30"), milliseconds(30'000));
  EXPECT_EQ(parse_duration("500ms"), milliseconds(500));
  EXPECT_EQ(parse_duration("2m"), milliseconds(120'000));
  EXPECT_EQ(parse_duration("0s"), milliseconds(0));
  for (const char* bad : {"", "s", "-1s", "1.5s", "30 s", "30x", "9223372036854775807h"}) {
    EXPECT_EQ(parse_duration(bad), std::nullopt) << bad;
  }
  const NumericOption grace{"train", "--preempt-grace", 0, 0, ""};
  expect_refused(run_with(grace, "soon"), "soon is not a duration such as 30s, 500ms or 2m");
}

TEST(Options, SignalsReadByNameOrNumber) {
  using stowage::cli::parse_signal;
  EXPECT_EQ(parse_signal("TERM"), SIGTERM);
  EXPECT_EQ(parse_signal("SIGUSR1"), SIGUSR1);
  EXPECT_EQ(parse_signal("usr2"), SIGUSR2);
  EXPECT_EQ(parse_signal(std::to_string(SIGTERM)), SIGTERM);
  for (const char* bad : {"", "KILL", "9", "SIGSTOP", "TERMX", "15x"})
    EXPECT_EQ(parse_signal(bad), std::nullopt) << bad;
  const NumericOption signal{"train", "--preempt-signal", 0, 0, ""};
  expect_refused(run_with(signal, "KILL"), "KILL is not a signal a scheduler sends");
}

}  // namespace
}  // namespace stowage::testing
