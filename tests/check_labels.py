#!/usr/bin/env python3
"""check_labels.py CTEST BUILD_DIR: fails, naming them, unless every test of
BUILD_DIR carries exactly one speed label (fast or slow), every `timing`
test is RUN_SERIAL, and no test needs a fixture set up by a test of a label
the sanitizer passes leave out (`timing`, `e2e`, `cli`) unless it has that
label too: ctest would run the setup anyway (tests/labels.cmake,
docs/CI.md)."""
import json
import subprocess
import sys


def main() -> int:
    ctest, build = sys.argv[1], sys.argv[2]
    out = subprocess.run([ctest, "--show-only=json-v1"], cwd=build, check=True,
                         capture_output=True, text=True).stdout
    bad = []
    tests = json.loads(out)["tests"]
    for t in tests:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        labels = props.get("LABELS", [])
        speeds = [l for l in labels if l in ("fast", "slow")]
        if len(speeds) != 1:
            bad.append(f"{t['name']}: labels {labels}, want exactly one of fast, slow")
        if "timing" in labels and not props.get("RUN_SERIAL", False):
            bad.append(f"{t['name']}: label timing but not RUN_SERIAL")
    # Fixtures: who sets each up, and with which of the left-out labels.
    left_out = ("timing", "e2e", "cli")
    setups = {}
    for t in tests:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        for fx in props.get("FIXTURES_SETUP", []):
            setups.setdefault(fx, []).append((t["name"], props.get("LABELS", [])))
    for t in tests:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        labels = props.get("LABELS", [])
        for fx in props.get("FIXTURES_REQUIRED", []):
            for name, their in setups.get(fx, []):
                for label in left_out:
                    if label in their and label not in labels:
                        bad.append(f"{t['name']}: needs fixture {fx}, set up by {name} ({label}), "
                                   f"but is not {label}")
    for b in bad:
        print(b)
    print(f"{len(tests)} tests, {len(bad)} problems (labels: tests/labels.cmake)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
