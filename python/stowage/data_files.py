"""The data files of one checkpoint: opened safely, mapped, and read only as verified.

Opening follows the C++ reader (src/dcp/storage/file_io.cpp, filesystem_reader.cpp): a data file
must be a regular file, checked before it is opened (opening a FIFO would block, a
device node could act) and again after (O_NOFOLLOW refuses a symbolic link, O_NONBLOCK
keeps an object swapped in between from blocking). Every chunk must lie inside its file
and no two chunks may share bytes, so no load allocates more than the files hold.

Files are mapped copy-on-write (mmap.ACCESS_COPY): a tensor made on a mapping is
writable, and what it writes never reaches the file. The bytes a caller gets have been
hashed where they lie in the mapping and matched against the chunk's xxh3, or against
the block_xxh3 of every checksum block they touch.

A file that someone else truncates while it is mapped makes a later read of the lost
pages raise SIGBUS, which Python cannot turn into an exception; stowage never truncates
or rewrites a data file once written (docs/FORMAT.md), so only a foreign program can.
"""

import mmap
import os
import stat
from typing import Dict, Optional, Set, Tuple

from .checksum import hash_hex, xxh3
from .errors import CorruptionError
from .metadata import CHECKSUM_BLOCK_BYTES, Chunk, Metadata, TensorEntry


def _describe_mode(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def read_regular_file(path: str, entry: Optional[str] = None) -> bytes:
    """The whole content of a regular file, opened as data files are (for the metadata)."""
    fd = open_regular_file(path, entry)
    try:
        with os.fdopen(fd, "rb", closefd=False) as stream:
            return stream.read()
    finally:
        os.close(fd)


def open_regular_file(path: str, entry: Optional[str] = None) -> int:
    """A read-only descriptor of `path`, refusing anything but a regular file (a symbolic
    link included) without opening it. Raises CorruptionError naming the file and entry,
    or FileNotFoundError when there is nothing at `path`."""
    mode = os.lstat(path).st_mode
    if not stat.S_ISREG(mode):
        raise CorruptionError(f"'{path}' is {_describe_mode(mode)}, not a regular file"
                              + (f" (entry '{entry}')" if entry else ""), entry=entry, file=path)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise CorruptionError(f"'{path}' is {_describe_mode(mode)}, not a regular file", entry=entry, file=path)
    return fd


class DataFiles:
    """The mapped data files of a checkpoint whose metadata has been validated.

    Construction opens and maps every file the chunks name and checks every chunk's byte
    range against its file's size; a missing, special, symlinked or short file raises
    CorruptionError naming the first entry that uses it. Then verified_bytes() hands out
    verified memoryviews of the mappings.
    """

    def __init__(self, directory: str, metadata: Metadata):
        self.directory = directory
        self._mappings: Dict[str, Optional[mmap.mmap]] = {}
        self._sizes: Dict[str, int] = {}
        self._verified: Set[Tuple[str, int, int]] = set()  # (file, chunk offset, block or -1 for the chunk)
        users = self._first_users(metadata)
        for name in metadata.files():
            self._open(name, users[name])
        self._check_chunk_ranges(metadata)

    @staticmethod
    def _first_users(metadata: Metadata) -> Dict[str, str]:
        users: Dict[str, str] = {}
        for entry in metadata.tensors():
            for chunk in entry.chunks:
                users.setdefault(chunk.file, entry.fqn)
        return users

    def path_of(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _open(self, name: str, entry: str) -> None:
        path = self.path_of(name)
        try:
            fd = open_regular_file(path, entry)
        except FileNotFoundError:
            raise CorruptionError(f"checkpoint '{self.directory}': entry '{entry}': its data file '{name}' is missing",
                                  entry=entry, file=path) from None
        except OSError as error:
            raise CorruptionError(f"checkpoint '{self.directory}': entry '{entry}': data file '{name}': {error}",
                                  entry=entry, file=path) from None
        try:
            size = os.fstat(fd).st_size
            # An empty file cannot be mapped; its chunks (all empty) read nothing.
            self._mappings[name] = mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else None
            self._sizes[name] = size
        finally:
            os.close(fd)  # the mapping keeps the file

    def _check_chunk_ranges(self, metadata: Metadata) -> None:
        ranges: Dict[str, list] = {}
        for entry in metadata.tensors():
            for chunk in entry.chunks:
                if chunk.length == 0:
                    continue  # reads nothing; may sit past the file's end
                size = self._sizes[chunk.file]
                if chunk.offset > size or chunk.length > size - chunk.offset:
                    raise CorruptionError(
                        f"checkpoint '{self.directory}': entry '{entry.fqn}': data file '{chunk.file}' is truncated: "
                        f"it has {size} bytes, the chunk needs bytes {chunk.offset} to {chunk.offset + chunk.length}",
                        entry=entry.fqn, file=self.path_of(chunk.file), offset=size)
                ranges.setdefault(chunk.file, []).append((chunk.offset, chunk.offset + chunk.length, entry.fqn))
        for name, spans in ranges.items():
            spans.sort()
            for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
                if begin < end:
                    raise CorruptionError(
                        f"checkpoint '{self.directory}': entries '{first}' and '{second}': their chunks overlap in "
                        f"data file '{name}' at byte {begin}", entry=second, file=self.path_of(name), offset=begin)

    def verified_bytes(self, entry: TensorEntry, chunk: Chunk, begin: int = 0, end: Optional[int] = None) -> memoryview:
        """The chunk's bytes [begin, end) (default: all of them) as a writable view of the
        copy-on-write mapping, after verifying the checksum blocks the range touches (the
        whole chunk against xxh3 when it has no block checksums, or the range is all of it).
        Raises CorruptionError naming the entry, the file and the offset of a mismatch."""
        end = chunk.length if end is None else end
        if chunk.length == 0 or begin == end:
            return memoryview(b"")
        chunk_bytes = memoryview(self._mappings[chunk.file])[chunk.offset:chunk.offset + chunk.length]
        if chunk.block_xxh3 and (begin, end) != (0, chunk.length):
            for block in range(begin // CHECKSUM_BLOCK_BYTES, (end - 1) // CHECKSUM_BLOCK_BYTES + 1):
                start = block * CHECKSUM_BLOCK_BYTES
                self._verify(entry, chunk, chunk_bytes, start, min(start + CHECKSUM_BLOCK_BYTES, chunk.length),
                             chunk.block_xxh3[block], block)
        else:
            self._verify(entry, chunk, chunk_bytes, 0, chunk.length, chunk.xxh3, -1)
        return chunk_bytes[begin:end]

    def _verify(self, entry: TensorEntry, chunk: Chunk, chunk_bytes: memoryview, begin: int, end: int,
                expected: int, block: int) -> None:
        key = (chunk.file, chunk.offset, block)
        if key in self._verified or (chunk.file, chunk.offset, -1) in self._verified:
            return
        actual = xxh3(chunk_bytes[begin:end])
        if actual != expected:
            offset = chunk.offset + begin
            raise CorruptionError(
                f"checkpoint '{self.directory}': entry '{entry.fqn}': data file '{chunk.file}' is corrupt: the bytes "
                f"at offset {offset} ({end - begin} bytes) have checksum {hash_hex(actual)}, expected "
                f"{hash_hex(expected)}", entry=entry.fqn, file=self.path_of(chunk.file), offset=offset)
        self._verified.add(key)
