#!/usr/bin/python3
"""No source file over 600 lines (../shared/STYLE.md: a file a reader can
hold; split one that grows by its concepts). Run by ctest as
tests.source_size over the files git tracks (every file under the tree
outside a checkout).

  check_source_size.py SOURCE_DIR [LIMIT]
"""
import os
import subprocess
import sys

ROOT = sys.argv[1]
LIMIT = int(sys.argv[2]) if len(sys.argv) > 2 else 600
SUFFIXES = (".cc", ".h", ".cu", ".cuh")
SKIP = ("build", ".cache", ".git")

try:
    names = subprocess.run(["git", "-C", ROOT, "ls-files"], capture_output=True, text=True,
                           check=True).stdout.split("\n")
except (OSError, subprocess.CalledProcessError):
    names = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(SKIP)]
        names += [os.path.relpath(os.path.join(top, f), ROOT) for f in files]
names = sorted(n for n in names if n.endswith(SUFFIXES))
over = []
for name in names:
    with open(os.path.join(ROOT, name), "rb") as f:
        lines = f.read().count(b"\n")
    if lines > LIMIT:
        over.append((lines, name))
for lines, name in sorted(over, reverse=True):
    print(f"{name}: {lines} lines, over {LIMIT}: split it by its concepts")
if over or not names:
    print(f"FAIL: {len(over)} of {len(names)} source files over {LIMIT} lines")
    sys.exit(1)
print(f"OK: {len(names)} source files, none over {LIMIT} lines")
