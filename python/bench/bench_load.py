"""Throughput of the Python loader against safetensors on the very same tensors.

`stowage.load_checkpoint` and `safetensors.torch.load_file` each load a checkpoint of the
same float32 tensors: the script writes a safetensors file with `safetensors.torch.save_file`
and turns it into a stowage checkpoint with `stowage ckpt import` (the C++ CLI), so both
sides hold identical bytes (checked once, untimed). The loads are timed in turns, as
bench/lib/bench_util.cpp's take_turns does: every round runs each measurement once, in an
order that rotates from round to round, and each figure is the median of the rounds.

Both files are read once before timing starts, so every timed load reads from the page
cache (warm): the figures compare the loaders, not the disk.
"""

import argparse
import ctypes
import gc
import json
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Tuple

import safetensors
import safetensors.torch
import torch

# This checkout's package, not an installed one (as python/tests/conftest.py does).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import stowage  # noqa: E402

MIB = 1 << 20


def make_tensors(size_mib: int, count: int) -> Dict[str, torch.Tensor]:
    """`count` float32 tensors of `size_mib` MiB in all (the remainder of the division
    goes to the first ones), random so that no loader or hash gets an easy input."""
    elements = size_mib * MIB // 4
    generator = torch.Generator().manual_seed(16)
    base, extra = divmod(elements, count)
    return {f"layers.{i}.weight": torch.randn(base + (i < extra), generator=generator) for i in range(count)}


def write_checkpoints(stowage_cli: pathlib.Path, scratch: pathlib.Path, size_mib: int,
                      count: int) -> Tuple[pathlib.Path, pathlib.Path]:
    """The safetensors file and the stowage checkpoint of the same tensors: the file is
    written by the safetensors package and imported by the C++ CLI, which is the only
    C++ path that writes a checkpoint of arbitrary size and keeps it."""
    file = scratch / "model.safetensors"
    checkpoint = scratch / "checkpoint"
    safetensors.torch.save_file(make_tensors(size_mib, count), str(file))
    subprocess.run([str(stowage_cli), "ckpt", "import", str(file), "--out", str(checkpoint)],
                   check=True, stdout=subprocess.DEVNULL)
    return file, checkpoint


def check_identical(file: pathlib.Path, checkpoint: pathlib.Path) -> int:
    """Verifies, untimed, that both loaders return the same names, dtypes, shapes and
    bits (the import keeps safetensors' flat names), and returns the tensor bytes.
    Reading both files here also puts them in the page cache for the timed loads."""
    ours = stowage.load_checkpoint(checkpoint)
    theirs = safetensors.torch.load_file(str(file))
    if ours.keys() != theirs.keys():
        raise SystemExit("bench_load: the two checkpoints hold different tensor names")
    for name, expected in theirs.items():
        actual = ours[name]
        if actual.dtype != expected.dtype or actual.shape != expected.shape or \
                not torch.equal(actual.view(torch.int32), expected.view(torch.int32)):
            raise SystemExit(f"bench_load: tensor '{name}' differs between the two checkpoints")
    return sum(tensor.numel() * tensor.element_size() for tensor in theirs.values())


def touch(state: Dict[str, torch.Tensor]) -> None:
    """Reads every byte of every tensor (`sum()` of each): a memory-mapped loader may
    return before reading anything, so this makes it fault in and read all its pages,
    as stowage's checksum verification already does before it returns."""
    for tensor in state.values():
        tensor.sum()


def measurements(file: pathlib.Path, checkpoint: pathlib.Path) -> Dict[str, Callable[[], Dict[str, torch.Tensor]]]:
    """The loads to time, by figure name. Each returns what it loaded, so that the
    caller drops it after the clock stops: unmapping and freeing are not timed."""
    def stowage_load():
        return stowage.load_checkpoint(checkpoint)

    def stowage_load_copy():
        return stowage.load_checkpoint(checkpoint, mmap=False)

    def safetensors_load():
        return safetensors.torch.load_file(str(file))

    def safetensors_load_pread():
        return safetensors.torch.load_file(str(file), backend="pread")

    def touched(load):
        def run():
            state = load()
            touch(state)
            return state
        return run

    return {
        "stowage_load": stowage_load,
        "stowage_load_touched": touched(stowage_load),
        "stowage_load_copy": stowage_load_copy,
        "safetensors_load": safetensors_load,
        "safetensors_load_touched": touched(safetensors_load),
        "safetensors_load_pread": safetensors_load_pread,
    }


def release_freed_memory() -> None:
    """Drops what the last load left and hands glibc's free memory back to the kernel
    (malloc_trim), as bench_dcp does before torch::load: otherwise a copying load gets
    the pages the previous one freed, already faulted in, and which load runs after a
    copying one decides its figure. Now every copy pays its first-touch page faults, as
    a job's start-up load does. Without glibc only the garbage is collected."""
    gc.collect()
    malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if malloc_trim is not None:
        malloc_trim(0)


