#!/usr/bin/env python3
"""The include rules of docs/ARCHITECTURE.md, checked over the tree.

Each file of src/<module>/ and include/stowage/<module>/ may include stowage's headers
only from its own module and the modules its rule lists; src/dcp/format and
src/dcp/storage are layers of their own, and dcp's public headers (<stowage/dcp/...>,
"dcp-api") are open to the layers below dcp's coordination, its private ones ("dcp/...")
are not. A public header includes only public headers.

An include is judged by the file it names, found as the compiler finds it (a quoted name
next to the including file first, then under include/ and src/, the library's include
directories), so that "../dcp/format/codec.h" or <dcp/format/codec.h> is the private
header it is; a name that climbs out of src/ and include/ breaks the rules, and so does
an include the check cannot read (a macro), a file in a folder without a rule, and every
spelling of the directive (continued lines, #include_next, #import).

The programs follow rules of their own: the tool (tools/) may include its own headers,
cli/ (what the two programs share) and stowage's public headers, never bench/; cli/ only
itself and the public headers; the benchmarks (bench/) bench/lib, cli/ (bench/cli only) and
the public headers, never tools/; and none of them a private header of src/. Their includes are found as their compilers find them: a quoted
name next to the including file first, then under PROGRAM_ROOTS.

The tests follow one rule of their own: a test signals a process only through
tests/cli/child_signal.h, which refuses a pid that names a group or every process and any
process the test did not start, so a raw kill(2) (killpg, tgkill, sigqueue) anywhere else
under tests/ is reported too.

And no code of the project calls at::parallel_for or at::parallel_reduce: their OpenMP
region is compiled into the caller, and the project compiles without -fopenmp, where it runs
serially; util::parallel_over_elements splits over ATen's threads inside LibTorch.

Prints each include or signal call that breaks a rule and exits 1, or how many files it checked and
exits 0. Every run first checks itself on a temporary tree with a violation of each kind
planted (exit 2 if one goes unreported or a clean include is reported);
--self-test runs only that.

    python3 tests/layout/check_layers.py [REPO]
    python3 tests/layout/check_layers.py --self-test
"""
import os
import pathlib
import re
import sys
import tempfile

TOP = {"error.h", "build_info.h", "byte_count.h", "version.h"}  # include/stowage/*.h besides the umbrella
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
    "optim": {"dcp-api", "dist", "memory", "state", "util"},
    "train": {"dcp-api", "dist", "optim", "activation", "state", "memory", "util"},
}
MODULES = {"util", "memory", "state", "dist", "activation", "sim", "dcp", "interop", "optim", "train"}
# The old public paths of the interop headers, which forward to them for one release.
FORWARDERS = {"include/stowage/dcp/torch_dcp_reader.h", "include/stowage/dcp/safetensors.h"}
SOURCE_SUFFIXES = {".h", ".hh", ".hpp", ".hxx", ".inc", ".inl", ".ipp", ".tpp", ".c", ".cc", ".cpp", ".cxx", ".cu",
                   ".cuh"}
# What each program folder may include besides stowage's public headers (docs/ARCHITECTURE.md):
# the tool, what the programs share (cli/), the benchmarks' program, their library, and the
# thin executables of one benchmark each (bench/<name>.cpp).
PROGRAM_RULES = {
    "tools": {"tools", "cli"},
    "cli": {"cli"},
    "bench/cli": {"bench/cli", "bench/lib", "cli"},
    "bench/lib": {"bench/lib"},
    "bench": {"bench/lib"},
}
# The programs' include directories, as their targets name them after a quoted name's own folder.
PROGRAM_ROOTS = ("include", "cli", "bench/lib", "bench/cli", "tools/stowage", "src")
# The one file of tests/ that may call kill(2).
SIGNAL_HELPER = "tests/cli/child_signal.h"
RAW_SIGNAL = re.compile(r"(?<![\w.>])(?:::\s*)?(kill|killpg|tgkill|tkill|sigqueue)\s*\(")
# ATen's splits whose OpenMP region runs serially in code built without -fopenmp.
SERIAL_SPLIT = re.compile(r"(?<![\w.>])(?:::\s*)?at\s*::\s*(parallel_for|parallel_reduce)\b")
SPLIT_FOLDERS = ("src", "include", "tools", "bench", "tests", "examples", "fuzz")
# The library's include directories, in the compiler's order after a quoted name's own folder.
INCLUDE_ROOTS = ("include", "src")
DIRECTIVE = re.compile(r"\s*#\s*(include_next|include|import)\b\s*(.*)")
OUTSIDE = "outside"  # a path out of src/ and include/


