"""Opening a checkpoint directory: its metadata validated, its data files opened."""

import os
from typing import Union

from .data_files import DataFiles, read_regular_file
from .errors import CorruptionError, NoCheckpointError
from .metadata import METADATA_FILE_NAME, Metadata, parse_metadata

# A save replaces a checkpoint's data files after committing its metadata; a reader that
# finds a file gone under metadata that changed meanwhile reads the new checkpoint.
_MAX_ATTEMPTS = 100


def read_metadata(directory: Union[str, os.PathLike]) -> Metadata:
    """The validated metadata of the checkpoint in `directory`, without opening its data.
    Raises NoCheckpointError, FormatError, UnsupportedVersionError or CorruptionError."""
    directory = os.fspath(directory)
    path = os.path.join(directory, METADATA_FILE_NAME)
    try:
        data = read_regular_file(path)
    except FileNotFoundError:
        raise NoCheckpointError(f"'{directory}' holds no checkpoint: its metadata file {METADATA_FILE_NAME} "
                                "is missing") from None
    return parse_metadata(data, path)


class Checkpoint:
    """A checkpoint opened for reading: `metadata`, and `files` to read verified bytes from.

    Once open, its files stay readable whatever happens to their names (an overwrite by a
    later save deletes them), so a reader sees one whole checkpoint.
    """

    def __init__(self, directory: Union[str, os.PathLike]):
        self.directory = os.fspath(directory)
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            self.metadata = read_metadata(self.directory)
            try:
                self.files = DataFiles(self.directory, self.metadata)
                return
            except CorruptionError as error:
                if attempt == _MAX_ATTEMPTS or not self._replaced_since() or os.path.lexists(error.file or ""):
                    raise

    def _replaced_since(self) -> bool:
        try:
            return read_metadata(self.directory).save_id != self.metadata.save_id
        except (NoCheckpointError, CorruptionError):
            return False
