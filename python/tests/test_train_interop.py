"""`stowage train` and PyTorch on one model: weights trained in C++, exported as
safetensors, give the same loss in the equivalent PyTorch module."""

import pathlib

import torch
from safetensors.torch import load_file

from conftest import run_checked
from train_model import LanguageModel, batch_loss

BATCH, SEQ_LEN = 4, 64
# On one thread both sides run the same LibTorch kernels in the same order; the margin
# covers kernels that may still differ between a C++ and a Python build of torch.
RELATIVE_TOLERANCE = 1e-5


def test_weights_trained_in_cpp_give_the_same_loss_in_pytorch(stowage_cli, interop_model_loss, tmp_path):
    run_dir = tmp_path / "run"
    run_checked([stowage_cli, "train", "--steps", "3", "--ckpt-every", "3", "--threads", "1", "--run-dir", run_dir],
                timeout=600)
    checkpoint = run_dir / "checkpoints" / "step-00000003"
    weights = tmp_path / "model.safetensors"
    run_checked([stowage_cli, "ckpt", "export", checkpoint, "--prefix", "model.", "--out", weights])

    tokens_file = tmp_path / "tokens.bin"
    text = pathlib.Path("/usr/share/common-licenses/GPL-3").read_bytes()
    tokens_file.write_bytes(text[:BATCH * (SEQ_LEN + 1)])
    cpp_loss = float(run_checked([interop_model_loss, checkpoint, tokens_file, BATCH, SEQ_LEN]).stdout)

    model = LanguageModel(context=SEQ_LEN)
    model.load_state_dict(load_file(weights), strict=True)
    tokens = torch.tensor(list(tokens_file.read_bytes()), dtype=torch.long).view(BATCH, SEQ_LEN + 1)
    with torch.no_grad():
        python_loss = batch_loss(model, tokens).item()
    print(f"loss: C++ {cpp_loss:.9g}, PyTorch {python_loss:.9g}, difference {abs(cpp_loss - python_loss):.3g}")
    assert abs(cpp_loss - python_loss) <= RELATIVE_TOLERANCE * abs(cpp_loss)