def layer_of_path(parts):
    """The layer of a file at repo-relative `parts`: a module, "dcp-api", "top",
    "umbrella", "pch" (src/pch.h) or OUTSIDE."""
    if len(parts) >= 2 and parts[0] == "src":
        if len(parts) == 2:
            return "pch" if parts[1] == "pch.h" else OUTSIDE
        if parts[1] == "dcp" and len(parts) > 3 and parts[2] in ("format", "storage"):
            return "dcp/" + parts[2]
        return parts[1]
    if len(parts) >= 3 and parts[0] == "include" and parts[1] == "stowage":
        if len(parts) == 3:
            return "top" if parts[2] in TOP else "umbrella"
        return "dcp-api" if parts[2] == "dcp" else parts[2]
    return OUTSIDE


def layer_of_file(relative):
    """The layer whose rule a file follows, or None for the files no rule covers
    (src/pch.h, the umbrella and top-level headers)."""
    layer = layer_of_path(relative.parts)
    return None if layer in ("pch", "top", "umbrella", OUTSIDE) else layer


def layer_of_name(name, quoted):
    """An include's layer from its name alone (a header that is not in the tree, such as
    the generated <stowage/version.h>), or None for one that is not stowage's."""
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


def relative_parts(repo, path):
    """`path` (absolute, normalized) relative to `repo` as parts, or None outside it."""
    try:
        return pathlib.PurePath(path).relative_to(repo).parts
    except ValueError:
        return None


def find_include(repo, file, name, quoted, roots, layer_of):
    """(layer, where) of what `file` includes as `name`, found as a compiler with the include
    directories `roots` finds it: where is the repo-relative path it resolves to, and
    layer_of its parts' layer; (None, None) for a name that is not in the tree."""
    folders = ([str(file.parent)] if quoted else []) + [str(repo / root) for root in roots]
    for folder in folders:
        candidate = os.path.normpath(os.path.join(folder, name))
        if os.path.isfile(candidate):
            parts = relative_parts(repo, candidate)
            return (OUTSIDE, candidate) if parts is None else (layer_of(parts), "/".join(parts))
    # Not in the tree: a climbing or absolute name is judged by where it points.
    if os.path.isabs(name) or ".." in name.split("/"):
        candidate = os.path.normpath(os.path.join(folders[0], name))
        parts = relative_parts(repo, candidate)
        return (OUTSIDE, candidate) if parts is None else (layer_of(parts), "/".join(parts))
    return None, None


def target_of(repo, file, name, quoted):
    """(layer, where) of what `file` includes as `name`: where is the repo-relative path
    it resolves to, or None for a name judged by itself."""
    target, where = find_include(repo, file, name, quoted, INCLUDE_ROOTS, layer_of_path)
    return (target, where) if where is not None else (layer_of_name(name, quoted), None)


def directives(text):
    """(line number, directive, argument) of each include, continued lines joined."""
    lines = text.split("\n")
    number = 0
    while number < len(lines):
        start = number
        line = lines[number]
        while line.endswith("\\") and number + 1 < len(lines):
            number += 1
            line = line[:-1] + lines[number]
        number += 1
        match = DIRECTIVE.match(line)
        if match:
            yield start + 1, match.group(1), match.group(2)


