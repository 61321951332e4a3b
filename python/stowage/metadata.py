"""Parsing and validation of a checkpoint's .metadata.json (docs/FORMAT.md, versions 1-3).

Everything a load trusts is checked here before a data file is opened, as the C++
reader does (src/dcp/format/metadata.cpp): field types, the format version, known dtypes, safe
file names, chunks that tile their tensor with lengths that match their boxes, block
checksum counts, and, last, metadata_xxh3 over the canonical text. A hostile document
thus can neither name a file outside the checkpoint directory nor make a load allocate
more than the data files hold (readers.py checks the chunks against the file sizes).
Nothing here needs torch.
"""

import dataclasses
import functools
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import canonical_json
from .checksum import hash_hex, parse_hash, xxh3
from .errors import FormatError, UnsupportedVersionError

METADATA_FILE_NAME = ".metadata.json"
OLDEST_READABLE_VERSION = 1
NEWEST_READABLE_VERSION = 3
CHECKSUM_BLOCK_BYTES = 262144
_CHECKSUM_FIELD = "metadata_xxh3"
_INT64_MAX = 2 ** 63 - 1

# LibTorch's names of the dtypes a checkpoint may hold, with their element sizes.
ELEMENT_SIZES = {
    "Byte": 1, "Char": 1, "Short": 2, "Int": 4, "Long": 8, "Half": 2, "BFloat16": 2, "Float": 4,
    "Double": 8, "Bool": 1, "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16,
}

PathElement = Union[str, int]


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One saved box of a tensor: where its bytes lie and what they hash to."""
    offsets: Tuple[int, ...]
    sizes: Tuple[int, ...]
    file: str
    offset: int  # of its first byte in `file`
    length: int  # bytes: the box's elements times the element size
    xxh3: int
    block_xxh3: Tuple[int, ...]  # one per CHECKSUM_BLOCK_BYTES block; empty: one block
    rank: int


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    fqn: str
    path: Tuple[PathElement, ...]
    dtype: str  # a key of ELEMENT_SIZES
    shape: Tuple[int, ...]
    chunks: Tuple[Chunk, ...]


@dataclasses.dataclass(frozen=True)
class ValueEntry:
    """A non-tensor leaf, stored inline: None, bool, int, float, str, {} or a list of those."""
    fqn: str
    path: Tuple[PathElement, ...]
    value: Any


Entry = Union[TensorEntry, ValueEntry]


@dataclasses.dataclass(frozen=True)
class Metadata:
    version: int
    save_id: str
    world_size: int
    entries: Tuple[Entry, ...]

    def files(self) -> List[str]:
        """The data files the chunks name, each once, in order of first use."""
        return list(dict.fromkeys(chunk.file for entry in self.tensors() for chunk in entry.chunks))

    def tensors(self) -> List[TensorEntry]:
        return [entry for entry in self.entries if isinstance(entry, TensorEntry)]

    def find(self, fqn: str) -> Optional[Entry]:
        return self._by_fqn.get(fqn)

    @functools.cached_property
    def _by_fqn(self) -> Dict[str, Entry]:
        return {entry.fqn: entry for entry in self.entries}


def is_safe_file_name(name: str) -> bool:
    """A plain name inside the checkpoint directory: no '/', not '.' or '..', no NUL."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def path_to_fqn(path: Sequence[PathElement]) -> str:
    return ".".join(str(element) for element in path)


