"""dcp.load with stowage.StorageReader on 2 ranks under torchrun (gloo, CPU): each rank
loads its own shards of a checkpoint 2 C++ ranks saved with another sharding."""

import os
import pathlib
import sys

import pytest

from conftest import run_checked

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def torchrun() -> pathlib.Path:
    """The torchrun of the Python running the tests (ctest passes STOWAGE_TORCHRUN)."""
    path = pathlib.Path(os.environ.get("STOWAGE_TORCHRUN") or pathlib.Path(sys.executable).parent / "torchrun")
    if not path.is_file():
        pytest.skip(f"no torchrun at {path}")
    return path


def test_two_ranks_load_their_shards_of_a_checkpoint_two_cpp_ranks_saved(torchrun, sharded_checkpoint,
                                                                           single_checkpoint):
    result = run_checked([torchrun, "--standalone", "--nproc-per-node", "2", HERE / "dcp_rank.py",
                          sharded_checkpoint, single_checkpoint],
                         timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    for rank in (0, 1):
        assert f"rank {rank}: every value loaded as saved" in result.stdout
