"""The metadata reader: nlohmann's canonical JSON reproduced exactly (metadata_xxh3 of
real C++-written files), and the C++ reader's hostile-metadata cases
(tests/dcp/safety_test.cpp, format_version_test.cpp) rejected before any data is read."""

import json
import math
import os
import pathlib
import shutil
import struct

import pytest

import stowage
from stowage import canonical_json
from stowage.checksum import hash_hex, xxh3
from stowage.metadata import METADATA_FILE_NAME, document_checksum

HERE = pathlib.Path(__file__).resolve().parent
REPOSITORY = HERE.parents[1]
CPP_WRITTEN_METADATA = [
    REPOSITORY / "tests" / "dcp" / "fixtures" / "version1" / METADATA_FILE_NAME,
    REPOSITORY / "tests" / "dcp" / "fixtures" / "version2" / METADATA_FILE_NAME,
    *sorted((REPOSITORY / "fuzz" / "corpus" / "metadata").glob("seed-*.json")),
]


def nlohmann_doubles():
    for line in (HERE / "data" / "nlohmann_doubles.txt").read_text().splitlines():
        if not line.startswith("#"):
            bits, text = line.split()
            yield struct.unpack(">d", bytes.fromhex(bits))[0], text


def test_doubles_are_written_as_nlohmann_writes_them():
    # Among them 150 where Grisu2's digits are not the shortest, which repr() writes.
    cases = list(nlohmann_doubles())
    assert len(cases) >= 300
    for value, text in cases:
        assert canonical_json.format_float(value) == text, repr(value)
        assert canonical_json.format_float(-value) == ("-" + text if not text.startswith("-") else text[1:])


def test_strings_and_containers_are_written_compactly_with_sorted_keys():
    document = {"b": [1, -2, 0.5, True, None], "a": "\"\\/\b\f\n\r\t\x01\x1f\x7f \u00e9 \U0001F40D", "\u00e9": {}}
    assert canonical_json.dump(document) == (
        '{"a":"\\"\\\\/\\b\\f\\n\\r\\t\\u0001\\u001f\x7f \u00e9 \U0001F40D","b":[1,-2,0.5,true,null],"\u00e9":{}}')


def test_numbers_have_the_types_nlohmanns_parser_gives_them():
    parsed = canonical_json.parse(b'[18446744073709551615, 18446744073709551616, -9223372036854775809, 1E2, -0]')
    assert canonical_json.dump(parsed) == "[18446744073709551615,1.8446744073709552e+19,-9.223372036854776e+18,100.0,0]"


@pytest.mark.parametrize("text", [b'{"a": NaN}', b'[Infinity]', b'[1e400]', b'["\\ud800"]', b'["\xff"]', b'[1,]'])
def test_what_nlohmanns_parser_rejects_is_rejected(text):
    with pytest.raises(ValueError):
        canonical_json.parse(text)


