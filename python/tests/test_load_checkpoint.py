"""stowage.load_checkpoint of checkpoints the C++ library wrote: every dtype, shape and
value kind comes back as saved, from every format version and data file layout."""

import pathlib

import pytest
import torch

import stowage
from interop import assert_same, expected_sharded_state, expected_single_state

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "tests" / "dcp" / "fixtures"


@pytest.mark.parametrize("layout", ["single_checkpoint", "per_chunk_checkpoint"])
def test_a_checkpoint_loads_as_the_cpp_library_saved_it(layout, request):
    checkpoint = request.getfixturevalue(layout)
    assert_same(stowage.load_checkpoint(checkpoint), expected_single_state())
    assert_same(stowage.load_checkpoint(checkpoint, mmap=False), expected_single_state())


def test_shards_of_two_ranks_load_as_whole_tensors(sharded_checkpoint):
    metadata = stowage.read_metadata(sharded_checkpoint)
    assert metadata.world_size == 2
    assert {chunk.rank for chunk in metadata.find("model.big").chunks} == {0, 1}
    assert_same(stowage.load_checkpoint(sharded_checkpoint), expected_sharded_state())


def test_a_mapped_tensor_is_writable_and_its_writes_never_reach_the_file(single_checkpoint):
    state = stowage.load_checkpoint(single_checkpoint)
    weight = state["nested"]["inner"]["weight"]
    weight.fill_(123.0)
    again = stowage.load_checkpoint(single_checkpoint)
    assert_same(again["nested"]["inner"]["weight"], expected_single_state()["nested"]["inner"]["weight"])


def test_copies_own_their_memory_and_equal_the_mapped_tensors(single_checkpoint):
    mapped = stowage.load_checkpoint(single_checkpoint)["tensors"]["big"]
    copied = stowage.load_checkpoint(single_checkpoint, mmap=False)["tensors"]["big"]
    assert torch.equal(mapped, copied)
    assert mapped.data_ptr() != copied.data_ptr()


def test_lists_of_the_state_dict_come_back_as_lists(single_checkpoint):
    metadata = stowage.read_metadata(single_checkpoint)
    # A list holding tensors or dicts is saved element by element, its indices in the path.
    assert metadata.find("layers.1.w").path == ("layers", 1, "w")
    assert metadata.find("nested.dotted.key").path == ("nested", "dotted.key")
    state = stowage.load_checkpoint(single_checkpoint)
    assert isinstance(state["layers"], list) and isinstance(state["mixed"], list)
    assert isinstance(state["values"]["ints"], list)


def test_large_chunks_carry_block_checksums(single_checkpoint):
    chunk, = stowage.read_metadata(single_checkpoint).find("tensors.big").chunks
    assert chunk.length == 300 * 1000 * 4
    assert len(chunk.block_xxh3) == 5


@pytest.mark.parametrize("version", [1, 2])
def test_committed_checkpoints_of_versions_one_and_two_load(version):
    state = stowage.load_checkpoint(FIXTURES / f"version{version}")
    assert stowage.read_metadata(FIXTURES / f"version{version}").version == version
    assert_same(state, {
        "opt": {"bias": torch.ones(2, dtype=torch.float64), "mask": torch.zeros(3, dtype=torch.bool), "lr": 0.5,
                "betas": [0.9, 0.999], "name": "adam", "none": None},
        "e": torch.empty(0, 2, dtype=torch.float16)})


def test_tensors_can_be_loaded_onto_another_device(single_checkpoint):
    state = stowage.load_checkpoint(single_checkpoint, device="meta")
    weight = state["nested"]["inner"]["weight"]
    assert weight.device.type == "meta" and weight.shape == (2, 3)
