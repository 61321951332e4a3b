// `stowage train`'s arguments as the benchmarks write them (train_arguments) are read back
// by the command's own parser (add_train_options) into the options they were written from;
// the fields the benchmarks report (train_options_json) are the options' own.

#include "train_options.h"

#include <gtest/gtest.h>

#include <stowage/error.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace stowage::testing {
namespace {

using cli::TrainOptions;

// Every field away from its default, with values whose text is easy to get wrong: a double
// of 17 significant digits, the largest seed, several signals, a bool option set false.
TrainOptions every_field_changed() {
  TrainOptions o;
  o.corpus = "/tmp/a corpus";
  o.run_dir = "/tmp/run dir";
  o.steps = 7;
  o.batch = 6;
  o.seq_len = 5;
  o.layers = 3;
  o.width = 96;
  o.heads = 3;
  o.lr = 1.2345678901234567e-4;
  o.seed = std::numeric_limits<uint64_t>::max();
  o.threads = 1;
  o.recompute_segments = 0;
  o.selective_recompute = "mlp";
  o.offload_checkpoint_inputs = true;
  o.activation_budget = "24MiB";
  o.swap_times = 0;
  o.swap_to = "disk:/tmp";
  o.swap_host_budget = "256MiB";
  o.ckpt_every = 0;
  o.keep = 9;
  o.resume = true;
  o.allow_config_change = true;
  o.log_every = 1000000;
  o.cpu_cache = "0";
  o.nproc = 2;
  o.zero_stage = 1;
  o.gradient_as_bucket_view = false;
  o.device = "sim";
  o.on_save_failure = "stop";
  o.max_save_failures = 0;
  o.preempt_signals = {"USR1", "HUP"};
  o.preempt_grace = "30s";
  return o;
}

TrainOptions parse(const std::vector<std::string>& arguments) {
  TrainOptions parsed;
  CLI::App app;
  cli::add_train_options(app, parsed);
  app.parse(std::vector<std::string>(arguments.rbegin(), arguments.rend()));  // CLI11 takes them last first
  return parsed;
}

TEST(TrainArguments, TheParserReadsBackEveryField) {
  const TrainOptions given = every_field_changed();
  const std::vector<std::string> arguments = cli::train_arguments(given);
  const TrainOptions parsed = parse(arguments);
  EXPECT_EQ(cli::train_arguments(parsed), arguments);
  EXPECT_EQ(parsed.lr, given.lr);
  EXPECT_EQ(parsed.seed, given.seed);
  EXPECT_EQ(parsed.preempt_signals, given.preempt_signals);
  EXPECT_FALSE(parsed.gradient_as_bucket_view);
  EXPECT_TRUE(parsed.resume);
  EXPECT_EQ(parsed.run_dir, given.run_dir);
}

TEST(TrainArguments, OnlyFieldsAwayFromTheirDefaultsAreWritten) {
  EXPECT_TRUE(cli::train_arguments(TrainOptions()).empty());
  TrainOptions o;
  o.steps = 3;
  o.offload_checkpoint_inputs = true;
  EXPECT_EQ(cli::train_arguments(o), (std::vector<std::string>{"--steps", "3", "--offload-checkpoint-inputs"}));
}

TEST(TrainOptionsJson, EachFieldUnderItsFlagsNameAsItsOwnType) {
  const TrainOptions given = every_field_changed();
  const nlohmann::json json =
      cli::train_options_json(given, {"seq_len", "lr", "seed", "device", "preempt_signal", "resume"});
  EXPECT_EQ(json, (nlohmann::json{{"seq_len", 5},
                                  {"lr", given.lr},
                                  {"seed", std::numeric_limits<uint64_t>::max()},
                                  {"device", "sim"},
                                  {"preempt_signal", {"USR1", "HUP"}},
                                  {"resume", true}}));
  EXPECT_TRUE(json["seq_len"].is_number_integer());
  EXPECT_TRUE(json["lr"].is_number_float());
  EXPECT_EQ(cli::train_options_json(given, {}), nlohmann::json::object());
}

TEST(TrainOptionsJson, AFieldNoFlagSetsIsRefusedByName) {
  try {
    cli::train_options_json(TrainOptions(), {"steps", "seq-len"});
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'seq-len'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stowage::testing