def take_turns(loads: Dict[str, Callable[[], Dict[str, torch.Tensor]]], rounds: int) -> Dict[str, List[float]]:
    """Seconds of each load in every round. Round i runs the loads from the i-th on,
    forwards in even rounds and backwards in odd ones (bench_util.cpp's run_round), so
    that no load always follows the same one and machine noise spreads over all."""
    names = list(loads)
    n = len(names)
    seconds: Dict[str, List[float]] = {name: [] for name in names}
    for i in range(rounds):
        for k in range(n):
            name = names[(i + k if i % 2 == 0 else i + n - k) % n]
            release_freed_memory()
            start = time.perf_counter()
            state = loads[name]()
            seconds[name].append(time.perf_counter() - start)
            del state
    return seconds


def report(total_bytes: int, tensors: int, rounds: int, seconds: Dict[str, List[float]]) -> Dict[str, object]:
    """The figures: median seconds and GB/s (1e9 bytes) of each load, and the ratios
    stowage GB/s / safetensors GB/s against its peer (mapped, mapped and touched,
    copying), with what the run was made on."""
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    figures: Dict[str, object] = {"bytes": total_bytes, "tensors": tensors, "rounds": rounds, "page_cache": "warm"}
    for name, median in medians.items():
        figures[f"{name}_s"] = median
        figures[f"{name}_gbps"] = total_bytes / median / 1e9
    figures["ratio_load"] = medians["safetensors_load"] / medians["stowage_load"]
    figures["ratio_load_touched"] = medians["safetensors_load_touched"] / medians["stowage_load_touched"]
    figures["ratio_load_copy"] = medians["safetensors_load_pread"] / medians["stowage_load_copy"]
    figures["torch"] = torch.__version__
    figures["safetensors"] = safetensors.__version__
    figures["torch_threads"] = torch.get_num_threads()
    figures["python"] = platform.python_version()
    return figures


def print_table(figures: Dict[str, object]) -> None:
    """The figures as a table for people."""
    print(f"{figures['bytes'] / MIB:.0f} MiB in {figures['tensors']} float32 tensors, median of {figures['rounds']} "
          f"rounds in turns, page cache warm, freed memory trimmed before each load; torch {figures['torch']} "
          f"({figures['torch_threads']} threads), safetensors {figures['safetensors']}")
    rows = [
        ("mapped", "stowage_load", "safetensors_load", "ratio_load"),
        ("mapped + sum() of every tensor", "stowage_load_touched", "safetensors_load_touched", "ratio_load_touched"),
        ("copied (mmap=False / backend=pread)", "stowage_load_copy", "safetensors_load_pread", "ratio_load_copy"),
    ]
    print(f"{'load':<38} {'stowage':>18} {'safetensors':>18} {'stowage/safetensors':>20}")
    for label, ours, theirs, ratio in rows:
        cells = [f"{figures[name + '_gbps']:6.2f} GB/s {figures[name + '_s']:.3f}s" for name in (ours, theirs)]
        print(f"{label:<38} {cells[0]:>18} {cells[1]:>18} {figures[ratio]:>19.2f}x")


def set_threads(threads: int) -> None:
    """Sets torch's intra-op threads. Both loaders read on the calling thread (stowage
    hashes with xxhash, safetensors maps or reads in its own code); torch's pool only
    splits the clones and sums. On a shared machine its workers wait for a core at every
    operation (2 threads on the 2-core machine with builds running: 10-15 ms per tensor),
    which would time the scheduler, so the default is 1."""
    torch.set_num_threads(threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stowage-cli", type=pathlib.Path, required=True, help="the stowage program (build/stowage)")
    parser.add_argument("--size-mib", type=int, default=1024, help="tensor bytes in all, in MiB (default 1024)")
    parser.add_argument("--tensors", type=int, default=64, help="number of tensors (default 64)")
    parser.add_argument("--dir", type=pathlib.Path, help="where to make the scratch directory (default: TMPDIR)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of turns; figures are medians (default 7)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads for the copies and sums (default 1, see set_threads)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    if min(args.size_mib, args.tensors, args.rounds, args.threads) < 1:
        parser.error("--size-mib, --tensors, --rounds and --threads must be positive")
    if args.size_mib * MIB // 4 < args.tensors:
        parser.error("--size-mib is too small for that many tensors")

    set_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="stowage-bench-load-", dir=args.dir) as scratch:
        file, checkpoint = write_checkpoints(args.stowage_cli, pathlib.Path(scratch), args.size_mib, args.tensors)
        total_bytes = check_identical(file, checkpoint)
        seconds = take_turns(measurements(file, checkpoint), args.rounds)
    figures = report(total_bytes, args.tensors, args.rounds, seconds)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print_table(figures)


if __name__ == "__main__":
    main()
