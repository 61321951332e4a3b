#!/usr/bin/env python3
"""The include rules of docs/ARCHITECTURE.md, checked over the tree.

Each file of src/<module>/ and include/stowage/<module>/ may include stowage's headers
only from its own module and the modules its rule lists; src/dcp/format and
src/dcp/storage are layers of their own, and dcp's public headers (<stowage/dcp/...>,
"dcp-api") are open to the layers below dcp's coordination, its private ones ("dcp/...")
are not. Prints each include that breaks a rule and exits 1, or how many files it checked
and exits 0.

    python3 tests/layout/check_layers.py [REPO]
"""
import pathlib
import re
import sys

TOP = {"error.h", "build_info.h", "version.h"}  # include/stowage/*.h besides the umbrella
# What each layer may include besides itself and the headers in TOP.
RULES = {
    "util": set(),
    "memory": {"util"},
    "state": {"memory", "util"},
    "dist": {"util"},
    "activation": {"memory"},
    "sim": set(),
    "dcp-api": {"state", "dist", "memory"},
    "dcp/format": {"dcp-api", "util"},
    "dcp/storage": {"dcp-api", "dcp/format", "memory", "util"},
    "dcp": {"dcp-api", "dcp/format", "dcp/storage", "state", "dist", "memory", "util"},
    "interop": {"dcp-api", "dcp/format", "dcp/storage", "util"},
    "optim": {"dist", "memory", "state", "util"},
    "train": {"dcp-api", "dist", "optim", "activation", "state", "memory", "util"},
}
MODULES = {"util", "memory", "state", "dist", "activation", "sim", "dcp", "interop", "optim", "train"}
# The old public paths of the interop headers, which forward to them for one release.
FORWARDERS = {"include/stowage/dcp/torch_dcp_reader.h", "include/stowage/dcp/safetensors.h"}


def layer_of_file(path):
    parts = path.parts
    if parts[0] == "src" and len(parts) > 2:
        if parts[1] == "dcp" and len(parts) > 3 and parts[2] in ("format", "storage"):
            return "dcp/" + parts[2]
        return parts[1]
    if parts[0] == "include" and len(parts) > 3:
        return "dcp-api" if parts[2] == "dcp" else parts[2]
    return None  # src/pch.h, the umbrella headers


def layer_of_include(name, quoted):
    parts = name.split("/")
    if not quoted:
        if parts[0] != "stowage":
            return None
        if len(parts) == 2:
            return "top" if parts[1] in TOP else "umbrella"
        return "dcp-api" if parts[1] == "dcp" else parts[1]
    if len(parts) < 2 or parts[0] not in MODULES:
        return None  # the file's own folder's, or no stowage header
    if parts[0] == "dcp" and len(parts) > 2 and parts[1] in ("format", "storage"):
        return "dcp/" + parts[1]
    return parts[0]


def main():
    repo = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    broken = []
    files = sorted(p for d in ("src", "include") for p in (repo / d).rglob("*") if p.suffix in (".h", ".cpp"))
    for file in files:
        relative = file.relative_to(repo)
        layer = layer_of_file(relative)
        if layer is None:
            continue
        allowed = RULES[layer] | {layer, "top"}
        for number, line in enumerate(file.read_text().splitlines(), 1):
            match = re.match(r'\s*#\s*include\s*([<"])([^>"]+)[>"]', line)
            if not match:
                continue
            target = layer_of_include(match.group(2), match.group(1) == '"')
            if target is None or target in allowed:
                continue
            if str(relative) in FORWARDERS and target == "interop":
                continue
            broken.append(f"{relative}:{number}: {layer} may not include {match.group(2)} ({target})")
    for line in broken:
        print(line)
    if broken:
        print(f"{len(broken)} includes break the rules of docs/ARCHITECTURE.md")
        return 1
    print(f"{len(files)} files follow the include rules of docs/ARCHITECTURE.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
