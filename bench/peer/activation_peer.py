"""The Python peer of `stowage bench activation --peer` (bench/lib/activation_bench.cpp).

The same MLP as the benchmark's (blocks x (Linear(width, width) + GELU), seeded alike),
trained one step at a time: plain, and under torch.utils.checkpoint.checkpoint_sequential
reentrant and non-reentrant. Requests (peer_protocol.py):

  {"op": "setup", "blocks", "width", "batch", "threads", "seed", "device"}
  {"op": "step", "mode": "plain" | "reentrant" | "non_reentrant", "segments": n}
      -> {"step_s"}: forward + sum().backward(), timed as the benchmark times its own
  {"op": "peak", "mode", "segments"} -> {"peak_bytes"}: one step measured for memory
      alone (in rounds of their own, since giving memory back before a step costs time)

Peak bytes are measured as the benchmark measures its own for the comparison: on the CPU
the resident set's high-water mark above the resident set at the step's start, after
malloc_trim has returned the allocator's free memory (C++'s accounting allocator is not
visible from Python); on CUDA torch.cuda.max_memory_allocated above memory_allocated.
"""

import ctypes
import time

import torch
from torch.utils.checkpoint import checkpoint_sequential

from peer_protocol import serve


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x))


class State:
    model = None
    input = None
    # PyTorch's reentrant checkpoint records nothing when no input requires grad (the
    # parameters inside would get no gradient), so its input does; the extra input
    # gradient is one matrix product of the first block's backward.
    input_requiring_grad = None
    device = None


state = State()
libc = ctypes.CDLL("libc.so.6")


def setup(request):
    torch.set_num_threads(int(request["threads"]))
    state.device = torch.device(request["device"])
    torch.manual_seed(int(request["seed"]))
    width = int(request["width"])
    model = torch.nn.Sequential(*[Block(width) for _ in range(int(request["blocks"]))])
    state.model = model.to(state.device)
    state.input = torch.randn(int(request["batch"]), width, device=state.device)
    state.input_requiring_grad = state.input.detach().requires_grad_(True)
    return {"torch_version": torch.__version__, "threads": torch.get_num_threads()}


def synchronize():
    if state.device.type == "cuda":
        torch.cuda.synchronize(state.device)


def run_step(request):
    mode = request["mode"]
    if mode == "plain":
        output = state.model(state.input)
    elif mode == "reentrant":
        output = checkpoint_sequential(
            state.model, int(request["segments"]), state.input_requiring_grad, use_reentrant=True
        )
    elif mode == "non_reentrant":
        output = checkpoint_sequential(state.model, int(request["segments"]), state.input, use_reentrant=False)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    output.sum().backward()


def clear_gradients():
    # As the benchmark does: every step starts without gradients and allocates them.
    for parameter in state.model.parameters():
        parameter.grad = None
    state.input_requiring_grad.grad = None


def step(request):
    clear_gradients()
    synchronize()
    start = time.perf_counter()
    run_step(request)
    synchronize()
    return {"step_s": time.perf_counter() - start}


def status_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak(request):
    clear_gradients()
    if state.device.type == "cuda":
        synchronize()
        torch.cuda.reset_peak_memory_stats(state.device)
        base = torch.cuda.memory_allocated(state.device)
        run_step(request)
        synchronize()
        return {"peak_bytes": torch.cuda.max_memory_allocated(state.device) - base}
    libc.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # resets VmHWM to VmRSS
    base = status_kib("VmRSS")
    run_step(request)
    return {"peak_bytes": (status_kib("VmHWM") - base) * 1024}


if __name__ == "__main__":
    serve({"setup": setup, "step": step, "peak": peak})