class _Decoder:
    """Typed field access that names where a problem is: the header or an entry."""

    def __init__(self, origin: str):
        self.origin = origin

    def fail(self, where: str, what: str, entry: Optional[str] = None):
        raise FormatError(f"checkpoint metadata {self.origin}: {where}: {what}", entry=entry, file=self.origin)

    def field(self, obj: Any, key: str, where: str, entry: Optional[str] = None) -> Any:
        if not isinstance(obj, dict):
            self.fail(where, "expected an object", entry)
        if key not in obj:
            self.fail(where, f"missing field '{key}'", entry)
        return obj[key]

    def integer(self, value: Any, what: str, where: str, entry: Optional[str] = None) -> int:
        if type(value) is not int:  # bool is an int subclass, and JSON's true is no integer
            self.fail(where, f"{what} must be an integer", entry)
        if value > _INT64_MAX:
            self.fail(where, f"{what} is out of range", entry)
        return value

    def non_negative(self, value: Any, what: str, where: str, entry: Optional[str] = None) -> int:
        if self.integer(value, what, where, entry) < 0:
            self.fail(where, f"{what} must not be negative", entry)
        return value

    def string(self, value: Any, what: str, where: str, entry: Optional[str] = None) -> str:
        if not isinstance(value, str):
            self.fail(where, f"{what} must be a string", entry)
        return value

    def int_list(self, value: Any, what: str, where: str, entry: Optional[str] = None) -> Tuple[int, ...]:
        if not isinstance(value, list) or any(type(v) is not int or v > _INT64_MAX for v in value):
            self.fail(where, f"{what} must be a list of integers", entry)
        return tuple(value)

    def hash(self, value: Any, what: str, where: str, entry: Optional[str] = None) -> int:
        parsed = parse_hash(value)
        if parsed is None:
            self.fail(where, f"field '{what}' must hold 16 hex digits", entry)
        return parsed

    def path(self, value: Any, where: str) -> Tuple[PathElement, ...]:
        if not isinstance(value, list) or not value:
            self.fail(where, "field 'path' must be a non-empty list")
        for element in value:
            if not isinstance(element, str) and not (type(element) is int and 0 <= element <= _INT64_MAX):
                self.fail(where, "field 'path' may hold only keys and list indices")
        if not isinstance(value[0], str):
            self.fail(where, "field 'path' must start with a key")
        return tuple(value)


# ------------------------------------------------------------------ values

_LIST_ELEMENT_TYPES = {"int": int, "double": float, "bool": bool, "str": str}
_SPECIAL_DOUBLES = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _decode_scalar(d: _Decoder, value: Any, where: str, fqn: str) -> Any:
    kind = d.string(d.field(value, "t", where, fqn), "field 't'", where, fqn)
    if kind == "none":
        return None
    v = d.field(value, "v", where, fqn)
    if kind == "bool" and isinstance(v, bool):
        return v
    if kind == "int" and type(v) is int and -2 ** 63 <= v <= _INT64_MAX:
        return v
    if kind == "double" and type(v) in (int, float):
        return float(v)
    if kind == "double" and v in _SPECIAL_DOUBLES:
        return _SPECIAL_DOUBLES[v]
    if kind == "str" and isinstance(v, str):
        return v
    d.fail(where, f"malformed value of type '{kind}'", fqn)


def _decode_value(d: _Decoder, value: Any, where: str, fqn: str) -> Any:
    """A {"t": ...} value as Python: None, bool, int, float, str, {} or a list of scalars."""
    kind = d.string(d.field(value, "t", where, fqn), "field 't'", where, fqn)
    if kind == "dict":
        return {}
    if kind != "list":
        return _decode_scalar(d, value, where, fqn)
    elem = d.string(d.field(value, "elem", where, fqn), "field 'elem'", where, fqn)
    items = d.field(value, "v", where, fqn)
    if not isinstance(items, list):
        d.fail(where, "list value must hold a list", fqn)
    if elem not in _LIST_ELEMENT_TYPES and elem != "any":
        d.fail(where, f"unknown list element type '{elem}'", fqn)
    out = [_decode_scalar(d, item, where, fqn) for item in items]
    for element in out:
        # As c10's isSubtypeOf: an int is no double, a bool no int.
        if elem != "any" and type(element) is not _LIST_ELEMENT_TYPES[elem]:
            d.fail(where, f"list of {elem} holds a {type(element).__name__}", fqn)
    return out


# ------------------------------------------------------------------ chunks

def _volume(sizes: Sequence[int]) -> int:
    return math.prod(sizes)


