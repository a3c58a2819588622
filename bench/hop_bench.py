#!/usr/bin/python3
"""The runtime's own cost per pipeline hop, beside the floor under it, in one run.

  hop_bench.py TROUPE WAKEUP_BENCH [--steps N] [--reps R]

A hop is from the op that makes an activation (or gradient) finishing on one
stage to the op that reads it starting on the next. Every op costs nothing
(--debug-op-cost 0:0:0: the real runtime around ops that enqueue no work),
one micro-batch a step, so a step of pp stages is 2(pp - 1) hops in a row
(the activation down, the gradient back) plus what does not depend on pp;
the slope of the step time over pp, halved, is one hop. Measured

  in_process_us     `troupe train --pp P`: the ranks as actors in one process
  cross_process_us  `troupe launch --pp P`: a worker process a stage, over UCX

at pp 1, 2, 4 and 8, each point the median step of R runs' medians. The
floor, measured in the same run:

  ucx_one_way_us    UCX's own one-way tag latency for the same bytes between
                    two processes on this host (ucx_perftest tag_lat: half a
                    ping-pong)
  wakeup_us         one thread waking another asleep on an eventfd, one way
                    (bench/wakeup_bench.cc; the futex figure on its own line)

The activation is B x T x C fp32 with B = 1 and C = 8 (so the parameters,
and the optimizer's work, stay negligible): T = 128 gives 4 KiB, T = 32768
1 MiB. One JSON line per size with the keys above, then the details.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from report import perftest, slope  # noqa: E402  (ucx_perftest server and client)

ap = argparse.ArgumentParser()
ap.add_argument("troupe")
ap.add_argument("wakeup_bench")
ap.add_argument("--steps", type=int, default=300, help="steps per run (the first 50 are left out)")
ap.add_argument("--reps", type=int, default=3, help="runs per point (their medians' median)")
ap.add_argument("--sizes", default="4096,1048576", help="activation bytes")
args = ap.parse_args()
WORK = tempfile.mkdtemp(prefix="troupe-hop-bench-")
C = 8
SKIP = 50
STAGES = (1, 2, 4, 8)


def emit(**kw):
    print(json.dumps(kw), flush=True)


def median_step_us(cmd, metrics):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"hop_bench: failed: {' '.join(cmd)}\n{r.stdout[-3000:]}")
    with open(metrics) as f:
        rows = [json.loads(line) for line in f]
    return statistics.median(row["step_s"] for row in rows[SKIP:]) * 1e6


def hop_us(command, size):
    T = size // (4 * C)
    points = []
    for pp in STAGES:
        flags = ["--model", "tiny", "--layers", "8", "--channels", str(C), "--heads", "1",
                 "--seq-len", str(T), "--vocab-size", "16", "--make-vocab-size-divisible-by", "1",
                 "--micro-batch-size", "1", "--global-batch-size", "1", "--pp", str(pp),
                 "--debug-op-cost", "0:0:0", "--steps", str(args.steps)]
        runs = []
        for k in range(args.reps):
            tag = f"{command}-{size}-pp{pp}-{k}"
            metrics = f"{WORK}/{tag}.jsonl"
            extra = ["--run-dir", f"{WORK}/{tag}"] if command == "launch" else []
            runs.append(median_step_us([args.troupe, command, *flags, "--metrics-jsonl", metrics,
                                        *extra], metrics))
        step = statistics.median(runs)
        emit(bench="hop_step", command=command, activation_bytes=size, pp=pp, step_us=step,
             runs_us=runs)
        points.append((pp, step))
    return slope(points) / 2


out = subprocess.run([args.wakeup_bench], check=True, capture_output=True, text=True).stdout
wakeups = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
for w in wakeups:
    emit(**w)
wakeup = next(w["one_way_us"] for w in wakeups if w["kind"] == "eventfd")

rows = []
for size in (int(s) for s in args.sizes.split(",")):
    in_process = hop_us("train", size)
    cross_process = hop_us("launch", size)
    ucx = statistics.median(perftest("tag_lat", size)[0] for _ in range(args.reps))
    row = {"hop_bytes": size, "in_process_us": round(in_process, 2),
           "cross_process_us": round(cross_process, 2), "ucx_one_way_us": round(ucx, 2),
           "wakeup_us": round(wakeup, 2)}
    rows.append(row)
    print(json.dumps(row), flush=True)

print()
print(f"{'bytes':>9s} {'in process':>11s} {'across':>8s} {'UCX 1-way':>10s} {'wake-up':>8s} "
      f"{'across - floor':>15s}")
for r in rows:
    floor = r["ucx_one_way_us"] + r["wakeup_us"]
    print(f"{r['hop_bytes']:9d} {r['in_process_us']:9.1f}us {r['cross_process_us']:6.1f}us "
          f"{r['ucx_one_way_us']:8.1f}us {r['wakeup_us']:6.1f}us {r['cross_process_us'] - floor:13.1f}us")
print("targets (4 KiB): in process < 20 us, across processes < 60 us")
