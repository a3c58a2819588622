#!/usr/bin/python3
"""Checkpoints of cpu-small: what a save costs training and how long a load
takes, for one rank (the reference loop) and --pp 2 (actors, one process).

  checkpoint_bench.py TROUPE [--layouts 1,pp2] [--steps N] [--interval K]
                      [--rounds R] [--dir DIR]

For each layout, R rounds of two runs, alternating (the machine is shared and
noisy, so the figures are medians):
  save run  N steps with --save DIR --save-interval K: per save the stall the
            run prints ("training waited"), the total save time ("written
            in", from the copy's start to the commit), the bytes of the
            checkpoint directory; the step time of each step right after a
            save against the others (steps 1 and 2 are warm-up, left out)
  plain run the same N steps without --save: the baseline step time
and --load-rounds pairs of load runs: `--load DIR/iter_K` for one step
against a run without --load for one step: the time from starting the
process to the start of its first step (the first metrics line's arrival
minus its step_s), the minimum over the rounds. The difference is the load
against the seed's initialisation: the actors' ranks load instead of
initialising (so it can be negative), the single-rank loop initialises and
then loads.

One JSON object per measurement on stdout, then a summary.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
os.environ.setdefault("TROUPE_DEVICE", "cpu")  # the CPU (a GPU host defaults to cuda)

ap = argparse.ArgumentParser()
ap.add_argument("troupe")
ap.add_argument("--layouts", default="1,pp2")
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--interval", type=int, default=2)
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--load-rounds", type=int, default=5)
ap.add_argument("--dir", default="", help="work directory (default: a fresh one in /tmp)")
args = ap.parse_args()
T = args.troupe
WORK = args.dir or tempfile.mkdtemp(prefix="troupe-ckpt-bench-")
os.makedirs(WORK, exist_ok=True)
# (One LR schedule for every run: a resume must keep the saving run's.)
MODEL = ["--model", "cpu-small", "--micro-batch-size", "4", "--global-batch-size", "8",
         "--lr-decay-iters", "100"]
LAYOUTS = {"1": [], "pp2": ["--pp", "2"]}
SAVED = re.compile(r"saved checkpoint (\S+) \(training waited ([0-9.]+) s; written in ([0-9.]+) s\)")


def emit(**kw):
    print(json.dumps(kw), flush=True)


def run(cmd):
    """stdout's lines, each with the seconds since the start it arrived at."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [(time.monotonic() - t0, line) for line in p.stdout]
    if p.wait() != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{''.join(l for _, l in lines[-30:])}")
    return lines


def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def save_round(name, flags, k):
    ck = f"{WORK}/{name}-ck{k}"
    shutil.rmtree(ck, ignore_errors=True)
    m = f"{WORK}/{name}-save{k}.jsonl"
    lines = run([T, "train", *MODEL, *flags, "--steps", str(args.steps), "--save", ck,
                 "--save-interval", str(args.interval), "--metrics-jsonl", m])
    saves = []
    for _, line in lines:
        s = SAVED.search(line)
        if s:
            saves.append({"dir": s.group(1), "stall_s": float(s.group(2)), "save_s": float(s.group(3)),
                          "bytes": dir_bytes(s.group(1))})
    steps = {r["step"]: r["step_s"] for r in read_metrics(m)}
    saved_after = set(range(args.interval, args.steps, args.interval))
    after = [steps[s + 1] for s in saved_after]
    others = [t for s, t in steps.items() if s > 2 and s - 1 not in saved_after]
    m0 = f"{WORK}/{name}-plain{k}.jsonl"
    run([T, "train", *MODEL, *flags, "--steps", str(args.steps), "--metrics-jsonl", m0])
    plain = [r["step_s"] for r in read_metrics(m0) if r["step"] > 2]
    return saves, after, others, plain, ck


def first_step_start(flags, metrics):
    """Seconds from the start to the first step's start."""
    lines = run([T, "train", *flags, "--metrics-jsonl", metrics])
    arrived = next(t for t, line in lines if re.match(r"step \d+/\d+ \|", line))
    return arrived - read_metrics(metrics)[0]["step_s"]


def bench(name):
    flags = LAYOUTS[name]
    saves, after, others, plain, ck = [], [], [], [], ""
    for k in range(args.rounds):
        s, a, o, p, ck = save_round(name, flags, k)
        saves += s
        after += a
        others += o
        plain += p
    # Load: resume the first save for one step, against one step from the seed.
    with_load, without = [], []
    it = f"{ck}/iter_{args.interval:07d}"
    for k in range(args.load_rounds):
        # (--steps K+1: one step after the checkpoint's K.)
        with_load.append(first_step_start([*MODEL, *flags, "--steps", str(args.interval + 1),
                                           "--load", it],
                                          f"{WORK}/{name}-load{k}.jsonl"))
        without.append(first_step_start([*MODEL, *flags, "--steps", "1"],
                                        f"{WORK}/{name}-noload{k}.jsonl"))
    r = {"bench": "checkpoint", "layout": name, "saves": len(saves),
         "stall_s": statistics.median(s["stall_s"] for s in saves),
         "stall_max_s": max(s["stall_s"] for s in saves),
         "save_s": statistics.median(s["save_s"] for s in saves),
         "bytes": saves[0]["bytes"],
         "step_after_save_s": statistics.median(after), "step_other_s": statistics.median(others),
         "step_plain_s": statistics.median(plain),
         # (The minimum: other work on the machine only ever adds time.)
         "start_with_load_s": min(with_load), "start_without_load_s": min(without),
         "start_with_load_median_s": statistics.median(with_load),
         "start_without_load_median_s": statistics.median(without)}
    r["step_after_save_ratio"] = r["step_after_save_s"] / r["step_other_s"]
    r["load_s"] = r["start_with_load_s"] - r["start_without_load_s"]
    r["write_MBps"] = r["bytes"] / 1e6 / r["save_s"]
    emit(**r)
    return r


results = [bench(name) for name in args.layouts.split(",")]
summary = ["", f"cpu-small checkpoints ({args.steps} steps, a save every {args.interval}, "
           f"{args.rounds} rounds; medians):"]
for r in results:
    summary.append(
        f"  {r['layout']:>4}: {r['bytes'] / 2**20:.0f} MiB per checkpoint; training waited "
        f"{r['stall_s'] * 1e3:.0f} ms per save (max {r['stall_max_s'] * 1e3:.0f}); save {r['save_s']:.2f} s "
        f"({r['write_MBps']:.0f} MB/s); step after a save {r['step_after_save_s']:.3f} s vs "
        f"{r['step_other_s']:.3f} s others (x{r['step_after_save_ratio']:.2f}; no --save: "
        f"{r['step_plain_s']:.3f} s); start to first step {r['start_with_load_s']:.2f} s with --load, "
        f"{r['start_without_load_s']:.2f} s without (difference {r['load_s']:+.2f} s; minima of "
        f"{args.load_rounds})")
print("\n".join(summary))
