#!/usr/bin/python3
"""Compares two `troupe train --metrics-jsonl` files step by step.

    /usr/bin/python3 tests/compare_metrics.py WANT.jsonl GOT.jsonl [--rtol 1e-5]
        [--keys loss,grad_norm] [--steps N]

Both files must hold the same steps (1, 2, ... in order; exactly N of them
with --steps); for every step and key, |got - want| / |want| must be at most
--rtol. A key may be absent from a step (val_loss is only on evaluation
steps) if it is absent from that step in both files, but each key must be
compared at least once. Prints the worst relative difference per key (and
where), then exits 0 if all are within the tolerance, 1 if not, 2 if a file
cannot be read or the files do not have the same steps and keys: the CLI
tests compare a layout's losses with the single-rank run's, and a comparison
that did not compare must not pass.
Uses only the standard library (Debian's /usr/bin/python3).
"""

import argparse
import json
import math
import sys


class BadInput(Exception):
    pass


def read_metrics(path, keys):
    """The file's rows as a list of dicts, checked: steps 1..n, each key present a number."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise BadInput(f"{path}: cannot read: {e.strerror}") from e
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise BadInput(f"{path}:{number}: not JSON: {e.msg}") from e
        if not isinstance(row, dict):
            raise BadInput(f"{path}:{number}: not a JSON object")
        for key in ["step"] + keys:
            if key != "step" and key not in row:
                continue
            value = row.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise BadInput(f"{path}:{number}: no number '{key}'")
            if not math.isfinite(value):
                raise BadInput(f"{path}:{number}: '{key}' is {value}")
        if row["step"] != len(rows) + 1:
            raise BadInput(f"{path}:{number}: step {row['step']}, want {len(rows) + 1}")
        rows.append(row)
    if not rows:
        raise BadInput(f"{path}: no steps")
    return rows


def relative(got, want):
    if got == want:
        return 0.0
    if want == 0:
        return math.inf
    return abs(got - want) / abs(want)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("want")
    p.add_argument("got")
    p.add_argument("--rtol", type=float, default=1e-5)
    p.add_argument("--keys", default="loss,grad_norm")
    p.add_argument("--steps", type=int, default=0, help="require exactly this many steps")
    a = p.parse_args(argv)
    keys = [k for k in a.keys.split(",") if k]
    if not keys or not a.rtol >= 0:
        print("compare_metrics: --keys must name a key and --rtol be >= 0", file=sys.stderr)
        return 2
    try:
        want = read_metrics(a.want, keys)
        got = read_metrics(a.got, keys)
    except BadInput as e:
        print(f"compare_metrics: error: {e}", file=sys.stderr)
        return 2
    if len(want) != len(got):
        print(f"compare_metrics: error: {a.want} has {len(want)} steps, {a.got} has {len(got)}",
              file=sys.stderr)
        return 2
    if a.steps and len(want) != a.steps:
        print(f"compare_metrics: error: {len(want)} steps, want {a.steps}", file=sys.stderr)
        return 2
    ok = True
    for key in keys:
        pairs = []
        for w, g in zip(want, got):
            if (key in w) != (key in g):
                print(f"compare_metrics: error: step {w['step']} has '{key}' in only one file",
                      file=sys.stderr)
                return 2
            if key in w:
                pairs.append((relative(g[key], w[key]), w["step"]))
        if not pairs:
            print(f"compare_metrics: error: no step has '{key}'", file=sys.stderr)
            return 2
        worst, at = max(pairs)
        within = worst <= a.rtol
        ok = ok and within
        print(f"{key}: worst relative difference {worst:.3g} at step {at} over {len(pairs)} steps "
              f"({'within' if within else 'OVER'} --rtol {a.rtol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