def named_includes(relative, text, problems):
    """(where, name, quoted) of each include of `text`, the file at `relative`; one the check
    cannot read (a macro) is added to `problems` instead."""
    for number, directive, argument in directives(text):
        where = f"{relative}:{number}"
        spelled = re.match(r'([<"])([^>"]+)[>"]', argument)
        if spelled:
            yield where, spelled.group(2), spelled.group(1) == '"'
        else:
            problems.append(f"{where}: #{directive} {argument.strip()}: an include the check cannot read")


def include_problems(repo, file, relative, layer):
    """Each include of `file` (of `layer`) that breaks a rule, as a line to print."""
    allowed = RULES[layer] | {layer, "top"}
    public = relative.parts[0] == "include"
    problems = []
    for where, name, quoted in named_includes(relative, file.read_text(errors="replace"), problems):
        target, resolved = target_of(repo, file, name, quoted)
        shown = name if resolved is None or resolved == name else f"{name} = {resolved}"
        if target == OUTSIDE:
            problems.append(f"{where}: {layer} may not include {shown} (outside src/ and include/)")
        elif public and resolved is not None and resolved.startswith("src/"):
            problems.append(f"{where}: the public header may not include the private {shown}")
        elif target is None or target in allowed:
            continue
        elif str(relative) in FORWARDERS and target == "interop":
            continue
        else:
            problems.append(f"{where}: {layer} may not include {shown} ({target})")
    return problems


def program_layer(parts):
    """The program folder of a file at repo-relative `parts` (a key of PROGRAM_RULES),
    "public" (include/), "private" (src/), or OUTSIDE."""
    if not parts:
        return OUTSIDE
    if parts[0] in ("tools", "cli"):
        return parts[0]
    if parts[0] == "bench":
        if len(parts) == 2:
            return "bench"
        return "bench/" + parts[1] if parts[1] in ("cli", "lib") else OUTSIDE
    return {"include": "public", "src": "private"}.get(parts[0], OUTSIDE)


def program_target(repo, file, name, quoted):
    """(layer, where) of what a program's `file` includes as `name`, found as its compiler
    finds it; (None, None) for a header that is not the project's (the system's, LibTorch's)."""
    target, where = find_include(repo, file, name, quoted, PROGRAM_ROOTS, program_layer)
    if where is None and not quoted and name.split("/")[0] == "stowage":
        return "public", None  # generated: <stowage/version.h>
    return target, where


def program_files(repo):
    """The source files of the programs' folders."""
    return [file for folder in ("tools", "cli", "bench") for file in sorted((repo / folder).rglob("*"))
            if file.is_file() and file.suffix in SOURCE_SUFFIXES]


def program_problems(repo):
    """Each include of a program file (tools/, cli/, bench/) that breaks its folder's rule."""
    problems = []
    for file in program_files(repo):
        relative = file.relative_to(repo)
        layer = program_layer(relative.parts)
        if layer not in PROGRAM_RULES:
            problems.append(f"{relative}: the folder has no rule in docs/ARCHITECTURE.md (nor in this check)")
            continue
        allowed = PROGRAM_RULES[layer] | {"public"}
        for where, name, quoted in named_includes(relative, file.read_text(errors="replace"), problems):
            target, resolved = program_target(repo, file, name, quoted)
            if target is None or target in allowed:
                continue
            shown = name if resolved is None or resolved == name else f"{name} = {resolved}"
            what = {"private": "a private header", OUTSIDE: "outside the project"}.get(target, target)
            problems.append(f"{where}: {layer} may not include {shown} ({what})")
    return problems


def raw_signal_problems(repo):
    """Each call of kill(2) and its kin under tests/ outside SIGNAL_HELPER, as a line."""
    problems = []
    for file in sorted((repo / "tests").rglob("*")):
        relative = str(file.relative_to(repo))
        if not file.is_file() or file.suffix not in SOURCE_SUFFIXES or relative == SIGNAL_HELPER:
            continue
        for number, line in enumerate(file.read_text(errors="replace").split("\n"), 1):
            code = line.split("//", 1)[0]
            match = RAW_SIGNAL.search(code)
            if not match:
                continue
            problems.append(f"{relative}:{number}: {match.group(1)}() outside {SIGNAL_HELPER}: "
                            f"signal through signal_descendant() instead")
    return problems


