"""`stowage ckpt export --format safetensors` and `stowage ckpt import`, read and written
by the real safetensors package, as Hugging Face tooling reads and writes such files."""

import json
import pathlib
import subprocess

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import stowage
from conftest import run_checked
from interop import assert_same, deterministic_tensor, expected_sharded_state


def run_checked_failure(command) -> subprocess.CompletedProcess:
    """Runs `command`, failing the test if it succeeds."""
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True)
    assert result.returncode != 0, f"{command} succeeded:\n{result.stdout}"
    return result


def flat(state: dict, prefix: str = "") -> dict:
    """Tensors of a nested dict by dotted name (what a checkpoint's fqns are)."""
    out = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        elif isinstance(value, torch.Tensor):
            out[f"{prefix}{key}"] = value
    return out


def load_like_transformers(path: pathlib.Path) -> dict:
    """A single file, or the shards an index names, merged (transformers' sharded load)."""
    if path.suffix != ".json":
        return load_file(path)
    index = json.loads(path.read_text())
    state = {}
    for shard in sorted(set(index["weight_map"].values())):
        state.update(load_file(path.parent / shard))
    assert sorted(state) == sorted(index["weight_map"])
    return state


def test_a_sharded_checkpoint_exports_bit_exact_with_its_values(stowage_cli, sharded_checkpoint, tmp_path):
    out = tmp_path / "model.safetensors"
    run_checked([stowage_cli, "ckpt", "export", sharded_checkpoint, "--format", "safetensors", "--out", out])
    expected = flat(expected_sharded_state())
    loaded = load_file(out)
    assert sorted(loaded) == sorted(expected)
    for name, tensor in expected.items():
        assert_same(loaded[name], tensor, name)
    with safe_open(out, framework="pt") as f:
        metadata = f.metadata()
    assert metadata["format"] == "pt"
    assert json.loads(metadata["stowage.values"]) == {"step": {"t": "int", "v": 42}}


def test_a_prefix_in_shards_loads_into_a_module_as_transformers_would(stowage_cli, sharded_checkpoint, tmp_path):
    out = tmp_path / "model.safetensors"
    result = run_checked([stowage_cli, "ckpt", "export", sharded_checkpoint, "--out", out, "--prefix", "model.",
                          "--max-shard-size", "200KB", "--json"])
    report = json.loads(result.stdout)
    index = tmp_path / "model.safetensors.index.json"
    assert report["files"][-1] == str(index)
    assert not out.exists()
    weight_map = json.loads(index.read_text())["weight_map"]
    assert len(set(weight_map.values())) == len(report["files"]) - 1 >= 2
    loaded = load_like_transformers(index)
    expected = flat(expected_sharded_state()["model"])
    assert json.loads(index.read_text())["metadata"]["total_size"] == sum(t.nbytes for t in expected.values())

    layer = torch.nn.Linear(11, 6, bias=True)
    layer.load_state_dict({"weight": loaded["layer.weight"].t(), "bias": loaded["layer.bias"]})
    for name, tensor in expected.items():
        assert_same(loaded[name], tensor, name)


def test_a_dtype_safetensors_lacks_fails_naming_the_entry_and_writes_nothing(stowage_cli, single_checkpoint,
                                                                          tmp_path):
    out = tmp_path / "model.safetensors"
    result = run_checked_failure([stowage_cli, "ckpt", "export", single_checkpoint, "--out", out])
    assert "tensors.dtypes.ComplexHalf" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_to_replace_a_file_unless_overwrite(stowage_cli, sharded_checkpoint, tmp_path):
    out = tmp_path / "model.safetensors"
    out.write_bytes(b"keep")
    result = run_checked_failure([stowage_cli, "ckpt", "export", sharded_checkpoint, "--out", out])
    assert str(out) in result.stderr
    assert out.read_bytes() == b"keep"
    run_checked([stowage_cli, "ckpt", "export", sharded_checkpoint, "--out", out, "--overwrite"])
    assert sorted(load_file(out)) == sorted(flat(expected_sharded_state()))