def check_tiling(shape: Sequence[int], boxes: Sequence[Tuple[Sequence[int], Sequence[int]]]) -> Optional[str]:
    """Why (offsets, sizes) boxes do not tile a tensor of `shape` exactly, or None."""
    for offsets, sizes in boxes:
        if len(offsets) != len(shape) or len(sizes) != len(shape):
            return f"a chunk has {len(sizes)} dimensions, the tensor {len(shape)}"
        for offset, size, extent in zip(offsets, sizes, shape):
            if offset < 0 or size < 0 or offset > extent - size:
                return f"chunk at {list(offsets)} of size {list(sizes)} leaves the tensor of shape {list(shape)}"
    # Pairwise disjoint boxes inside the tensor whose volumes add up to it tile it.
    for i, (offsets_i, sizes_i) in enumerate(boxes):
        for offsets_j, sizes_j in boxes[i + 1:]:
            if _volume(sizes_i) and _volume(sizes_j) and all(
                    a < b + m and b < a + n for a, n, b, m in zip(offsets_i, sizes_i, offsets_j, sizes_j)):
                return f"chunks at {list(offsets_i)} and {list(offsets_j)} overlap"
    covered = sum(_volume(sizes) for _, sizes in boxes)
    if covered != _volume(shape):
        return f"the chunks cover {covered} of {_volume(shape)} elements"
    return None


