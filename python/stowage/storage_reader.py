"""stowage.StorageReader: torch.distributed.checkpoint reading a stowage checkpoint.

dcp.load(state_dict, storage_reader=StorageReader(path)) loads a checkpoint the C++
library saved into any state dict, on any number of ranks, with DCP's own planning and
resharding: read_metadata describes every saved chunk to DCP, read_data copies the
overlaps DCP asks for. Keys are the entries' fqns, which are what DCP's flattening of a
nested state dict produces ({"model": {"weight": t}} -> "model.weight", list indices in
decimal).

Every byte read is verified first. prepare_local_plan verifies all the bytes this rank's
plan reads: it runs inside DCP's planning collective, so a corrupt chunk fails the load
on every rank before any rank's state dict changes.
"""

import dataclasses
import io
import json
import os
from typing import Any, Dict, List, Optional, Union

import torch
from torch.distributed.checkpoint import StorageReader as _DcpStorageReader
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, TensorProperties, TensorStorageMetadata)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from . import metadata as stowage_metadata
from .checkpoint import Checkpoint
from .data_files import read_regular_file
from .dtypes import TORCH_DTYPES
from .errors import StowageError
from .metadata import TensorEntry, ValueEntry


@dataclasses.dataclass(frozen=True)
class ChunkLocation:
    """storage_data of one saved chunk: its entry and its index among the entry's chunks."""
    fqn: str
    chunk_index: int


@dataclasses.dataclass(frozen=True)
class ValueLocation:
    """storage_data of a non-tensor entry."""
    fqn: str


def _dcp_metadata(metadata: stowage_metadata.Metadata) -> Metadata:
    state_dict_metadata: Dict[str, Any] = {}
    storage_data: Dict[MetadataIndex, Any] = {}
    for entry in metadata.entries:
        if isinstance(entry, ValueEntry):
            state_dict_metadata[entry.fqn] = BytesStorageMetadata()
            storage_data[MetadataIndex(entry.fqn)] = ValueLocation(entry.fqn)
            continue
        chunks = []
        for index, chunk in enumerate(entry.chunks):
            chunks.append(ChunkStorageMetadata(offsets=torch.Size(chunk.offsets), sizes=torch.Size(chunk.sizes)))
            storage_data[MetadataIndex(entry.fqn, chunk.offsets)] = ChunkLocation(entry.fqn, index)
        state_dict_metadata[entry.fqn] = TensorStorageMetadata(
            properties=TensorProperties(dtype=TORCH_DTYPES[entry.dtype]), size=torch.Size(entry.shape), chunks=chunks)
    return Metadata(state_dict_metadata=state_dict_metadata, storage_data=storage_data)


class StorageReader(_DcpStorageReader):
    """A torch.distributed.checkpoint StorageReader of the stowage checkpoint at `path`."""

    def __init__(self, path: Union[str, os.PathLike]):
        super().__init__()
        self.path = os.fspath(path)
        self._checkpoint: Optional[Checkpoint] = None
        self._storage_data: Dict[MetadataIndex, Any] = {}
        self._deferred_error: Optional[BaseException] = None

    @property
    def checkpoint_id(self) -> str:
        return self.path

    def reset(self, checkpoint_id: Union[str, os.PathLike, None] = None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self._checkpoint = None
        self._storage_data = {}
        self._deferred_error = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, os.PathLike]) -> bool:
        """Whether `checkpoint_id` is a directory holding a stowage checkpoint's metadata
        (not whether that checkpoint is intact: loading finds that out)."""
        try:
            path = os.path.join(os.fspath(checkpoint_id), stowage_metadata.METADATA_FILE_NAME)
            document = json.loads(read_regular_file(path))
        except (OSError, TypeError, ValueError, StowageError):
            return False
        return isinstance(document, dict) and document.get("format") == "stowage.dcp"

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint as DCP metadata, once its metadata and data files are validated.

        dcp.load drops what the first call raises and retries with rank=<rank>, asking for
        rank-local metadata, which stowage has none of; an error raised then would be
        dropped too, leaving only "metadata is None". So the retry returns empty metadata
        and keeps the error for set_up_storage_reader, which dcp.load lets through.
        """
        try:
            self._checkpoint = Checkpoint(self.path)
        except (StowageError, OSError) as error:
            if "rank" not in kwargs:
                raise
            self._deferred_error = error
            return Metadata(state_dict_metadata={})
        metadata = _dcp_metadata(self._checkpoint.metadata)
        self._storage_data = metadata.storage_data
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if self._deferred_error is not None:
            raise self._deferred_error
        self._opened()

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        for item in plan.items:
            if item.type == LoadItemType.TENSOR:
                self._verified_chunk_region(item)
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, self._value_bytes(item))
                continue
            source = self._verified_chunk_region(item)
            target = planner.resolve_tensor(item).detach()
            if target.size() != source.size():
                raise StowageError(f"checkpoint '{self.path}': entry '{item.storage_index.fqn}': DCP asks for "
                                   f"{list(source.size())} elements into a tensor of {list(target.size())}")
            target.copy_(source)
            planner.commit_tensor(item, target)
        future: Future = Future()
        future.set_result(None)
        return future

    def _opened(self) -> Checkpoint:
        if self._checkpoint is None:
            self._checkpoint = Checkpoint(self.path)
            self._storage_data = _dcp_metadata(self._checkpoint.metadata).storage_data
        return self._checkpoint

    def _value_bytes(self, item: ReadItem) -> io.BytesIO:
        """The value as DefaultLoadPlanner.load_bytes reads it: a torch.save of it, made
        here from the validated JSON (so what DCP unpickles is only what we pickled)."""
        location: ValueLocation = self._storage_data[item.storage_index]
        value = self._opened().metadata.find(location.fqn).value
        stream = io.BytesIO()
        torch.save(value, stream)
        stream.seek(0)
        return stream

    def _verified_chunk_region(self, item: ReadItem) -> torch.Tensor:
        """The box of a saved chunk that a read item asks for (storage_offsets, lengths),
        as a view of the mapping whose bytes have been verified."""
        checkpoint = self._opened()
        location: ChunkLocation = self._storage_data[item.storage_index]
        entry: TensorEntry = checkpoint.metadata.find(location.fqn)
        chunk = entry.chunks[location.chunk_index]
        dtype = TORCH_DTYPES[entry.dtype]
        lengths = tuple(item.lengths)
        if chunk.length == 0 or 0 in lengths:
            return torch.empty(lengths, dtype=dtype)
        element_size = stowage_metadata.ELEMENT_SIZES[entry.dtype]
        strides = _element_strides(chunk.sizes)
        first = sum(offset * stride for offset, stride in zip(item.storage_offsets, strides)) * element_size
        last = sum((offset + length - 1) * stride
                   for offset, length, stride in zip(item.storage_offsets, lengths, strides)) * element_size
        # In row-major order every element of the box lies from its first to its last one.
        span = checkpoint.files.verified_bytes(entry, chunk, first, last + element_size)
        return torch.frombuffer(span, dtype=dtype).as_strided(lengths, strides)


def _element_strides(sizes) -> List[int]:
    """Row-major strides, in elements, of a tensor of `sizes`."""
    strides = [1] * len(sizes)
    for d in range(len(sizes) - 1, 0, -1):
        strides[d - 1] = strides[d] * sizes[d]
    return strides
