"""PyTorch's side of `stowage bench train --peer` (tools/stowage/bench_train.cpp).

`stowage train`'s loop in plain PyTorch: the same model (python/tests/train_model.py,
module for module), the same corpus and batches (the same generator, seeded as
train_data.cpp seeds it), activation checkpointing of the blocks with
torch.utils.checkpoint.checkpoint_sequential, plain AdamW, and a checkpoint every K steps
and at the last step with dcp.async_save through a DefaultStager, whose staging must
finish before the optimizer changes what it copies (as stowage's CheckpointManager).
"""

import math
import pathlib
import shutil
import sys
import time

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint_sequential

# The source tree gets no __pycache__ from the modules imported beside this script.
sys.dont_write_bytecode = True
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent / "python" / "tests"))
from dcp_peer import default_stager  # noqa: E402  (it also silences dcp's single-process warning)
from peer_protocol import serve  # noqa: E402
from train_model import LanguageModel  # noqa: E402


def load_corpus(path):
    """A file, or every regular file of a directory in name order (train_data.cpp)."""
    path = pathlib.Path(path)
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    data = b"".join(f.read_bytes() for f in files)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.long)


def sample(corpus, batch, time_steps, generator):
    """Corpus::sample: `batch` windows of time + 1 bytes at offsets drawn from `generator`."""
    starts = torch.randint(0, corpus.numel() - time_steps - 1, (batch, 1), generator=generator, dtype=torch.long)
    index = starts + torch.arange(time_steps + 1).unsqueeze(0)
    windows = corpus.index_select(0, index.flatten()).view(batch, time_steps + 1)
    return windows[:, :time_steps], windows[:, 1:]


def forward(model, tokens, segments):
    positions = torch.arange(tokens.shape[1])
    x = model.token_embedding(tokens) + model.position_embedding(positions)
    if segments > 0:
        x = checkpoint_sequential(model.blocks, segments, x, use_reentrant=False)
    else:
        x = model.blocks(x)
    return model.head(model.final_norm(x))


class Checkpoints:
    """dcp.async_save into <run_dir>/checkpoints/step-N every `every` steps, keeping `keep`."""

    def __init__(self, run_dir, every, keep):
        self.root = pathlib.Path(run_dir) / "checkpoints"
        self.every, self.keep = every, keep
        self.stager = None
        self.pending = None
        self.saved = []

    def save(self, step, state):
        self.wait()  # one save in flight at a time
        path = self.root / f"step-{step:08d}"
        writer = dcp.FileSystemWriter(str(path), sync_files=True)
        # A new stager for every save (dcp_peer.default_stager says why).
        self.stager = default_stager()
        self.pending = dcp.async_save(state, storage_writer=writer, async_stager=self.stager, no_dist=True)
        self.saved.append(path)

    def wait_for_staging(self):
        if self.pending is not None:
            self.pending.staging_completion.result()

    def wait(self):
        if self.pending is not None:
            self.pending.upload_completion.result()
            self.pending = None
            self.stager.close()
            while len(self.saved) > self.keep:
                shutil.rmtree(self.saved.pop(0))

    def close(self):
        self.wait()


def train(request):
    """The run's options (bench_train.cpp): trains and returns its time and losses."""
    torch.set_num_threads(int(request["threads"]))
    seed, steps = int(request["seed"]), int(request["steps"])
    batch, seq_len = int(request["batch"]), int(request["seq_len"])
    corpus = load_corpus(request["corpus"])
    torch.manual_seed(seed)
    model = LanguageModel(context=seq_len, layers=int(request["layers"]), width=int(request["width"]),
                          heads=int(request["heads"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(request["lr"]))
    generator = torch.Generator().manual_seed(seed + 1)
    every, segments = int(request["ckpt_every"]), int(request["recompute_segments"])
    checkpoints = Checkpoints(request["run_dir"], every, int(request["keep"]))
    losses = []
    start = time.perf_counter()
    for step in range(1, steps + 1):
        inputs, targets = sample(corpus, batch, seq_len, generator)
        model.zero_grad()
        logits = forward(model, inputs, segments)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        losses.append(loss.item())
        checkpoints.wait_for_staging()
        optimizer.step()
        if every > 0 and (step % every == 0 or step == steps):
            # DCP's own way to a model's and optimizer's state dicts (plain dicts keyed by FQN).
            model_state, optim_state = get_state_dict(model, optimizer)
            state = {"model": model_state, "optim": optim_state, "progress": {"step": step}}
            checkpoints.save(step, state)
    checkpoints.close()
    seconds = time.perf_counter() - start
    if not all(math.isfinite(loss) for loss in losses):
        raise RuntimeError(f"the loss is not finite: {losses}")
    return {
        "seconds": seconds,
        "tokens_per_s": steps * batch * seq_len / seconds,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "checkpoints": [str(path) for path in checkpoints.saved],
        "torch": torch.__version__,
    }


if __name__ == "__main__":
    serve({"train": train})
