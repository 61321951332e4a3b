"""PyTorch DCP's side of `stowage bench dcp --peer` (bench/lib/dcp_bench.cpp).

The same state dict as the benchmark's (float32 tensors "layers.<i>.weight" of uniform
values), saved with dcp.save (FileSystemWriter, sync_files=True, one or two threads),
saved with dcp.async_save through a DefaultStager, and loaded with dcp.load into
pre-allocated tensors, one request at a time so that the benchmark can alternate these
rounds with stowage's. Single process, no process group (no_dist=True).

Peak host memory is measured as stowage's side measures it: the RSS high-water mark
(VmHWM, reset by writing "5" to /proc/self/clear_refs) above the RSS at the start.
"""

import os
import shutil
import sys
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

# The source tree gets no __pycache__ from the modules imported beside this script.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_protocol import serve  # noqa: E402

# Every single-process dcp call says it assumes a single process; that is the intent here.
warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def default_stager():
    """DefaultStager as stowage's stages on the CPU: shared-memory buffers, on a thread.

    Its defaults ask for pinned memory and non-blocking copies, which need an accelerator.
    A new one for every save: torch 2.11's DefaultStager closes its StateDictStager after
    each stage, which empties its cache and its deepcopy dispatch table, so staging again
    with the same one fails (KeyError: <class 'type'>); nothing stays cached between saves.
    """
    accelerator = torch.accelerator.is_available()
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=accelerator,
            use_shared_memory=True,
            use_async_staging=True,
            use_non_blocking_copy=accelerator,
        )
    )


def status_bytes(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


class Peer:
    def __init__(self):
        self.state = None
        self.targets = None

    def setup(self, request):
        """{"numel": per tensor, "tensors": count}"""
        numel, count = int(request["numel"]), int(request["tensors"])
        self.state = {f"layers.{i}.weight": torch.empty(numel).uniform_() for i in range(count)}
        # Like a model's parameters, the load targets exist and have been written before.
        self.targets = {key: torch.zeros_like(value) for key, value in self.state.items()}
        return {"bytes": sum(t.numel() * t.element_size() for t in self.state.values()), "torch": torch.__version__}

    def save(self, request):
        """{"path", "thread_count"}: dcp.save into an empty directory, sync_files on."""
        path = request["path"]
        shutil.rmtree(path, ignore_errors=True)
        writer = dcp.FileSystemWriter(path, sync_files=True, thread_count=int(request["thread_count"]))
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        rss = status_bytes("VmRSS")
        start = time.perf_counter()
        dcp.save(self.state, storage_writer=writer, no_dist=True)
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "peak_host_bytes": status_bytes("VmHWM") - rss}

    def async_save(self, request):
        """{"path"}: how long dcp.async_save blocks the caller, and until the upload completes."""
        path = request["path"]
        shutil.rmtree(path, ignore_errors=True)
        writer = dcp.FileSystemWriter(path, sync_files=True)
        stager = default_stager()
        start = time.perf_counter()
        response = dcp.async_save(self.state, storage_writer=writer, async_stager=stager, no_dist=True)
        block = time.perf_counter() - start
        response.upload_completion.result()
        complete = time.perf_counter() - start
        stager.close()
        return {"block_s": block, "complete_s": complete}

    def load(self, request):
        """{"path"}: dcp.load into the pre-allocated targets; checks what it read."""
        start = time.perf_counter()
        dcp.load(self.targets, checkpoint_id=request["path"], no_dist=True)
        seconds = time.perf_counter() - start
        for key, value in self.state.items():
            if not torch.equal(self.targets[key], value):
                raise RuntimeError(f"dcp.load read different values for {key} from {request['path']}")
            self.targets[key].zero_()  # so that the next load is checked again
        return {"seconds": seconds, "verified": True}


if __name__ == "__main__":
    peer = Peer()
    serve({"setup": peer.setup, "save": peer.save, "async_save": peer.async_save, "load": peer.load})
