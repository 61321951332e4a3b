"""Damaged data files (tests/dcp/safety_test.cpp's cases, ported): a flipped byte, a
truncated, missing, symlinked or special file fails the load with an error naming the
entry and the file, and nothing is returned."""

import json
import os

import pytest

import stowage
from stowage.checkpoint import Checkpoint
from stowage.metadata import CHECKSUM_BLOCK_BYTES, METADATA_FILE_NAME


def chunk_of(checkpoint, fqn):
    chunk, = stowage.read_metadata(checkpoint).find(fqn).chunks
    return chunk


def flip_byte(path, offset):
    with open(path, "r+b") as stream:
        stream.seek(offset)
        byte = stream.read(1)
        stream.seek(offset)
        stream.write(bytes([byte[0] ^ 0x10]))


def test_a_flipped_byte_fails_the_load_naming_entry_file_and_offset(single_checkpoint, copy_of):
    checkpoint = copy_of(single_checkpoint)
    chunk = chunk_of(checkpoint, "nested.inner.weight")
    flip_byte(checkpoint / chunk.file, chunk.offset + chunk.length // 2)
    with pytest.raises(stowage.CorruptionError) as raised:
        stowage.load_checkpoint(checkpoint)
    error = raised.value
    assert error.entry == "nested.inner.weight"
    assert (error.file, error.offset) == (str(checkpoint / chunk.file), chunk.offset)
    assert "corrupt" in str(error) and "nested.inner.weight" in str(error) and chunk.file in str(error)


def test_a_flipped_byte_in_a_later_block_is_found_by_a_whole_read(single_checkpoint, copy_of):
    checkpoint = copy_of(single_checkpoint)
    chunk = chunk_of(checkpoint, "tensors.big")
    flip_byte(checkpoint / chunk.file, chunk.offset + 4 * CHECKSUM_BLOCK_BYTES + 7)
    with pytest.raises(stowage.CorruptionError, match="tensors.big"):
        stowage.load_checkpoint(checkpoint, mmap=False)


def test_a_truncated_file_fails_the_load_naming_entry_and_file(single_checkpoint, copy_of):
    checkpoint = copy_of(single_checkpoint)
    metadata = stowage.read_metadata(checkpoint)
    # The last chunk of a file, by its end.
    entry, chunk = max(((e, c) for e in metadata.tensors() for c in e.chunks if c.length),
                       key=lambda pair: (pair[1].file, pair[1].offset + pair[1].length))
    os.truncate(checkpoint / chunk.file, chunk.offset + chunk.length - 1)
    with pytest.raises(stowage.CorruptionError, match="truncated") as raised:
        stowage.load_checkpoint(checkpoint)
    assert raised.value.entry == entry.fqn and raised.value.file == str(checkpoint / chunk.file)


def test_a_missing_file_fails_the_load_naming_entry_and_file(single_checkpoint, copy_of):
    checkpoint = copy_of(single_checkpoint)
    chunk = chunk_of(checkpoint, "tensors.zero_dim")
    (checkpoint / chunk.file).unlink()
    with pytest.raises(stowage.CorruptionError, match="missing") as raised:
        stowage.load_checkpoint(checkpoint)
    assert chunk.file in str(raised.value) and raised.value.entry


def test_a_symlinked_data_file_is_not_followed(single_checkpoint, copy_of):
    checkpoint = copy_of(single_checkpoint)
    chunk = chunk_of(checkpoint, "tensors.zero_dim")
    os.rename(checkpoint / chunk.file, checkpoint / "elsewhere")
    os.symlink(checkpoint / "elsewhere", checkpoint / chunk.file)
    with pytest.raises(stowage.CorruptionError, match="symbolic link") as raised:
        stowage.load_checkpoint(checkpoint)
    assert raised.value.file == str(checkpoint / chunk.file)


def test_a_fifo_in_place_of_a_data_file_is_refused_without_blocking(single_checkpoint, copy_of):
    checkpoint = copy_of(single_checkpoint)
    chunk = chunk_of(checkpoint, "tensors.zero_dim")
    (checkpoint / chunk.file).unlink()
    os.mkfifo(checkpoint / chunk.file)
    with pytest.raises(stowage.CorruptionError, match="FIFO"):
        stowage.load_checkpoint(checkpoint)


def test_the_metadata_names_no_file_outside_the_directory(single_checkpoint, copy_of):
    checkpoint = copy_of(single_checkpoint)
    path = checkpoint / METADATA_FILE_NAME
    document = json.loads(path.read_bytes())
    path.write_text(path.read_text().replace(json.dumps(document["files"][0]), '"../../etc/passwd"', 1))
    with pytest.raises(stowage.FormatError, match="leave the checkpoint directory"):
        stowage.load_checkpoint(checkpoint)


def test_a_partial_read_verifies_only_the_blocks_it_touches(single_checkpoint, copy_of):
    checkpoint = copy_of(single_checkpoint)
    chunk = chunk_of(checkpoint, "tensors.big")
    flip_byte(checkpoint / chunk.file, chunk.offset + 2 * CHECKSUM_BLOCK_BYTES + 7)
    opened = Checkpoint(checkpoint)
    entry = opened.metadata.find("tensors.big")
    # Blocks 0 and 1 are intact: a range within them reads.
    assert len(opened.files.verified_bytes(entry, chunk, 10, 2 * CHECKSUM_BLOCK_BYTES)) == 2 * CHECKSUM_BLOCK_BYTES - 10
    with pytest.raises(stowage.CorruptionError) as raised:
        opened.files.verified_bytes(entry, chunk, CHECKSUM_BLOCK_BYTES, 2 * CHECKSUM_BLOCK_BYTES + 1)
    assert raised.value.offset == chunk.offset + 2 * CHECKSUM_BLOCK_BYTES
    assert f"({CHECKSUM_BLOCK_BYTES} bytes)" in str(raised.value)
