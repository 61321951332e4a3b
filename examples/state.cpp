// Snapshot a model and its optimizer through their state dicts, restore both into
// fresh objects, and check that training continues exactly as it would have.
#include <stowage/stowage.h>
#include <torch/torch.h>

int main() {
  auto make = [] { return torch::nn::Linear(4, 1); };
  auto step = [](torch::nn::Linear& m, torch::optim::Optimizer& o) {
    o.zero_grad();
    m->forward(torch::ones({2, 4})).pow(2).sum().backward();
    o.step();
  };
  auto model = make();
  auto optimizer = std::make_shared<torch::optim::Adam>(model->parameters());
  step(model, *optimizer);

  stowage::StateDict state;
  state.insert("model", stowage::ModuleState(model.ptr()).state_dict());
  state.insert("optim", stowage::OptimizerState(optimizer).state_dict());
  stowage::StateDict snapshot = stowage::create_cpu_state_dict(state);
  stowage::copy_state_dict(state, snapshot);  // a decoupled copy: reuse it every time

  auto restored = make();
  auto restored_optimizer = std::make_shared<torch::optim::Adam>(restored->parameters());
  stowage::ModuleState(restored.ptr()).load_state_dict(snapshot.at("model").toGenericDict());
  stowage::OptimizerState(restored_optimizer).load_state_dict(snapshot.at("optim").toGenericDict());

  step(model, *optimizer);
  step(restored, *restored_optimizer);
  const bool same = torch::equal(model->weight, restored->weight);
  std::printf("restored run %s the original\n", same ? "matches" : "differs from");
  return same ? 0 : 1;
}
