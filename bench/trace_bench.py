#!/usr/bin/python3
"""What recording costs: cpu-small with --pp 2 (actors, one process), the same
run three ways, alternating in each round (the machine is shared and noisy,
so the figures are medians over rounds and steps):

  off     --debug-trace-off: nothing recorded (the baseline)
  flight  the default: every rank's flight recorder (4096 events) is on
  trace   --trace DIR: everything recorded and written at the end

  trace_bench.py TROUPE [--steps N] [--rounds R] [--micro-batch-size B]
                 [--global-batch-size G] [--pp P]

The step time is the metrics JSONL's step_s; steps 1 and 2 are warm-up and
left out. Also the bytes and events written per rank and step with --trace,
and the time `troupe trace` would have to read. One JSON object per
measurement on stdout, then a summary of the ratios to `off`.
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("troupe")
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--micro-batch-size", type=int, default=2)
ap.add_argument("--global-batch-size", type=int, default=8)
ap.add_argument("--pp", type=int, default=2)
args = ap.parse_args()
WORK = tempfile.mkdtemp(prefix="troupe-trace-bench-")
BASE = ["--model", "cpu-small", "--pp", str(args.pp), "--micro-batch-size",
        str(args.micro_batch_size), "--global-batch-size", str(args.global_batch_size),
        "--steps", str(args.steps)]
MODES = {"off": ["--debug-trace-off"], "flight": [], "trace": ["--trace", "TRACE"]}


def emit(**kw):
    print(json.dumps(kw), flush=True)


def run(mode, rnd):
    metrics = os.path.join(WORK, f"{mode}-{rnd}.jsonl")
    trace = os.path.join(WORK, f"trace-{rnd}")
    flags = [trace if f == "TRACE" else f for f in MODES[mode]]
    cmd = [args.troupe, "train", *BASE, "--metrics-jsonl", metrics, *flags]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"trace_bench: {' '.join(cmd)} failed:\n{p.stderr}")
    steps = [json.loads(l) for l in open(metrics)]
    times = [s["step_s"] for s in steps if s["step"] > 2]
    out = {"mode": mode, "round": rnd, "step_s": times}
    if mode == "trace":
        files = glob.glob(os.path.join(trace, "rank-*.trace.jsonl"))
        events = sum(sum(1 for _ in open(f)) - 1 for f in files)
        size = sum(os.path.getsize(f) for f in files)
        out.update(events_per_rank_step=events / len(files) / args.steps,
                   bytes_per_rank_step=size / len(files) / args.steps)
        shutil.rmtree(trace)
    emit(**out)
    return out


got = {m: [] for m in MODES}
extra = {}
for rnd in range(args.rounds):
    order = list(MODES) if rnd % 2 == 0 else list(reversed(MODES))
    for mode in order:
        r = run(mode, rnd)
        got[mode] += r["step_s"]
        if "events_per_rank_step" in r:
            extra = r
med = {m: statistics.median(v) for m, v in got.items()}
for m in MODES:
    emit(summary=m, median_step_s=med[m], samples=len(got[m]), ratio_to_off=med[m] / med["off"])
print()
print(f"cpu-small pp={args.pp}, B={args.micro_batch_size}, global batch {args.global_batch_size}, "
      f"{args.rounds} rounds x {args.steps - 2} steps per mode")
for m in MODES:
    print(f"  {m:7s} median step {med[m]:.4f} s   {100 * (med[m] / med['off'] - 1):+.2f}% vs off")
if extra:
    print(f"  --trace: {extra['events_per_rank_step']:.0f} events and "
          f"{extra['bytes_per_rank_step'] / 1024:.1f} KiB per rank and step")
shutil.rmtree(WORK)