def safetensors_state() -> dict:
    """Every dtype a checkpoint and safetensors share, a 0-dim and an empty tensor."""
    dtypes = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.bfloat16, torch.float32, torch.float64, torch.complex64]
    state = {f"dtypes.{str(d).removeprefix('torch.')}": deterministic_tensor((3, 5), d) for d in dtypes}
    state["scalar"] = deterministic_tensor((), torch.float32)
    state["empty"] = deterministic_tensor((0, 7), torch.float16)
    return state


def test_files_saved_by_safetensors_import_bit_exact(stowage_cli, tmp_path):
    state = safetensors_state()
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    run_checked([stowage_cli, "ckpt", "import", tmp_path / "model.safetensors", "--out", tmp_path / "ckpt"])
    loaded = stowage.load_checkpoint(tmp_path / "ckpt")
    assert sorted(loaded) == sorted(state)
    for name, tensor in state.items():
        assert_same(loaded[name], tensor, name)


def test_shards_and_an_index_as_hugging_face_writes_them_import(stowage_cli, tmp_path):
    state = safetensors_state()
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[:5], "model-00002-of-00002.safetensors": names[5:]}
    for shard, members in shards.items():
        save_file({name: state[name] for name in members}, tmp_path / shard, metadata={"format": "pt"})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({
        "metadata": {"total_size": sum(t.nbytes for t in state.values())},
        "weight_map": {name: shard for shard, members in shards.items() for name in members}}))
    result = run_checked([stowage_cli, "ckpt", "import", index, "--out", tmp_path / "ckpt", "--json"])
    assert json.loads(result.stdout)["tensors"] == len(state)
    loaded = stowage.load_checkpoint(tmp_path / "ckpt")
    for name, tensor in state.items():
        assert_same(loaded[name], tensor, name)


def test_export_then_import_keeps_tensors_and_values(stowage_cli, sharded_checkpoint, tmp_path):
    out = tmp_path / "model.safetensors"
    run_checked([stowage_cli, "ckpt", "export", sharded_checkpoint, "--out", out])
    run_checked([stowage_cli, "ckpt", "import", out, "--out", tmp_path / "ckpt"])
    loaded = stowage.load_checkpoint(tmp_path / "ckpt")
    expected = dict(flat(expected_sharded_state()), step=42)
    assert sorted(loaded) == sorted(expected)
    for name, value in expected.items():
        assert_same(loaded[name], value, name)


def test_import_then_export_gives_back_the_very_bytes_safetensors_wrote(stowage_cli, tmp_path):
    # Both order tensors by element size, then name, and pad the header alike.
    state = safetensors_state()
    save_file(state, tmp_path / "original.safetensors", metadata={"format": "pt"})
    run_checked([stowage_cli, "ckpt", "import", tmp_path / "original.safetensors", "--out", tmp_path / "ckpt"])
    run_checked([stowage_cli, "ckpt", "export", tmp_path / "ckpt", "--out", tmp_path / "again.safetensors"])
    assert (tmp_path / "again.safetensors").read_bytes() == (tmp_path / "original.safetensors").read_bytes()


def test_a_tampered_file_is_refused_naming_it(stowage_cli, tmp_path):
    save_file({"a": torch.ones(4), "b": torch.zeros(2)}, tmp_path / "model.safetensors")
    data = bytearray((tmp_path / "model.safetensors").read_bytes())
    # One more byte of data than the header accounts for.
    (tmp_path / "model.safetensors").write_bytes(bytes(data) + b"\0")
    result = run_checked_failure([stowage_cli, "ckpt", "import", tmp_path / "model.safetensors", "--out",
                                  tmp_path / "ckpt"])
    assert "model.safetensors" in result.stderr
    assert not (tmp_path / "ckpt").exists()
