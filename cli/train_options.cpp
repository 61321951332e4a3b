#include "train_options.h"

#include "cli_numbers.h"

#include <stowage/error.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace stowage::cli {
namespace {

using Field =
    std::variant<std::string TrainOptions::*, int64_t TrainOptions::*, int TrainOptions::*, uint64_t TrainOptions::*,
                 double TrainOptions::*, bool TrainOptions::*, std::vector<std::string> TrainOptions::*>;

// One flag of `stowage train`. A switch is a bool field that the flag alone sets (its
// default is false); every other flag takes a value.
struct TrainFlag {
  const char* name;
  Field field;
  const char* help;
  std::optional<CLI::Validator> check;
  bool is_switch = false;
};

const std::vector<TrainFlag>& train_flags() {
  static const std::vector<TrainFlag> flags = {
      {"--corpus", &TrainOptions::corpus, "text file or directory of text files", {}},
      {"--run-dir", &TrainOptions::run_dir, "where metrics and checkpoints go", {}},
      {"--steps", &TrainOptions::steps, "train until this step", positive_integer<int64_t>()},
      {"--batch", &TrainOptions::batch, "sequences per step", positive_integer<int64_t>()},
      {"--seq-len", &TrainOptions::seq_len, "tokens per sequence", positive_integer<int64_t>()},
      {"--layers", &TrainOptions::layers, "transformer blocks", positive_integer<int64_t>()},
      {"--width", &TrainOptions::width, "model width", positive_integer<int64_t>()},
      {"--heads", &TrainOptions::heads, "attention heads", positive_integer<int64_t>()},
      {"--lr", &TrainOptions::lr, "AdamW learning rate", positive_number()},
      {"--seed", &TrainOptions::seed, "random seed", non_negative_integer<uint64_t>()},
      {"--threads", &TrainOptions::threads, "intra-op threads", positive_integer<int>()},
      {"--recompute-segments", &TrainOptions::recompute_segments,
       "activation checkpointing: checkpoint_sequential segments over the blocks (0: off)",
       non_negative_integer<int64_t>()},
      {"--selective-recompute", &TrainOptions::selective_recompute,
       "activation checkpointing of one part of each block only: its attention core (scores, softmax, weighted "
       "values) or its MLP; with --recompute-segments 0",
       CLI::IsMember({"attention-core", "mlp"})},
      {"--offload-checkpoint-inputs",
       &TrainOptions::offload_checkpoint_inputs,
       "activation checkpointing: keep the inputs of the checkpoints in pinned host memory until backward (on a "
       "device; nothing on the CPU)",
       {},
       true},
      {"--activation-budget", &TrainOptions::activation_budget,
       "activation checkpointing picked for a budget: which blocks run plainly, with their attention core and MLP "
       "recomputed, recomputed whole, or with their inputs offloaded, so that a step's activation peak fits SIZE "
       "(e.g. 24MiB) with the least recomputation",
       byte_size()},
      {"--swap-times", &TrainOptions::swap_times,
       "optimizer-state swap batches (0: plain AdamW with its state resident)", non_negative_integer<int64_t>()},
      {"--swap-to",
       &TrainOptions::swap_to,
       "where swapped optimizer states live between steps: host, or disk:DIR (scratch files in DIR, read and written "
       "one batch ahead)",
       {}},
      {"--swap-host-budget", &TrainOptions::swap_host_budget,
       "with --swap-to disk:DIR: host memory for the disk tier's buffers, e.g. 256MiB (default: four buffers of one "
       "batch)",
       byte_size()},
      {"--optimizer-update", &TrainOptions::optimizer_update,
       "where AdamW's update runs: device (its states brought up by the swap, or resident), or host (ZeRO-Offload: "
       "the states stay in host memory, the gradients come down and the parameters go back up)",
       CLI::IsMember({"device", "host"})},
      {"--offload-fraction", &TrainOptions::offload_fraction,
       "with --optimizer-update host: the share of the parameters' bytes updated on the host, the first parameters "
       "first; the rest go through the swap's --swap-times batches",
       fraction()},
      {"--ckpt-every", &TrainOptions::ckpt_every, "asynchronous checkpoint every K steps (0: none)",
       non_negative_integer<int64_t>()},
      {"--keep", &TrainOptions::keep, "committed checkpoints to keep", positive_integer<int64_t>()},
      {"--ckpt-host-budget", &TrainOptions::ckpt_host_budget,
       "host memory each rank's checkpointing may hold, e.g. 2GiB: staging plus the memory tier's checkpoints and "
       "replicas; staging then proceeds in waves that fit, and a budget too small for the largest entry is refused "
       "before the first step (default: no bound)",
       byte_size()},
      {"--memory-ckpt-every", &TrainOptions::memory_ckpt_every,
       "checkpoint into host memory every K steps, each rank's replicated to the same local rank of the next node; "
       "a resume takes the newest step every rank can get from memory, a peer or storage (0: none; needs "
       "--ckpt-every)",
       non_negative_integer<int64_t>()},
      {"--memory-ckpt-dir",
       &TrainOptions::memory_ckpt_dir,
       "with --memory-ckpt-every: the nodes' memory directories go under this (node-N each; default "
       "/dev/shm/stowage-<hash of the run directory>)",
       {}},
      {"--resume", &TrainOptions::resume, "continue from the run directory's latest committed checkpoint", {}, true},
      {"--resume-from",
       &TrainOptions::resume_from,
       "start from another checkpoint: one stowage train wrote gives model, optimizer and step; any other (stowage's "
       "or PyTorch DCP's) the model's weights, with a fresh optimizer at step 0",
       {}},
      {"--cpu-cache", &TrainOptions::cpu_cache,
       "released CPU tensors of 128 KiB or more kept for the next step, up to this size in all (0: none; without it, "
       "each step faults its large temporaries in again)",
       byte_size_or_zero()},
      {"--log-every", &TrainOptions::log_every, "steps between log lines when not on a terminal",
       positive_integer<int64_t>()},
      {"--nproc", &TrainOptions::nproc,
       "data-parallel ranks on this machine, started as with `stowage launch`; --batch is split over them and the "
       "optimizer state sharded",
       positive_integer<int>()},
      {"--nproc-per-node", &TrainOptions::nproc_per_node,
       "with --nproc: ranks per node, as torchrun sets GROUP_RANK, LOCAL_RANK and LOCAL_WORLD_SIZE (several "
       "\"nodes\" on this machine; 0: all on one)",
       non_negative_integer<int>()},
      {"--zero-stage", &TrainOptions::zero_stage,
       "with several ranks: 1 shards the optimizer state over them, 2 the gradients too (each rank keeps only those "
       "of its own parameters); stage 3 (parameters) is not supported",
       integer_in<int64_t>(1, 2)},
      {"--gradient-as-bucket-view",
       &TrainOptions::gradient_as_bucket_view,
       "with several ranks: the gradients are views of the reducer's buckets (true), or the buckets a second copy of "
       "them (false: more memory and copies, as PyTorch DDP's default)",
       {}},
      {"--device",
       &TrainOptions::device,
       "where the model trains: cpu, sim or sim:N (the simulated device, with LibTorch 2.x), cuda:N, or cuda (each "
       "rank on cuda:LOCAL_RANK)",
       {}},
      {"--on-save-failure", &TrainOptions::on_save_failure,
       "a failed checkpoint: continue (reported on stderr and in metrics.jsonl; the run exits 1 at the end if its "
       "last checkpoint failed) or stop",
       CLI::IsMember({"continue", "stop"})},
      {"--max-save-failures", &TrainOptions::max_save_failures,
       "with --on-save-failure continue: this many failed checkpoints in a row stop the run (0: never)",
       non_negative_integer<int64_t>()},
      {"--preempt-signal", &TrainOptions::preempt_signals,
       "signals that preempt the run: it finishes the step, saves it and exits with status 75; a second one exits at "
       "once (repeat the flag for several: TERM, USR1, ...)",
       signal_name()},
      {"--preempt-grace", &TrainOptions::preempt_grace,
       "after a preempting signal, exit this long later even if the checkpoint is not committed (e.g. 30s; 0: no "
       "deadline)",
       duration()},
      {"--allow-config-change",
       &TrainOptions::allow_config_change,
       "--resume a run with another --corpus, --batch, --seq-len, --layers, --width, --heads, --seed, "
       "--optimizer-update or --offload-fraction than it was started with (refused otherwise)",
       {},
       true},
  };
  return flags;
}

std::vector<std::string> value_texts(const std::string& value) {
  return {value};
}
std::vector<std::string> value_texts(bool value) {
  return {value ? "true" : "false"};
}
std::vector<std::string> value_texts(double value) {
  return {fmt::format("{}", value)};  // the shortest text that reads back as the same double
}
template <typename Integer>
std::vector<std::string> value_texts(Integer value) {
  return {std::to_string(value)};
}
std::vector<std::string> value_texts(const std::vector<std::string>& values) {
  return values;  // one flag each
}

// A flag's name as a JSON key: "--seq-len" is "seq_len".
std::string json_key(const TrainFlag& flag) {
  std::string key = std::string(flag.name).substr(2);
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

}  // namespace

void add_train_options(CLI::App& command, TrainOptions& options) {
  for (const TrainFlag& flag : train_flags()) {
    std::visit(
        [&](auto member) {
          auto& field = options.*member;
          if constexpr (std::is_same_v<std::decay_t<decltype(field)>, bool>) {
            if (flag.is_switch) {
              command.add_flag(flag.name, field, flag.help);
              return;
            }
          }
          CLI::Option* option = command.add_option(flag.name, field, flag.help)->capture_default_str();
          if (flag.check) option->check(*flag.check);
        },
        flag.field);
  }
  command.get_option("--resume-from")->excludes("--resume");
}

std::vector<std::string> train_arguments(const TrainOptions& options) {
  const TrainOptions defaults;
  std::vector<std::string> arguments;
  for (const TrainFlag& flag : train_flags()) {
    std::visit(
        [&](auto member) {
          if (options.*member == defaults.*member) return;
          if (flag.is_switch) {
            arguments.emplace_back(flag.name);  // a switch's default is false: it is set
            return;
          }
          for (std::string& value : value_texts(options.*member)) arguments.insert(arguments.end(), {flag.name, value});
        },
        flag.field);
  }
  return arguments;
}

nlohmann::json train_options_json(const TrainOptions& options, const std::vector<std::string>& fields) {
  nlohmann::json out = nlohmann::json::object();
  for (const std::string& field : fields) {
    const auto& flags = train_flags();
    const auto flag =
        std::find_if(flags.begin(), flags.end(), [&field](const TrainFlag& each) { return json_key(each) == field; });
    if (flag == flags.end()) {
      throw InvalidArgument(fmt::format("train_options_json: no flag of `stowage train` sets '{}'", field));
    }
    std::visit([&](auto member) { out[field] = options.*member; }, flag->field);
  }
  return out;
}

}  // namespace stowage::cli
