"""Fixtures shared by the Python package's tests: where the C++ programs are, and the
checkpoints they write (made once per session, copied before a test damages one)."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

PYTHON_DIR = pathlib.Path(__file__).resolve().parents[1]
REPOSITORY = PYTHON_DIR.parent
# The package under test is this checkout's, not an installed one.
sys.path.insert(0, str(PYTHON_DIR))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


def _program(variable: str, default: pathlib.Path) -> pathlib.Path:
    """A C++ program: the path in `variable` (ctest sets it; a missing file then fails
    the test), else the default build's (its absence skips the test)."""
    if os.environ.get(variable):
        path = pathlib.Path(os.environ[variable])
        if not path.is_file():
            pytest.fail(f"{variable}={path}: no such program (build it first)")
        return path
    if not default.is_file():
        pytest.skip(f"{default} is not built (or set {variable})")
    return default


@pytest.fixture(scope="session")
def stowage_cli() -> pathlib.Path:
    """The `stowage` command-line tool (target stowage_cli)."""
    return _program("STOWAGE_CLI", REPOSITORY / "build" / "stowage")


@pytest.fixture(scope="session")
def interop_writer() -> pathlib.Path:
    """tests/interop/write_checkpoint.cpp (target interop_write_checkpoint)."""
    return _program("STOWAGE_INTEROP_WRITER", REPOSITORY / "build" / "tests" / "interop" / "interop_write_checkpoint")


@pytest.fixture(scope="session")
def interop_model_loss() -> pathlib.Path:
    """tests/interop/model_loss.cpp (target interop_model_loss)."""
    return _program("STOWAGE_INTEROP_MODEL_LOSS", REPOSITORY / "build" / "tests" / "interop" / "interop_model_loss")


def run_checked(command, **kwargs) -> subprocess.CompletedProcess:
    """Runs `command`, failing the test with its output when it fails."""
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{command} exited with {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="session")
def single_checkpoint(interop_writer, tmp_path_factory) -> pathlib.Path:
    """A checkpoint of `interop_write_checkpoint single` (interop.expected_single_state())."""
    path = tmp_path_factory.mktemp("single") / "checkpoint"
    run_checked([interop_writer, "single", path])
    return path


@pytest.fixture(scope="session")
def per_chunk_checkpoint(interop_writer, tmp_path_factory) -> pathlib.Path:
    """The same state saved with one data file per chunk."""
    path = tmp_path_factory.mktemp("per_chunk") / "checkpoint"
    run_checked([interop_writer, "single-per-chunk", path])
    return path


@pytest.fixture(scope="session")
def sharded_checkpoint(interop_writer, stowage_cli, tmp_path_factory) -> pathlib.Path:
    """A checkpoint 2 ranks saved in shards (interop.expected_sharded_state())."""
    path = tmp_path_factory.mktemp("sharded") / "checkpoint"
    run_checked([stowage_cli, "launch", "--nproc", "2", "--", interop_writer, "sharded", path], timeout=300)
    return path


@pytest.fixture
def copy_of(tmp_path):
    """copy_of(checkpoint) -> a copy in this test's directory, to damage."""
    def copy(checkpoint: pathlib.Path) -> pathlib.Path:
        return pathlib.Path(shutil.copytree(checkpoint, tmp_path / checkpoint.parent.name))
    return copy
