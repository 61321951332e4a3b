"""One rank of test_torchrun.py, started by torchrun: dcp.load of C++-written
checkpoints with stowage.StorageReader on gloo, into this rank's shards, checked here.

    dcp_rank.py SHARDED_CHECKPOINT SINGLE_CHECKPOINT
"""

import pathlib
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import stowage  # noqa: E402
from interop import assert_same, expected_sharded_state, expected_single_state  # noqa: E402


def sharded(tensor, mesh, dim):
    """This rank's part of `tensor` split along `dim`, as a DTensor."""
    return distribute_tensor(tensor, mesh, [Shard(dim)])


def load_resharded(checkpoint, mesh):
    # Saved by rows and columns over 2 ranks; loaded the other way round, and whole.
    expected = expected_sharded_state()
    model = expected["model"]
    blank = {
        "model": {
            "layer": {"weight": sharded(torch.zeros(11, 6), mesh, 1),  # saved split by rows
                      "bias": torch.zeros(6)},
            "cols": sharded(torch.zeros(7, 9, dtype=torch.float64), mesh, 0),  # saved split by columns
            "big": sharded(torch.zeros(600, 512), mesh, 1),
            "bf16": distribute_tensor(torch.zeros(5, 4, dtype=torch.bfloat16), mesh, [Replicate()]),
        },
        "step": 0,
    }
    dcp.load(blank, storage_reader=stowage.StorageReader(checkpoint))
    got = blank["model"]
    assert_same(got["layer"]["weight"].to_local(), sharded(model["layer"]["weight"], mesh, 1).to_local(), "weight")
    assert_same(got["layer"]["bias"], model["layer"]["bias"], "bias")
    assert_same(got["cols"].to_local(), sharded(model["cols"], mesh, 0).to_local(), "cols")
    assert_same(got["big"].to_local(), sharded(model["big"], mesh, 1).to_local(), "big")
    assert_same(got["bf16"].to_local(), model["bf16"], "bf16")
    assert blank["step"] == 42


def load_whole_on_every_rank(checkpoint):
    state = {"nested": {"inner": {"weight": torch.zeros(2, 3)}}, "values": {"str": ""}}
    dcp.load(state, storage_reader=stowage.StorageReader(checkpoint))
    expected = expected_single_state()
    assert_same(state["nested"]["inner"]["weight"], expected["nested"]["inner"]["weight"])
    assert state["values"]["str"] == expected["values"]["str"]


def main():
    sharded_checkpoint, single_checkpoint = sys.argv[1:3]
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    load_resharded(sharded_checkpoint, mesh)
    load_whole_on_every_rank(single_checkpoint)
    print(f"rank {dist.get_rank()}: every value loaded as saved")
    dist.barrier()  # both ranks leave together: a group torn down under a working peer can abort in Gloo
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
