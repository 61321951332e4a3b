"""load_checkpoint: a whole checkpoint as a nested dict of torch tensors and Python values."""

import os
import sys
from typing import Any, Dict, Union

import torch

from .checkpoint import Checkpoint
from .data_files import DataFiles
from .dtypes import TORCH_DTYPES
from .metadata import Chunk, TensorEntry, ValueEntry
from .tree import unflatten


def chunk_tensor(files: DataFiles, entry: TensorEntry, chunk: Chunk) -> torch.Tensor:
    """The chunk as a tensor of its box's shape over the verified bytes of the
    copy-on-write mapping: no copy, writable, changes never reach the file."""
    dtype = TORCH_DTYPES[entry.dtype]
    if chunk.length == 0:
        return torch.empty(chunk.sizes, dtype=dtype)
    data = files.verified_bytes(entry, chunk)
    return torch.frombuffer(data, dtype=dtype).reshape(chunk.sizes)


def entry_tensor(files: DataFiles, entry: TensorEntry, copy: bool) -> torch.Tensor:
    """The whole tensor of an entry. A tensor saved as one chunk is the chunk's mapping
    itself unless `copy`; one saved in shards is assembled into new memory."""
    if len(entry.chunks) == 1 and entry.chunks[0].sizes == entry.shape:
        tensor = chunk_tensor(files, entry, entry.chunks[0])
        return tensor.clone() if copy else tensor
    tensor = torch.empty(entry.shape, dtype=TORCH_DTYPES[entry.dtype])
    for chunk in entry.chunks:
        if chunk.length:
            box = tuple(slice(offset, offset + size) for offset, size in zip(chunk.offsets, chunk.sizes))
            tensor[box].copy_(chunk_tensor(files, entry, chunk))
    return tensor


def load_checkpoint(path: Union[str, os.PathLike], device: Union[str, torch.device] = "cpu",
                    mmap: bool = True) -> Dict[str, Any]:
    """The checkpoint in directory `path` as the nested state dict that was saved.

    Tensors come back as torch tensors on `device` with the saved dtype and shape; values
    as None, bool, int, float, str, {} or lists of those; lists of the saved state dict as
    Python lists. Every byte is verified against its checksum before a tensor is made
    of it, and the whole metadata before any data is read.

    With `mmap` (the default), a CPU tensor saved as one chunk is a view of a
    copy-on-write mapping of its data file: it is loaded lazily by the OS, writable, and
    its writes never reach the file; it keeps the file mapped while it lives. Without
    `mmap`, and for tensors saved in shards or moved to another device, each tensor owns
    its memory.

    Raises NoCheckpointError, FormatError, UnsupportedVersionError or CorruptionError
    (with the entry, the file and the offset at fault); nothing is returned then.
    """
    if sys.byteorder != "little":
        raise NotImplementedError("stowage checkpoints are little-endian; this machine is not")
    checkpoint = Checkpoint(path)
    device = torch.device(device)
    leaves = []
    for entry in checkpoint.metadata.entries:
        if isinstance(entry, ValueEntry):
            value = list(entry.value) if isinstance(entry.value, list) else entry.value
            value = {} if isinstance(value, dict) else value  # a new dict for every load
        else:
            value = entry_tensor(checkpoint.files, entry, copy=not mmap or device.type != "cpu").to(device)
        leaves.append((entry.path, value))
    return unflatten(leaves)