def _block_hashes(d: _Decoder, hashes: Any, length: int, where: str, fqn: str) -> Tuple[int, ...]:
    blocks = -(-length // CHECKSUM_BLOCK_BYTES)
    expected = blocks if blocks > 1 else 0
    if not isinstance(hashes, list) or len(hashes) != expected:
        d.fail(where, f"field 'block_xxh3' must list {expected} block checksums", fqn)
    return tuple(d.hash(h, "block_xxh3", where, fqn) for h in hashes)


def _check_chunks(d: _Decoder, entry: TensorEntry, where: str) -> None:
    problem = check_tiling(entry.shape, [(c.offsets, c.sizes) for c in entry.chunks])
    if problem:
        d.fail(where, problem, entry.fqn)
    for chunk in entry.chunks:
        expected = _volume(chunk.sizes) * ELEMENT_SIZES[entry.dtype]
        if chunk.length != expected:
            d.fail(where, f"a chunk of {_volume(chunk.sizes)} elements of {entry.dtype} cannot be "
                          f"{chunk.length} bytes", entry.fqn)
        if chunk.offset + chunk.length > _INT64_MAX:
            d.fail(where, "chunk byte range overflows", entry.fqn)


def _dtype(d: _Decoder, value: Any, where: str, fqn: str) -> str:
    d.string(value, "its dtype", where, fqn)
    if value not in ELEMENT_SIZES:
        d.fail(where, f"unknown dtype '{value}'", fqn)
    return value


def _shape(d: _Decoder, value: Any, where: str, fqn: str) -> Tuple[int, ...]:
    shape = d.int_list(value, "its shape", where, fqn)
    if any(size < 0 for size in shape):
        d.fail(where, f"negative size in shape {list(shape)}", fqn)
    return shape


def _file_name(d: _Decoder, name: str, where: str, fqn: str) -> str:
    if not is_safe_file_name(name):
        d.fail(where, f"file name '{name}' would leave the checkpoint directory", fqn)
    return name


# ------------------------------------------------- versions 1 and 2: objects

def _decode_object_entry(d: _Decoder, e: Any, index: int, version: int) -> Entry:
    fqn = d.string(d.field(e, "fqn", f"entry {index}"), "field 'fqn'", f"entry {index}")
    where = f"entry '{fqn}'"
    path = d.path(d.field(e, "path", where, fqn), where)
    if path_to_fqn(path) != fqn:
        d.fail(where, "its path does not match its name", fqn)
    kind = d.string(d.field(e, "kind", where, fqn), "field 'kind'", where, fqn)
    if kind == "value":
        return ValueEntry(fqn, path, _decode_value(d, d.field(e, "value", where, fqn), where, fqn))
    if kind != "tensor":
        d.fail(where, f"unknown kind '{kind}'", fqn)
    dtype = _dtype(d, d.field(e, "dtype", where, fqn), where, fqn)
    shape = _shape(d, d.field(e, "shape", where, fqn), where, fqn)
    chunk_objects = d.field(e, "chunks", where, fqn)
    if not isinstance(chunk_objects, list):
        d.fail(where, "field 'chunks' must be a list", fqn)
    chunks = []
    for c in chunk_objects:
        def get(key):
            return d.field(c, key, where, fqn)
        length = d.non_negative(get("length"), "field 'length'", where, fqn)
        blocks = -(-length // CHECKSUM_BLOCK_BYTES)
        chunks.append(Chunk(
            offsets=d.int_list(get("offsets"), "field 'offsets'", where, fqn),
            sizes=d.int_list(get("sizes"), "field 'sizes'", where, fqn),
            rank=d.non_negative(get("rank"), "field 'rank'", where, fqn),
            file=_file_name(d, d.string(get("file"), "field 'file'", where, fqn), where, fqn),
            offset=d.non_negative(get("offset"), "field 'offset'", where, fqn),
            length=length,
            xxh3=d.hash(get("xxh3"), "xxh3", where, fqn),
            block_xxh3=_block_hashes(d, get("block_xxh3"), length, where, fqn)
            if version >= 2 and blocks > 1 else ()))
    entry = TensorEntry(fqn, path, dtype, shape, tuple(chunks))
    _check_chunks(d, entry, where)
    return entry


# ---------------------------------------------------------- version 3: tables

def _element(d: _Decoder, row: list, index: int, what: str, where: str, fqn: Optional[str]) -> Any:
    if index >= len(row):
        d.fail(where, f"missing its {what}", fqn)
    return row[index]


def _decode_name(d: _Decoder, name: Any, where: str) -> Tuple[str, Tuple[PathElement, ...]]:
    # A name is the fqn when the path is its keys split at the dots, else the path itself.
    if isinstance(name, str):
        return name, tuple(name.split("."))
    path = d.path(name, where)
    return path_to_fqn(path), path


def _decode_table_chunk(d: _Decoder, c: Any, dtype: str, shape: Tuple[int, ...], files: List[str],
                        where: str, fqn: str) -> Chunk:
    if not isinstance(c, list) or len(c) not in (5, 7):
        d.fail(where, "a chunk must be a list of 5 or 7 fields", fqn)
    file_index = d.non_negative(c[0], "chunk's file index", where, fqn)
    if file_index >= len(files):
        d.fail(where, f"a chunk's file index {file_index} is not below the {len(files)} files", fqn)
    offset = d.non_negative(c[1], "chunk's offset", where, fqn)
    xxh3 = d.hash(c[2], "xxh3", where, fqn)
    rank = d.non_negative(c[3], "chunk's rank", where, fqn)
    if len(c) == 7:
        offsets = d.int_list(c[5], "offsets", where, fqn)
        sizes = d.int_list(c[6], "sizes", where, fqn)
    else:
        offsets, sizes = (0,) * len(shape), shape
    if any(size < 0 for size in sizes):
        d.fail(where, f"chunk at {list(offsets)} of size {list(sizes)} leaves the tensor of shape {list(shape)}", fqn)
    length = _volume(sizes) * ELEMENT_SIZES[dtype]  # the box's bytes: not written in version 3
    if length > _INT64_MAX:
        d.fail(where, "a chunk's byte length overflows", fqn)
    return Chunk(offsets=offsets, sizes=sizes, file=_file_name(d, files[file_index], where, fqn), offset=offset,
                 length=length, xxh3=xxh3, block_xxh3=_block_hashes(d, c[4], length, where, fqn), rank=rank)


def _decode_table_entry(d: _Decoder, row: Any, index: int, files: List[str]) -> Entry:
    position = f"entry {index}"
    if not isinstance(row, list) or not row or not isinstance(row[0], str):
        d.fail(position, "expected a list starting with its kind")
    fqn, path = _decode_name(d, _element(d, row, 1, "name", position, None), position)
    where = f"entry '{fqn}'"
    kind = row[0]
    if kind == "v":
        return ValueEntry(fqn, path, _decode_value(d, _element(d, row, 2, "value", where, fqn), where, fqn))
    if kind != "t":
        d.fail(where, f"unknown kind '{kind}'", fqn)
    dtype = _dtype(d, _element(d, row, 2, "dtype", where, fqn), where, fqn)
    shape = _shape(d, _element(d, row, 3, "shape", where, fqn), where, fqn)
    chunk_rows = _element(d, row, 4, "chunks", where, fqn)
    if not isinstance(chunk_rows, list):
        d.fail(where, "its chunks must be a list", fqn)
    chunks = tuple(_decode_table_chunk(d, c, dtype, shape, files, where, fqn) for c in chunk_rows)
    entry = TensorEntry(fqn, path, dtype, shape, chunks)
    _check_chunks(d, entry, where)
    return entry


def _decode_files(d: _Decoder, document: dict) -> List[str]:
    names = d.field(document, "files", "header")
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        d.fail("header", "field 'files' must be a list of file names")
    return names


# ------------------------------------------------------------------ document

def _check_header(d: _Decoder, document: Any) -> int:
    """The format version, once the header says this is a checkpoint this reader reads."""
    if not isinstance(document, dict) or d.field(document, "format", "header") != "stowage.dcp":
        d.fail("header", "not a stowage.dcp checkpoint")
    version = d.integer(d.field(document, "version", "header"), "field 'version'", "header")
    if not OLDEST_READABLE_VERSION <= version <= NEWEST_READABLE_VERSION:
        raise UnsupportedVersionError(
            f"checkpoint metadata {d.origin}: header: format version {version} is not supported (this reader "
            f"reads versions {OLDEST_READABLE_VERSION} to {NEWEST_READABLE_VERSION})", version, d.origin)
    if version >= 2 and d.integer(d.field(document, "checksum_block_bytes", "header"), "field 'checksum_block_bytes'",
                                  "header") != CHECKSUM_BLOCK_BYTES:
        d.fail("header", f"checksum blocks must be {CHECKSUM_BLOCK_BYTES} bytes")
    if d.field(document, "byte_order", "header") != "little":
        d.fail("header", "only little-endian data is supported")
    return version


def document_checksum(document: dict) -> str:
    """metadata_xxh3 of a parsed document: the hash of its canonical text without the field."""
    text = canonical_json.dump({key: value for key, value in document.items() if key != _CHECKSUM_FIELD})
    return hash_hex(xxh3(text.encode("utf-8")))


def parse_metadata(data: bytes, origin: str) -> Metadata:
    """Validates and decodes a .metadata.json's bytes. `origin` (the file's path) names the
    document in errors. Raises FormatError or UnsupportedVersionError."""
    d = _Decoder(origin)
    try:
        document = canonical_json.parse(data)
    except ValueError as error:  # CanonicalJsonError and json's JSONDecodeError
        raise FormatError(f"checkpoint metadata {origin} is not valid JSON: {error}", file=origin) from None
    version = _check_header(d, document)
    save_id = d.string(d.field(document, "save_id", "header"), "field 'save_id'", "header")
    world_size = d.non_negative(d.field(document, "world_size", "header"), "field 'world_size'", "header")
    files = _decode_files(d, document) if version >= 3 else []
    rows = d.field(document, "entries", "header")
    if not isinstance(rows, list):
        d.fail("header", "field 'entries' must be a list")
    entries = tuple(_decode_table_entry(d, row, i, files) if version >= 3 else _decode_object_entry(d, row, i, version)
                    for i, row in enumerate(rows))
    seen = set()
    for entry in entries:
        if entry.fqn in seen:
            d.fail("entries", f"checkpoint metadata lists entry '{entry.fqn}' twice", entry.fqn)
        seen.add(entry.fqn)
    # Last, so that a malformed document gets the error that says what is wrong with it.
    # Version 1 predates the field: there it is checked only when present.
    if version >= 2 or _CHECKSUM_FIELD in document:
        stored = d.string(d.field(document, _CHECKSUM_FIELD, "header"), f"field '{_CHECKSUM_FIELD}'", "header")
        computed = document_checksum(document)
        if stored != computed:
            d.fail("header", f"the metadata is corrupt: its checksum is {stored}, its content hashes to {computed}")
    return Metadata(version, save_id, world_size, entries)
