"""stowage.StorageReader under torch.distributed.checkpoint.load in one process: a C++
checkpoint loads into a state dict of any layout, DCP flattening its nested keys, and a
damaged one fails before the state dict changes."""

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import stowage
from interop import assert_same, expected_sharded_state, expected_single_state
from stowage.metadata import CHECKSUM_BLOCK_BYTES

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def blank_like(state):
    """The same structure with every tensor zeroed and every value replaced."""
    if isinstance(state, dict):
        return {key: blank_like(value) for key, value in state.items()}
    if isinstance(state, list):
        return [blank_like(value) for value in state]
    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state.contiguous())
    return "unloaded"


def test_dcp_loads_every_tensor_and_value_of_a_cpp_checkpoint(single_checkpoint):
    expected = expected_single_state()
    state = blank_like(expected)
    dcp.load(state, storage_reader=stowage.StorageReader(single_checkpoint))
    # DCP loads the leaves it finds; an empty dict has none.
    expected["values"]["empty_dict"] = {}
    expected["tensors"]["transposed"] = expected["tensors"]["transposed"].contiguous()
    assert_same(state, expected)


def test_dcp_assembles_tensors_from_the_shards_of_two_ranks(sharded_checkpoint):
    state = blank_like(expected_sharded_state())
    dcp.load(state, storage_reader=stowage.StorageReader(sharded_checkpoint))
    assert_same(state, expected_sharded_state())


def test_a_subset_of_the_entries_loads_and_reads_only_its_chunks(sharded_checkpoint, copy_of):
    checkpoint = copy_of(sharded_checkpoint)
    # Damage a chunk nobody asks for: the load does not read it.
    big = stowage.read_metadata(checkpoint).find("model.big").chunks[1]
    with open(checkpoint / big.file, "r+b") as stream:
        stream.seek(big.offset + big.length - 1)
        stream.write(b"\xff")
    state = {"model": {"cols": torch.zeros(7, 9, dtype=torch.float64)}}
    dcp.load(state, storage_reader=stowage.StorageReader(checkpoint))
    assert_same(state["model"]["cols"], expected_sharded_state()["model"]["cols"])


def test_a_corrupt_chunk_fails_dcp_load_naming_it_and_changes_nothing(sharded_checkpoint, copy_of):
    checkpoint = copy_of(sharded_checkpoint)
    big = stowage.read_metadata(checkpoint).find("model.big").chunks[1]
    with open(checkpoint / big.file, "r+b") as stream:
        stream.seek(big.offset + 2 * CHECKSUM_BLOCK_BYTES + 5)
        stream.write(b"\xff")
    state = blank_like(expected_sharded_state())
    with pytest.raises(CheckpointException) as raised:
        dcp.load(state, storage_reader=stowage.StorageReader(checkpoint))
    error, _ = raised.value.failures[0]  # DCP wraps each rank's error
    assert isinstance(error, stowage.CorruptionError) and "corrupt" in str(error)
    assert (error.entry, error.file) == ("model.big", str(checkpoint / big.file))
    assert error.offset == big.offset  # a whole chunk is read, and checked against its xxh3
    assert_same(state, blank_like(expected_sharded_state()))  # verified before anything was copied


def test_a_missing_checkpoint_is_a_clear_error_under_dcp(tmp_path):
    with pytest.raises(CheckpointException) as raised:
        dcp.load({"w": torch.zeros(2)}, storage_reader=stowage.StorageReader(tmp_path))
    error, _ = raised.value.failures[0]
    assert isinstance(error, stowage.NoCheckpointError) and "holds no checkpoint" in str(error)


def test_checkpoint_id_resets_the_reader_and_names_only_stowage_checkpoints(single_checkpoint, tmp_path):
    assert stowage.StorageReader.validate_checkpoint_id(single_checkpoint)
    assert not stowage.StorageReader.validate_checkpoint_id(tmp_path)
    (tmp_path / ".metadata.json").write_text('{"format": "something else"}')
    assert not stowage.StorageReader.validate_checkpoint_id(tmp_path)
    state = {"nested": {"inner": {"weight": torch.zeros(2, 3)}}}
    dcp.load(state, checkpoint_id=single_checkpoint, storage_reader=stowage.StorageReader(tmp_path))
    assert_same(state["nested"]["inner"]["weight"], expected_single_state()["nested"]["inner"]["weight"])
