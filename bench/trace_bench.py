#!/usr/bin/python3
"""What recording costs: cpu-small with --pp 2 (actors, one process), the same
run three ways, alternating in each round (the machine is shared and noisy,
so the figures are medians over rounds and steps):

  off     --debug-trace-off: nothing recorded (the baseline)
  flight  the default: every rank's flight recorder (4096 events) is on
  trace   --trace DIR: everything recorded and written at the end

  trace_bench.py TROUPE COST_BENCH [--steps N] [--rounds R] [--micro-batch-size B]
                 [--global-batch-size G] [--pp P]

The step time is the metrics JSONL's step_s; steps 1 and 2 are warm-up and
left out. On a shared machine the run-to-run noise (several %) is far
larger than what recording costs, so the overhead is also computed from its
parts: COST_BENCH (build/bench/trace_cost_bench) measures one marked stream
op (against an unmarked one) and one open+close of the recorder; --trace's
files say how many of each a rank records per step; their product over the
step time is the overhead per step. One JSON object per measurement on
stdout, then a summary.

Also the bubble `troupe trace` measures with ops of fixed cost
(--debug-op-cost 10:20, tiny, pp 4, m 8, 1F1B) in one process and through
`troupe launch`, against the theory (p-1)/(m+p-1) = 27.3%.
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
os.environ.setdefault("TROUPE_DEVICE", "cpu")  # the CPU (a GPU host defaults to cuda)

ap = argparse.ArgumentParser()
ap.add_argument("troupe")
ap.add_argument("cost_bench")
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--micro-batch-size", type=int, default=2)
ap.add_argument("--global-batch-size", type=int, default=8)
ap.add_argument("--pp", type=int, default=2)
ap.add_argument("--no-bubble", action="store_true", help="skip the bubble measurement")
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
        kinds = {}
        for f in files:
            for line in list(open(f))[1:]:
                k = json.loads(line)["k"]
                kinds[k] = kinds.get(k, 0) + 1
        size = sum(os.path.getsize(f) for f in files)
        per = len(files) * args.steps
        ops = sum(kinds.get(k, 0) for k in ("forward", "backward", "optimizer")) / per
        out.update(events_per_rank_step=sum(kinds.values()) / per, stream_ops_per_rank_step=ops,
                   other_events_per_rank_step=sum(kinds.values()) / per - ops,
                   bytes_per_rank_step=size / per)
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
low = {m: min(v) for m, v in got.items()}  # contention only adds time: the least noisy figure

# The parts: ns per marked stream op (over an unmarked one) and per event.
p = subprocess.run([args.cost_bench, "--benchmark_format=json"], capture_output=True, text=True,
                   check=True)
bench = {b["name"]: b["real_time"] for b in json.loads(p.stdout)["benchmarks"]}
mark_ns = (bench["BM_StreamOp/marked:1"] - bench["BM_StreamOp/marked:0"]) / 256
event_ns = bench["BM_OpenClose"]
emit(bench="trace_cost", mark_stream_op_ns=mark_ns, open_close_ns=event_ns)
cost_s = (extra["stream_ops_per_rank_step"] * mark_ns +
          extra["other_events_per_rank_step"] * event_ns) * 1e-9
emit(summary="overhead_from_parts", seconds_per_rank_step=cost_s,
     fraction_of_step=cost_s / med["off"])
for m in MODES:
    emit(summary=m, median_step_s=med[m], min_step_s=low[m], samples=len(got[m]),
         median_ratio_to_off=med[m] / med["off"], min_ratio_to_off=low[m] / low["off"])
print()
print(f"cpu-small pp={args.pp}, B={args.micro_batch_size}, global batch {args.global_batch_size}, "
      f"{args.rounds} rounds x {args.steps - 2} steps per mode")
for m in MODES:
    print(f"  {m:7s} median step {med[m]:.4f} s ({100 * (med[m] / med['off'] - 1):+.2f}% vs off)"
          f"   fastest {low[m]:.4f} s ({100 * (low[m] / low['off'] - 1):+.2f}%)")
print(f"  --trace: {extra['events_per_rank_step']:.0f} events and "
      f"{extra['bytes_per_rank_step'] / 1024:.1f} KiB per rank and step")
print(f"  one marked stream op {mark_ns / 1000:.2f} us, one recorded message or wait "
      f"{event_ns:.0f} ns: {cost_s * 1e6:.1f} us per rank and step = "
      f"{100 * cost_s / med['off']:.4f}% of the step (target: under 3%)")

def bubble(launch):
    d = os.path.join(WORK, "bubble-launch" if launch else "bubble")
    cmd = [args.troupe, "launch" if launch else "train", "--model", "tiny", "--pp", "4",
           "--micro-batch-size", "1", "--global-batch-size", "8", "--steps", "3",
           "--debug-op-cost", "10:20", "--trace", d]
    if launch:
        cmd += ["--run-dir", os.path.join(WORK, "run-bubble")]
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    p = subprocess.run([args.troupe, "trace", d], capture_output=True, text=True, check=True)
    m = re.search(r"bubble: measured ([0-9.]+)% .* = ([0-9.]+)%", p.stdout)
    emit(bench="bubble", launch=launch, measured_pct=float(m.group(1)),
         theory_pct=float(m.group(2)))
    return float(m.group(1)), float(m.group(2))


if not args.no_bubble:
    for launch in (False, True):
        got, want = bubble(launch)
        print(f"  bubble with ops of 10:20 ms, pp 4, m 8, "
              f"{'troupe launch' if launch else 'one process'}: {got:.1f}% (theory {want:.1f}%, "
              f"{got - want:+.1f} points)")
shutil.rmtree(WORK)
