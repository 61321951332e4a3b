// Checkpoint a model and its optimizer asynchronously, keep training while the file is
// written, then load the checkpoint into fresh objects.
#include <stowage/stowage.h>
#include <torch/torch.h>

#include <filesystem>

int main() {
  const std::string dir = (std::filesystem::temp_directory_path() / "stowage-example-dcp").string();
  auto model = torch::nn::Linear(64, 64);
  auto optimizer = std::make_shared<torch::optim::AdamW>(model->parameters());
  auto step = [&] {
    optimizer->zero_grad();
    model->forward(torch::randn({8, 64})).square().mean().backward();
    optimizer->step();
  };
  step();

  stowage::StateDict state;
  state.insert("model", stowage::as_ivalue(model.ptr()));  // Stateful values
  state.insert("optim", stowage::as_ivalue(std::static_pointer_cast<torch::optim::Optimizer>(optimizer)));
  stowage::dcp::FileSystemWriter writer(dir);
  stowage::dcp::DefaultStager stager;  // stages on a background thread
  auto saved = stowage::dcp::async_save(state, writer, &stager);
  saved.staging_completion.wait();  // the snapshot is taken: training may change the model
  const torch::Tensor at_save = model->weight.detach().clone();
  step();
  saved.upload_completion.get();  // committed (or rethrows the write's error)

  auto restored = torch::nn::Linear(64, 64);
  auto restored_optimizer = std::make_shared<torch::optim::AdamW>(restored->parameters());
  stowage::StateDict target;
  target.insert("model", stowage::as_ivalue(restored.ptr()));
  target.insert("optim", stowage::as_ivalue(std::static_pointer_cast<torch::optim::Optimizer>(restored_optimizer)));
  stowage::dcp::load(target, dir);
  std::filesystem::remove_all(dir);
  const bool ok = torch::equal(restored->weight, at_save);
  std::printf("loaded the weights as they were when staged: %s\n", ok ? "yes" : "no");
  return ok ? 0 : 1;
}
