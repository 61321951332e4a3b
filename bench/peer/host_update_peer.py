"""The Python peer of bench_host_update (bench/lib/host_update_bench.cpp): one AdamW step
of one fp32 tensor by PyTorch's fused CPU AdamW (torch.optim.AdamW(fused=True)), on the
benchmark's number of threads. Requests (peer_protocol.py):

  {"op": "setup", "params", "threads"} -> {"torch_version", "threads"}: the tensor, its
      gradient, and a first step that makes the state, outside the timed ones
  {"op": "step"} -> {"step_s"}: one step, timed
"""

import time

import torch

from peer_protocol import serve


class State:
    optimizer = None


state = State()


def setup(request):
    torch.set_num_threads(int(request["threads"]))
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(int(request["params"])))
    param.grad = torch.randn_like(param)
    state.optimizer = torch.optim.AdamW([param], lr=1e-3, fused=True)
    state.optimizer.step()
    return {"torch_version": torch.__version__, "threads": torch.get_num_threads()}


def step(request):
    start = time.perf_counter()
    state.optimizer.step()
    return {"step_s": time.perf_counter() - start}


serve({"setup": setup, "step": step})
