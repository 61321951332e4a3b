#pragma once

// What train::Trainer's protocol costs a step: the same small model trained by a loop of
// its own (zero_grad, forward, backward, the optimizer's step) and by a Trainer (with
// checkpoints off, so that no save is timed), rounds taking turns, on the CPU.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace stowage::bench {

struct ProtocolBenchOptions {
  int64_t steps = 300;  // per round and loop
  int64_t rounds = 3;
  int64_t width = 256;
  int64_t batch = 32;
};

struct ProtocolBenchResult {
  ProtocolBenchOptions options;
  double plain_step_us = 0;    // the loop's own, median over every round's steps
  double trainer_step_us = 0;  // through begin_step() and end_step()
  double cost_us() const { return trainer_step_us - plain_step_us; }
};

ProtocolBenchResult run_protocol_bench(const ProtocolBenchOptions& options);
nlohmann::json to_json(const ProtocolBenchResult& result);
std::string to_text(const ProtocolBenchResult& result);

}  // namespace stowage::bench