def serial_split_problems(repo):
    """Each use of at::parallel_for or at::parallel_reduce in the project's code, as a line."""
    problems = []
    for folder in SPLIT_FOLDERS:
        for file in sorted((repo / folder).rglob("*")):
            if not file.is_file() or file.suffix not in SOURCE_SUFFIXES:
                continue
            for number, line in enumerate(file.read_text(errors="replace").split("\n"), 1):
                match = SERIAL_SPLIT.search(line.split("//", 1)[0])
                if match:
                    problems.append(f"{file.relative_to(repo)}:{number}: at::{match.group(1)} runs serially here "
                                    f"(no -fopenmp): use util::parallel_over_elements")
    return problems


def check(repo):
    """(every problem, how many files were checked) for the tree at `repo`."""
    repo = pathlib.Path(repo).resolve()
    files = sorted(p for d in ("src", "include") for p in (repo / d).rglob("*")
                   if p.is_file() and p.suffix in SOURCE_SUFFIXES)
    broken = []
    for file in files:
        relative = file.relative_to(repo)
        layer = layer_of_file(relative)
        if layer is None:
            continue
        if layer not in RULES:
            broken.append(f"{relative}: the folder {layer} has no rule in docs/ARCHITECTURE.md (nor in this check)")
            continue
        broken.extend(include_problems(repo, file, relative, layer))
    problems = broken + program_problems(repo) + raw_signal_problems(repo) + serial_split_problems(repo)
    return problems, len(files) + len(program_files(repo))


