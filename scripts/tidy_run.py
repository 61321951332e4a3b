#!/usr/bin/env python3
"""Runs clang-tidy-14 on each translation unit of scripts/tidy_db.py's compilation database,
JOBS at a time, and prints the findings at their sources' lines:

    tidy_run.py ROOT DB JOBS CACHE_DIR

A unit of joined batches that does not compile as one (two of its sources define one name)
is checked as its batches instead (DB/parts_of.json), and said so.

A unit found clean is remembered in CACHE_DIR under a key of everything clang-tidy reads:
its version, the .clang-tidy files, the unit's command and its preprocessed text with
comments kept (-E -C, so a NOLINT or a changed header changes the key), the checkout's
path written as ROOT so that clones share the cache. A unit whose key is there is not
checked again; a unit with findings is never remembered. Exits 1 on any finding.
"""
import bisect
import concurrent.futures
import glob
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys

root, db, jobs, cache = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
entries = json.load(open(os.path.join(db, "compile_commands.json")))
line_map_path = os.path.join(db, "line_map.json")
line_map = json.load(open(line_map_path)) if os.path.exists(line_map_path) else {}
parts_of_path = os.path.join(db, "parts_of.json")
parts_of = json.load(open(parts_of_path)) if os.path.exists(parts_of_path) else {}
parts = {e["file"]: e for e in json.load(open(os.path.join(db, "parts", "compile_commands.json")))} \
    if parts_of else {}
folders = ("include", "src", "tools", "tests", "bench", "examples", "fuzz")
header_filter = f"^{root}/({'|'.join(folders)})/"
tidy = ["clang-tidy-14", "--quiet", f"--header-filter={header_filter}"]


def version_and_config():
    parts = [subprocess.run(["clang-tidy-14", "--version"], capture_output=True, text=True).stdout]
    configs = [os.path.join(root, ".clang-tidy")]
    for folder in folders:
        configs += glob.glob(os.path.join(root, folder, "**", ".clang-tidy"), recursive=True)
    for config in sorted(c for c in configs if os.path.exists(c)):
        parts += [os.path.relpath(config, root), open(config).read()]
    return "\n".join(parts)


common = version_and_config() + header_filter.replace(root, "ROOT")


def key_of(entry):
    """The unit's cache key, or None when it can't be preprocessed (it is then checked)."""
    args = shlex.split(entry["command"])
    kept, skip = ["clang++-14"], False
    for arg in args[1:]:
        if skip:
            skip = False
        elif arg == "-o":
            skip = True
        elif arg != "-c":
            kept.append(arg)
    text = subprocess.run(kept + ["-E", "-C", "-w", "-o", "-"], cwd=entry["directory"],
                          capture_output=True)
    if text.returncode != 0:
        return None
    digest = hashlib.sha256(common.encode())
    digest.update(entry["command"].replace(root, "ROOT").encode())
    digest.update(text.stdout.replace(root.encode(), b"ROOT"))
    return digest.hexdigest()


def at_source_lines(output):
    if not line_map:
        return output
    pattern = re.compile("(" + "|".join(map(re.escape, line_map)) + r"):(\d+):")

    def source_line(match):
        starts = line_map[match.group(1)]
        i = bisect.bisect_right([start for start, _ in starts], int(match.group(2))) - 1
        return "{}:{}:".format(starts[i][1], int(match.group(2)) - starts[i][0] + 1)

    return pattern.sub(source_line, output)


def check_unit(entry, entry_db):
    """(clean, from the cache, what clang-tidy printed) for one unit of entry_db."""
    key = key_of(entry)
    stamp = key and os.path.join(cache, key)
    if stamp and os.path.exists(stamp):
        return True, True, ""
    run = subprocess.run(tidy + ["-p", entry_db, entry["file"]], capture_output=True, text=True)
    output = "".join(line for line in (run.stdout + run.stderr).splitlines(keepends=True)
                     if not re.fullmatch(r"\d+ warnings? generated\.\n?", line))
    if run.returncode == 0 and stamp:
        os.makedirs(cache, exist_ok=True)
        open(stamp, "w").write(entry["file"].replace(root, "ROOT") + "\n")
    return run.returncode == 0, False, at_source_lines(output)


def check(entry):
    """check_unit's result for a unit, or for its batches when it does not compile as one."""
    clean, cached, output = check_unit(entry, db)
    if clean or entry["file"] not in parts_of or "[clang-diagnostic-error]" not in output:
        return clean, cached, output
    error = next(line for line in output.splitlines() if "[clang-diagnostic-error]" in line)
    said = (f"tidy: {os.path.basename(entry['file'])} does not compile as one unit ({error}); "
            f"checking its {len(parts_of[entry['file']])} batches apart (slower: rename what clashes)\n")
    results = [check_unit(parts[part], os.path.join(db, "parts")) for part in parts_of[entry["file"]]]
    return all(r[0] for r in results), False, said + "".join(r[2] for r in results)


print(f"tidy: clang-tidy-14 on {len(entries)} translation units, {jobs} at a time", flush=True)
clean = cached = 0
with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    for ok, from_cache, output in pool.map(check, entries):
        sys.stdout.write(output)
        sys.stdout.flush()
        clean += ok
        cached += from_cache
print(f"tidy: {clean} of {len(entries)} translation units clean ({cached} known clean from {cache})")
sys.exit(0 if clean == len(entries) else 1)
