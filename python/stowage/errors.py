"""The errors a load raises, mirroring the C++ library's (include/stowage/error.h).

A caller tells a damaged checkpoint (CorruptionError: restore another one) from one this
reader cannot judge (UnsupportedVersionError: upgrade the reader) from a path holding no
checkpoint at all (NoCheckpointError), and every error names the culprit: the entry, the
file and, for data, the byte offset.
"""

from typing import Optional


class StowageError(Exception):
    """Base class of every error this package raises."""


class NoCheckpointError(StowageError, FileNotFoundError):
    """The directory holds no committed checkpoint (no .metadata.json)."""


class CorruptionError(StowageError):
    """Stored bytes are not what the writer wrote: a checksum mismatch, a truncated,
    missing or replaced data file, or metadata that breaks the format.

    Attributes: entry (the fqn, or None when the damage is not an entry's), file (the
    path of the file at fault), offset (the byte offset in it, or None).
    """

    def __init__(self, message: str, entry: Optional[str] = None, file: Optional[str] = None,
                 offset: Optional[int] = None):
        super().__init__(message)
        self.entry = entry
        self.file = file
        self.offset = offset


class FormatError(CorruptionError):
    """The metadata does not follow docs/FORMAT.md: malformed JSON, a missing or
    ill-typed field, an unknown dtype, an unsafe file name, chunks that do not tile their
    tensor, or a metadata_xxh3 its content does not hash to. `file` is the metadata's path.
    """


class UnsupportedVersionError(StowageError):
    """The metadata has a format version this reader does not read (it reads 1 to 3).
    Not a CorruptionError: a newer writer's checkpoint may be intact."""

    def __init__(self, message: str, version: int, file: str):
        super().__init__(message)
        self.version = version
        self.file = file
