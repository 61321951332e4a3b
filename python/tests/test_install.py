"""`pip install ./python` gives a package that works from where it is installed."""

import pathlib
import shutil
import sys

from conftest import run_checked

PYTHON_DIR = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = PYTHON_DIR.parent / "tests" / "dcp" / "fixtures" / "version2"


def test_pip_installs_the_package_and_it_imports_from_there(tmp_path):
    target = tmp_path / "site"
    # From a copy: setuptools writes build/ and *.egg-info beside the sources.
    source = shutil.copytree(PYTHON_DIR, tmp_path / "source", ignore=shutil.ignore_patterns("tests", "__pycache__"))
    # With build isolation pip gets setuptools from PyPI (or its cache), as a user's
    # `pip install ./python` does; the environment need not have setuptools and wheel.
    run_checked([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", target, source],
                timeout=300)
    probe = ("import stowage, sys; assert stowage.__file__.startswith(sys.argv[1]), stowage.__file__; "
             "print(stowage.load_checkpoint(sys.argv[2])['opt']['name'])")
    result = run_checked([sys.executable, "-c", probe, target, FIXTURE], cwd=tmp_path,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})
    assert result.stdout.strip() == "adam"
