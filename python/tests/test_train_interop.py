"""`stowage train` and PyTorch on one model: weights trained in C++, exported as
safetensors, give the same loss in the equivalent PyTorch module; a model PyTorch
saved with torch.distributed.checkpoint starts a `stowage train` run."""

import pathlib

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

from conftest import run_checked
from train_model import LanguageModel, batch_loss

BATCH, SEQ_LEN = 4, 64
# On one thread both sides run the same LibTorch kernels in the same order; the margin
# covers kernels that may still differ between a C++ and a Python build of torch.
RELATIVE_TOLERANCE = 1e-5


def batch_of_text(path: pathlib.Path) -> torch.Tensor:
    """BATCH sequences of SEQ_LEN + 1 bytes of a licence text, also written to `path`."""
    text = pathlib.Path("/usr/share/common-licenses/GPL-3").read_bytes()[:BATCH * (SEQ_LEN + 1)]
    path.write_bytes(text)
    return torch.tensor(list(text), dtype=torch.long).view(BATCH, SEQ_LEN + 1)


def test_weights_trained_in_cpp_give_the_same_loss_in_pytorch(stowage_cli, interop_model_loss, tmp_path):
    run_dir = tmp_path / "run"
    run_checked([stowage_cli, "train", "--steps", "3", "--ckpt-every", "3", "--threads", "1", "--run-dir", run_dir],
                timeout=600)
    checkpoint = run_dir / "checkpoints" / "step-00000003"
    weights = tmp_path / "model.safetensors"
    run_checked([stowage_cli, "ckpt", "export", checkpoint, "--prefix", "model.", "--out", weights])

    tokens = batch_of_text(tmp_path / "tokens.bin")
    cpp_loss = float(run_checked([interop_model_loss, checkpoint, tmp_path / "tokens.bin", BATCH, SEQ_LEN]).stdout)

    model = LanguageModel(context=SEQ_LEN)
    model.load_state_dict(load_file(weights), strict=True)
    with torch.no_grad():
        python_loss = batch_loss(model, tokens).item()
    print(f"loss: C++ {cpp_loss:.9g}, PyTorch {python_loss:.9g}, difference {abs(cpp_loss - python_loss):.3g}")
    assert abs(cpp_loss - python_loss) <= RELATIVE_TOLERANCE * abs(cpp_loss)


def test_a_model_pytorch_saved_with_dcp_starts_a_stowage_train_run(stowage_cli, interop_model_loss, tmp_path):
    torch.manual_seed(1)
    model = LanguageModel(context=SEQ_LEN)
    tokens = batch_of_text(tmp_path / "tokens.bin")
    # One AdamW step in PyTorch, whose optimizer state is not stowage train's: the run
    # starts from the model with a fresh optimizer.
    optimizer = torch.optim.AdamW(model.parameters())
    batch_loss(model, tokens).backward()
    optimizer.step()
    checkpoint = tmp_path / "pytorch_dcp"
    dcp.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, checkpoint_id=checkpoint)

    # The C++ model reads PyTorch's checkpoint into the same function.
    cpp_loss = float(run_checked([interop_model_loss, checkpoint, tmp_path / "tokens.bin", BATCH, SEQ_LEN]).stdout)
    with torch.no_grad():
        python_loss = batch_loss(model, tokens).item()
    assert abs(cpp_loss - python_loss) <= RELATIVE_TOLERANCE * abs(cpp_loss)

    # One step at a learning rate too small to move a float32 weight: the run's checkpoint
    # holds PyTorch's weights (those at 0.0 move to within 1e-29 of it).
    run_dir = tmp_path / "run"
    result = run_checked([stowage_cli, "train", "--resume-from", checkpoint, "--steps", "1", "--lr", "1e-30",
                          "--ckpt-every", "1", "--threads", "1", "--run-dir", run_dir], timeout=600)
    assert "(model; a fresh optimizer) at step 0" in result.stdout
    weights = tmp_path / "model.safetensors"
    run_checked([stowage_cli, "ckpt", "export", run_dir / "checkpoints" / "step-00000001", "--prefix", "model.",
                 "--out", weights])
    trained = load_file(weights)
    for name, tensor in model.state_dict().items():
        assert torch.allclose(trained[name], tensor, rtol=0, atol=1e-29), name