# The self-test's tree: each file's text; "# BAD" ends a line the check must report, and
# a file marked "// BAD FILE" must be reported as a whole.
SELF_TEST_TREE = {
    "include/stowage/error.h": "",
    "include/stowage/dcp/checkpoint.h": "#include <stowage/state/state_dict.h>\n",
    "include/stowage/state/state_dict.h": "#include <stowage/error.h>\n",
    "include/stowage/train/trainer.h": (
        "#include <stowage/dcp/checkpoint.h>\n"
        '#include "optim/disk_tier.h"  # BAD: a public header, a private one\n'),
    "src/util/errno_error.h": "#include <vector>\n#include <fmt/format.h>\n",
    "src/util/ok.cpp": '#include "errno_error.h"\n#include "util/errno_error.h"\n#include <stowage/version.h>\n',
    "src/util/climb.cpp": '#include "../dcp/format/codec.h"  # BAD\n',
    "src/util/climb_twice.cpp": '#include "./../memory/../dcp/format/codec.h"  # BAD\n',
    "src/util/angle.cpp": "#include <dcp/format/codec.h>  # BAD: found under src/\n",
    "src/util/angle_climb.cpp": "#include <stowage/../../src/dcp/format/codec.h>  # BAD\n",
    "src/util/spaced.cpp": '  #   include   "dcp/format/codec.h"  # BAD\n',
    "src/util/continued.cpp": '#include \\\n  "dcp/format/codec.h"  # BAD\n',
    "src/util/next.cpp": "#include_next <stowage/dcp/checkpoint.h>  # BAD\n#import \"dcp/save.h\"  # BAD\n",
    "src/util/macro.cpp": '#define HEADER "dcp/format/codec.h"\n#include HEADER  # BAD\n',
    "src/util/other_suffix.hpp": '#include "dcp/format/codec.h"  # BAD\n',
    "src/util/out_of_the_library.cpp": '#include "../../tools/stowage/commands.h"  # BAD\n',
    "src/util/absolute.cpp": '#include "/usr/include/nowhere/dcp.h"  # BAD\n',
    "src/memory/ok.cpp": '#include "util/errno_error.h"\n#include "../util/errno_error.h"\n',
    "src/dcp/format/codec.h": "#include <stowage/dcp/checkpoint.h>\n",
    "src/dcp/save.h": '#include "dcp/format/codec.h"\n#include "format/codec.h"\n',
    "src/optim/disk_tier.h": "",
    "src/newmodule/thing.cpp": "// BAD FILE: a folder without a rule\n",
    "tools/stowage/commands.h": "",
    "tools/stowage/launch.h": "",
    "tools/stowage/bench.cpp": ('#include "commands.h"\n#include "program.h"\n#include <stowage/error.h>\n'
                                "#include <stowage/version.h>\n#include <fmt/format.h>\n"
                                "#include <emit.h>  # BAD: the tool, a benchmark's header\n"
                                '#include "../../bench/cli/commands.h"  # BAD\n'
                                '#include "dcp/save.h"  # BAD: a private header\n'),
    "cli/program.h": "#include <CLI/CLI.hpp>\n#include <stowage/error.h>\n",
    "cli/program.cpp": '#include "program.h"\n#include "launch.h"  # BAD: the tool\'s\n',
    "bench/lib/emit.h": "",
    "bench/lib/swap_disk_bench.cpp": '#include "emit.h"\n#include "optim/disk_tier.h"  # BAD: a private header\n',
    "bench/lib/dcp_bench.cpp": '#include "optim/disk_tier.h"  # BAD\n#include "program.h"  # BAD: cli/\n',
    "bench/cli/commands.h": "",
    "bench/cli/run_all.cpp": ('#include "commands.h"\n#include "program.h"\n#include <emit.h>\n'
                              '#include "launch.h"  # BAD: tools/stowage/launch.h\n'),
    "bench/dcp.cpp": '#include "emit.h"\n#include "program.h"  # BAD: a thin executable, cli/\n',
    "bench/other/thing.cpp": "// BAD FILE: a folder without a rule\n",
    "tests/cli/child_signal.h": "inline int send(int pid) { return ::kill(pid, 15); }\n",
    "tests/cli/ok_test.cpp": ("// kill(-1, SIGTERM) would signal every process\n"
                              "bool sent = signal_descendant(pid, SIGTERM);\nrun.kill_and_reap();\n"),
    "tests/cli/raw_test.cpp": "  kill(pid, SIGTERM);  # BAD\n  ::kill(-pid, SIGKILL);  # BAD\n  killpg(g, 9);  # BAD\n",
    "src/util/split.cpp": ("// not at::parallel_for (serial here)\nutil::parallel_over_elements(t, 1, f);\n"
                           "  at::parallel_for(0, n, 1, f);  # BAD\n  ::at::parallel_reduce(0, n, 1, 0, f, g);  # BAD\n"),
    "bench/lib/split.cpp": "at :: parallel_for(0, n, 1, [&](int64_t b, int64_t e) {});  # BAD\n",
}


def self_test():
    """Problems with the check itself: planted violations it missed, clean lines it reported."""
    with tempfile.TemporaryDirectory(prefix="check-layers-") as tree:
        expected = set()
        for path, text in SELF_TEST_TREE.items():
            target = pathlib.Path(tree, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            if "// BAD FILE" in text:
                expected.add(path)
            for number, line in enumerate(text.split("\n"), 1):
                if "# BAD" in line:  # a continued directive is reported at its first line
                    first = number
                    while first > 1 and text.split("\n")[first - 2].endswith("\\"):
                        first -= 1
                    expected.add(f"{path}:{first}")
        broken, _ = check(tree)
        reported = {line.split(": ", 1)[0] for line in broken}
        missed = sorted(expected - reported)
        extra = sorted(line for line in broken if line.split(": ", 1)[0] not in expected)
        return [f"self-test: a planted violation went unreported: {where}" for where in missed] + \
               [f"self-test: a clean include was reported: {line}" for line in extra]


def main(argv):
    failures = self_test()
    for line in failures:
        print(line)
    if failures:
        return 2
    if argv[1:] == ["--self-test"]:
        print(f"self-test: every planted violation was reported, nothing else")
        return 0
    broken, count = check(argv[1] if len(argv) > 1 else ".")
    for line in broken:
        print(line)
    if broken:
        print(f"{len(broken)} includes break the rules of docs/ARCHITECTURE.md")
        return 1
    print(f"{count} files follow the include rules of docs/ARCHITECTURE.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
