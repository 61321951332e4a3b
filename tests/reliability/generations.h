#pragma once

// The state a crash-trial child saves, as a pure function of its generation, so that
// whoever loads a checkpoint can tell exactly which generation it holds and check
// every byte of it.

#include <stowage/state/state_dict.h>

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace stowage::reliability {

// Tensors of several dtypes and sizes (about 1.5 MiB in all), plus plain values.
inline StateDict generation_state(int64_t generation) {
  const auto seeded = [&](int64_t k) {
    return at::detail::createCPUGenerator(uint64_t(generation) * 1000 + uint64_t(k));
  };
  StateDict model;
  model.insert("embed.weight", at::randn({256, 384}, seeded(0)));
  model.insert("block.0.weight", at::randn({128, 512}, seeded(1), at::TensorOptions().dtype(at::kDouble)));
  model.insert("block.0.bias", at::randn({512}, seeded(2)).to(at::kBFloat16));
  model.insert("block.1.counts",
               at::randint(-1000000, 1000000, {4096}, seeded(3), at::TensorOptions().dtype(at::kLong)));
  model.insert("block.1.mask",
               at::randint(0, 2, {3000}, seeded(4), at::TensorOptions().dtype(at::kLong)).to(at::kBool));
  model.insert("head.weight", at::randn({97, 33}, seeded(5)).to(at::kHalf));
  model.insert("empty", at::empty({0, 7}));
  StateDict state;
  state.insert("model", c10::IValue(model));
  state.insert("generation", generation);
  state.insert("note", std::string("generation ") + std::to_string(generation));
  return state;
}

// The generation rank `rank` of a job saves at `step` in the memory tier's trials: no two
// ranks or steps share one, so a checkpoint restored into the wrong rank shows.
inline int64_t memory_tier_generation(int64_t rank, int64_t step) {
  return step * 16 + rank;
}

// Overwrites the tensors of `state` in place with `generation`'s content, and its values.
inline void fill_generation(StateDict& state, int64_t generation) {
  const StateDict fresh = generation_state(generation);
  StateDict model(state.at("model").toGenericDict());
  const StateDict fresh_model(fresh.at("model").toGenericDict());
  for (const auto& item : fresh_model) model.at(item.key()).toTensor().copy_(item.value().toTensor());
  state.insert_or_assign("generation", generation);
  state.insert_or_assign("note", fresh.at("note"));
}

// Empty string when `state` holds exactly `generation`'s bytes, else what differs.
inline std::string compare_to_generation(const StateDict& state, int64_t generation) {
  const StateDict expected = generation_state(generation);
  if (state.at("generation").toInt() != generation) return "the generation value differs";
  if (state.at("note").toStringRef() != expected.at("note").toStringRef()) return "the note differs";
  const StateDict model(state.at("model").toGenericDict());
  const StateDict expected_model(expected.at("model").toGenericDict());
  for (const auto& item : expected_model) {
    const at::Tensor want = item.value().toTensor();
    const at::Tensor got = model.at(item.key()).toTensor().contiguous();
    if (got.scalar_type() != want.scalar_type() || got.sizes() != want.sizes() ||
        (want.nbytes() > 0 && std::memcmp(got.data_ptr(), want.data_ptr(), want.nbytes()) != 0)) {
      return "tensor '" + item.key() + "' differs";
    }
  }
  return {};
}

}  // namespace stowage::reliability
