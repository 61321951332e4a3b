"""Read stowage checkpoints (docs/FORMAT.md, versions 1 to 3) from Python.

- load_checkpoint(path, device="cpu"): the nested state dict, every byte verified;
- StorageReader(path): a torch.distributed.checkpoint.StorageReader, so that dcp.load
  reads a stowage checkpoint into any state dict, resharding as DCP does;
- read_metadata(path): the validated metadata alone (needs no torch).

Loading never executes anything from the checkpoint (the metadata is JSON, the data
raw bytes) and never opens a file outside its directory.
"""

from .checkpoint import read_metadata
from .errors import (CorruptionError, FormatError, NoCheckpointError, StowageError,
                     UnsupportedVersionError)
from .metadata import Chunk, Metadata, TensorEntry, ValueEntry

__all__ = ["load_checkpoint", "StorageReader", "read_metadata", "Metadata", "TensorEntry", "ValueEntry", "Chunk",
           "StowageError", "CorruptionError", "FormatError", "NoCheckpointError", "UnsupportedVersionError"]


def __getattr__(name):
    # The torch parts are imported on first use, so that reading metadata needs no torch.
    if name == "load_checkpoint":
        from .loading import load_checkpoint
        return load_checkpoint
    if name == "StorageReader":
        from .storage_reader import StorageReader
        return StorageReader
    raise AttributeError(f"module 'stowage' has no attribute '{name}'")