@pytest.mark.parametrize("path", CPP_WRITTEN_METADATA, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_metadata_written_by_cpp_hashes_to_its_metadata_xxh3(path):
    document = json.loads(path.read_bytes())
    assert document_checksum(document) == document["metadata_xxh3"]
    stowage.metadata.parse_metadata(path.read_bytes(), str(path))


def test_metadata_of_every_value_kind_hashes_to_its_metadata_xxh3(single_checkpoint, sharded_checkpoint):
    # Non-ASCII keys, control characters, extreme doubles, 64-bit integers, exact paths.
    for checkpoint in (single_checkpoint, sharded_checkpoint):
        data = (checkpoint / METADATA_FILE_NAME).read_bytes()
        assert stowage.metadata.parse_metadata(data, "m").version == 3
        assert document_checksum(canonical_json.parse(data)) == json.loads(data)["metadata_xxh3"]


def test_layout_does_not_change_the_hash(copy_of, single_checkpoint):
    checkpoint = copy_of(single_checkpoint)
    path = checkpoint / METADATA_FILE_NAME
    document = json.loads(path.read_bytes())
    path.write_text(json.dumps(dict(reversed(list(document.items()))), indent=3, ensure_ascii=True))
    assert stowage.read_metadata(checkpoint).version == 3


# ------------------------------------------------------------ hostile metadata

def rejected(checkpoint, error_type=stowage.FormatError, by_metadata=True):
    """The error loading `checkpoint` raises; with `by_metadata`, reading its metadata
    alone raises one too."""
    if by_metadata:
        with pytest.raises(error_type):
            stowage.read_metadata(checkpoint)
    with pytest.raises(error_type) as raised:
        stowage.load_checkpoint(checkpoint)
    return raised.value


def replaced(checkpoint, old: str, new: str) -> None:
    path = checkpoint / METADATA_FILE_NAME
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def rehashed(checkpoint, edit) -> None:
    """Applies `edit` to the parsed metadata and writes it back with a matching
    metadata_xxh3: for damage that only the checks after the hash can see."""
    path = checkpoint / METADATA_FILE_NAME
    document = json.loads(path.read_bytes())
    edit(document)
    document["metadata_xxh3"] = document_checksum(document)
    path.write_text(json.dumps(document, separators=(",", ":"), ensure_ascii=False))


@pytest.fixture
def v3(tmp_path):
    """A version-3 checkpoint of one tensor 'w' (fuzz seed 0's layout), with its data."""
    checkpoint = tmp_path / "w"
    checkpoint.mkdir()
    (checkpoint / "a.data").write_bytes(struct.pack("<6f", *range(6)))
    shutil.copy(REPOSITORY / "fuzz" / "corpus" / "metadata" / "seed-0.json", checkpoint / METADATA_FILE_NAME)
    data_hash = hash_hex(xxh3((checkpoint / "a.data").read_bytes()))
    rehashed(checkpoint, lambda d: d["entries"][0][4][0].__setitem__(2, data_hash))  # the chunk's hash: ours
    return checkpoint


def test_the_v3_fixture_loads(v3):
    assert stowage.load_checkpoint(v3)["w"].tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize("old, new, message", [
    ('[[0,0,"', '[[5,0,"', "file index 5 is not below the 1 files"),
    ('["t","w"', '["x","w"', "unknown kind 'x'"),
    (',0,[]]]]', ',0]]]', "a chunk must be a list of 5 or 7 fields"),
    (',0,[]]]]', ',0,["0123456789abcdef"]]]]', "must list 0 block checksums"),
    (',0,[]]]]', ',0,[],[0,0],[2,4]]]]', "leaves the tensor"),
    (',0,[]]]]', ',0,[],[0,0],[1,3]]]]', "the chunks cover 3 of 6 elements"),
    ('"files":["', '"files":["../', "would leave the checkpoint directory"),
    ('"files":["a.data"', '"files":["/etc/passwd"', "would leave the checkpoint directory"),
    ('"files":["a.data"', '"files":[".."', "would leave the checkpoint directory"),
    ('"Float"', '"Pickle"', "unknown dtype 'Pickle'"),
    ('[2,3]', '[2,-3]', "negative size"),
    ('[[0,0,"', '[[0,-64,"', "must not be negative"),
    ('[[0,0,"', '[[0,true,"', "must be an integer"),
    ('[[0,0,"', '[[0,9223372036854775808,"', "out of range"),
    ('"t","w"', '"t",["w",-1]', "only keys and list indices"),
    ('"t","w"', '"t",[0]', "must start with a key"),
    ('{"t":"int","v":3}', '{"t":"int","v":"3"}', "malformed value of type 'int'"),
    ('{"t":"int","v":3}', '{"t":"list","elem":"int","v":[{"t":"double","v":1.5}]}', "list of int holds a float"),
    ('["v","step"', '["v","w"', "lists entry 'w' twice"),
])
def test_malformed_version_three_tables_are_rejected_naming_the_entry(v3, old, new, message):
    replaced(v3, old, new)
    error = rejected(v3, stowage.FormatError)
    assert message in str(error)
    assert error.file == str(v3 / METADATA_FILE_NAME)


@pytest.mark.parametrize("old, new, message", [
    ('"length": 16', '"length": 4096', "cannot be 4096 bytes"),
    ('"file": "a.data"', '"file": "../a.data"', "would leave the checkpoint directory"),
    ("0.999", "0.5", "checksum"),
    ('"path": [\n    "opt",\n    "bias"', '"path": [\n    "opt",\n    "bia"', "its path does not match its name"),
    ('"kind": "tensor"', '"kind": "pickle"', "unknown kind 'pickle'"),
])
def test_older_versions_are_still_validated(copy_of, old, new, message):
    checkpoint = copy_of(REPOSITORY / "tests" / "dcp" / "fixtures" / "version2")
    replaced(checkpoint, old, new)
    assert message in str(rejected(checkpoint, stowage.FormatError))


def test_a_version_one_checkpoint_needs_no_metadata_hash_but_checks_one_it_has(copy_of):
    checkpoint = copy_of(REPOSITORY / "tests" / "dcp" / "fixtures" / "version1")
    replaced(checkpoint, '"metadata_xxh3": "0fb7c3dbaaf4491c",', "")
    assert stowage.load_checkpoint(checkpoint)["opt"]["lr"] == 0.5
    replaced(checkpoint, '"v": 0.5', '"v": 0.25')
    assert stowage.load_checkpoint(checkpoint)["opt"]["lr"] == 0.25
    replaced(checkpoint, '"format"', '"metadata_xxh3": "0fb7c3dbaaf4491c", "format"')
    assert "checksum" in str(rejected(checkpoint, stowage.FormatError))


def test_unknown_versions_and_foreign_documents_are_refused(v3):
    replaced(v3, '"version":3', '"version":99')
    error = rejected(v3, stowage.UnsupportedVersionError)
    assert "version 99" in str(error) and error.version == 99
    replaced(v3, '"stowage.dcp"', '"torch.dcp"')
    assert "not a stowage.dcp checkpoint" in str(rejected(v3, stowage.FormatError))


def test_broken_json_and_a_missing_metadata_file_are_clear_errors(v3):
    path = v3 / METADATA_FILE_NAME
    text = path.read_bytes()
    path.write_bytes(text[:len(text) // 2])
    assert "not valid JSON" in str(rejected(v3, stowage.FormatError))
    path.write_bytes(text.replace(b'"w"', b'"\xff"'))
    assert "not valid JSON" in str(rejected(v3, stowage.FormatError))
    path.unlink()
    with pytest.raises(stowage.NoCheckpointError, match="holds no checkpoint"):
        stowage.load_checkpoint(v3)


def test_metadata_that_is_not_a_regular_file_is_refused_without_opening_it(v3):
    path = v3 / METADATA_FILE_NAME
    path.unlink()
    os.mkfifo(path)  # opening it would block until a writer came
    with pytest.raises(stowage.CorruptionError, match="FIFO"):
        stowage.load_checkpoint(v3)


def test_chunks_beyond_their_file_or_sharing_bytes_are_refused_before_reading(single_checkpoint, copy_of):
    checkpoint = copy_of(single_checkpoint)
    first_file = json.loads((checkpoint / METADATA_FILE_NAME).read_bytes())["files"][0]
    size = (checkpoint / first_file).stat().st_size

    def chunks_in_first_file(document):
        return [chunk for entry in document["entries"] if entry[0] == "t" for chunk in entry[4]
                if chunk[0] == 0 and (len(chunk) == 5 or math.prod(chunk[6]))]

    rehashed(checkpoint, lambda d: chunks_in_first_file(d)[-1].__setitem__(1, size))
    error = rejected(checkpoint, stowage.CorruptionError, by_metadata=False)
    assert "is truncated" in str(error) and error.file == str(checkpoint / first_file)
    rehashed(checkpoint, lambda d: [c.__setitem__(1, 0) for c in chunks_in_first_file(d)])
    assert "overlap" in str(rejected(checkpoint, stowage.CorruptionError, by_metadata=False))


@pytest.mark.parametrize("paths, message", [
    ([["l", 0], ["l", 2]], "has indices [0, 2]"),
    ([["l", 0], "l.x"], "mixes list indices and dict keys"),
    (["a", "a.b"], "both a value and a container"),
])
def test_paths_that_make_no_tree_are_rejected(v3, paths, message):
    def values_at(document):
        document["entries"] = [["v", path, {"t": "int", "v": i}] for i, path in enumerate(paths)]
    rehashed(v3, values_at)
    assert message in str(rejected(v3, by_metadata=False))


def test_list_indices_in_paths_make_python_lists(v3):
    rehashed(v3, lambda d: d["entries"].extend([["v", ["l", 1], {"t": "str", "v": "b"}],
                                                ["v", ["l", 0], {"t": "str", "v": "a"}]]))
    assert stowage.load_checkpoint(v3)["l"] == ["a", "b"]
