"""PyTorch's side of `stowage bench train --peer` (tools/stowage/bench_train.cpp).

`stowage train`'s loop in plain PyTorch: the same model (python/tests/train_model.py,
module for module), the same corpus and batches (the same generator, seeded as
train_data.cpp seeds it), activation checkpointing of the blocks with
torch.utils.checkpoint.checkpoint_sequential, plain AdamW, and a checkpoint every K steps
and at the last step with dcp.async_save through a DefaultStager, whose staging must
finish before the optimizer changes what it copies (as stowage's CheckpointManager).

With "nproc": 2 it trains data-parallel as `stowage train --nproc 2` does: two processes
(torch.multiprocessing, spawned per request, as stowage starts its ranks per run), Gloo,
DistributedDataParallel averaging the gradients, each rank training its half of the
global batch, the loss averaged over the ranks, and dcp.async_save on a process group of
its own. Each rank's AdamW is the plain, replicated one (stowage shards its optimizer
state; DCP writes replicated state once, so both write the same bytes in all).

Each step's time is the wall time from the end of the previous step (after the optimizer
step) to the end of this one, as `stowage train` writes step_s: the step after a
checkpoint includes the time async_save blocked and the wait for its staging.
"""

import json
import math
import os
import pathlib
import shutil
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
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


class CheckpointedForward(torch.nn.Module):
    """forward() as one module, so that DistributedDataParallel can wrap it."""

    def __init__(self, model, segments):
        super().__init__()
        self.model, self.segments = model, segments

    def forward(self, tokens):
        return forward(self.model, tokens, self.segments)


class Checkpoints:
    """dcp.async_save into <run_dir>/checkpoints/step-N every `every` steps, keeping `keep`.

    `group` is the process group of the saves (None: a single process). Records when
    each save's commit was first seen done (poll), as `stowage train` reports commits.
    """

    def __init__(self, run_dir, every, keep, group):
        self.root = pathlib.Path(run_dir) / "checkpoints"
        self.every, self.keep, self.group = every, keep, group
        self.stager = None
        self.pending = None
        self.pending_step = 0
        self.saved = []
        self.commits = []  # [checkpoint step, step at whose end its commit was seen]

    def save(self, step, state):
        self.wait(seen_at=step + 1)  # one save in flight at a time
        path = self.root / f"step-{step:08d}"
        writer = dcp.FileSystemWriter(str(path), sync_files=True)
        # A new stager for every save (dcp_peer.default_stager says why).
        self.stager = default_stager()
        if self.group is None:
            self.pending = dcp.async_save(state, storage_writer=writer, async_stager=self.stager, no_dist=True)
        else:
            self.pending = dcp.async_save(state, storage_writer=writer, async_stager=self.stager,
                                          process_group=self.group)
        self.pending_step = step
        self.saved.append(path)

    def wait_for_staging(self):
        if self.pending is not None:
            self.pending.staging_completion.result()

    def poll(self, step):
        if self.pending is not None and self.pending.upload_completion.done():
            self.wait(seen_at=step)

    def wait(self, seen_at=None):
        if self.pending is not None:
            self.pending.upload_completion.result()
            if seen_at is not None:
                self.commits.append([self.pending_step, seen_at])
            self.pending = None
            self.stager.close()
            # Rank 0 prunes: a commit means every rank's data is written.
            while len(self.saved) > self.keep:
                path = self.saved.pop(0)
                if self.group is None or dist.get_rank() == 0:
                    shutil.rmtree(path)

    def close(self):
        self.wait()


def train_rank(request, rank, world):
    """One rank's training run; returns its times, losses and checkpoints."""
    torch.set_num_threads(int(request["threads"]))
    seed, steps = int(request["seed"]), int(request["steps"])
    batch, seq_len = int(request["batch"]), int(request["seq_len"])
    corpus = load_corpus(request["corpus"])
    torch.manual_seed(seed)
    model = LanguageModel(context=seq_len, layers=int(request["layers"]), width=int(request["width"]),
                          heads=int(request["heads"]))
    every, segments = int(request["ckpt_every"]), int(request["recompute_segments"])
    step_forward = CheckpointedForward(model, segments)
    save_group = None
    if world > 1:
        step_forward = DistributedDataParallel(step_forward)
        save_group = dist.new_group(backend="gloo")  # the saves' collectives stay off the gradients'
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(request["lr"]))
    generator = torch.Generator().manual_seed(seed + 1)
    checkpoints = Checkpoints(request["run_dir"], every, int(request["keep"]), save_group)
    losses, step_seconds = [], []
    start = last_step_end = time.perf_counter()
    for step in range(1, steps + 1):
        inputs, targets = sample(corpus, batch, seq_len, generator)
        if world > 1:  # every rank draws the global batch and takes its slice, as stowage's ranks
            inputs, targets = (t.narrow(0, rank * (batch // world), batch // world) for t in (inputs, targets))
        model.zero_grad()
        logits = step_forward(inputs)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        loss_value = loss.detach()
        if world > 1:
            dist.all_reduce(loss_value)
            loss_value /= world
        losses.append(loss_value.item())
        checkpoints.wait_for_staging()
        optimizer.step()
        now = time.perf_counter()
        step_seconds.append(now - last_step_end)
        last_step_end = now
        checkpoints.poll(step)
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
        "step_seconds": step_seconds,
        "commits": checkpoints.commits,
        "checkpoints": [str(path) for path in checkpoints.saved],
        "torch": torch.__version__,
    }


def rank_main(rank, request, world, result_path):
    """A spawned rank: trains, and rank 0 writes its answer to `result_path`."""
    os.dup2(2, 1)  # stdout is the protocol's pipe: nothing of a rank's may reach it
    rendezvous = pathlib.Path(request["run_dir"]) / "rendezvous"
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        answer = train_rank(request, rank, world)
        if rank == 0:
            pathlib.Path(result_path).write_text(json.dumps(answer))
    finally:
        dist.destroy_process_group()


def train(request):
    """The run's options (bench_train.cpp): trains and returns rank 0's times and losses."""
    world = int(request.get("nproc", 1))
    if world == 1:
        return train_rank(request, 0, 1)
    if int(request["batch"]) % world != 0:
        raise ValueError(f"batch {request['batch']} does not split over {world} ranks")
    run_dir = pathlib.Path(request["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    result_path = run_dir / "rank0-answer.json"
    mp.spawn(rank_main, args=(request, world, str(result_path)), nprocs=world, join=True)
    return json.loads(result_path.read_text())


if __name__ == "__main__":
    serve({"train": train})
