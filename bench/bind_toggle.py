#!/usr/bin/python3
"""What `troupe launch --bind-cores` does to a pipeline across processes,
bound and unbound in turn within one run.

  bind_toggle.py TROUPE [--pp 1,2,4,8] [--windows 8] [--seconds 3]

For each pp: `troupe launch --bind-cores` of the zero-cost pipeline of
`scripts/bench hop` (4 KiB activations, one micro-batch a step,
--debug-op-cost 0:0:0); once it trains, every thread of every worker is
unbound (may run on every CPU this bench may) and bound again (the share
its log names) in turn, window after window, and each window's steps are
counted from --metrics-jsonl (us a step). The same processes, the same
phase of a noisy VM: the pair is the binding's effect alone, which
separate runs (bench/hop_bench.py's `hop_bound`) blur. Prints a JSON line
a window, one a pp (the medians), and the slope over pp of the medians,
halved (a hop, as bench/hop_bench.py's slope).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from report import slope  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("troupe")
ap.add_argument("--pp", default="1,2,4,8")
ap.add_argument("--windows", type=int, default=8, help="windows a pp, bound and unbound in turn")
ap.add_argument("--seconds", type=float, default=3.0, help="a window's length")
args = ap.parse_args()
WORK = tempfile.mkdtemp(prefix="troupe-bind-toggle-")
ALL = sorted(os.sched_getaffinity(0))


def emit(**kw):
    print(json.dumps(kw), flush=True)


def lines(path):
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def set_threads(pid, cpus):
    """Every thread of process `pid` on `cpus` (a thread gone meanwhile is skipped)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, FileNotFoundError):
            pass


def shares(ranks):
    """{pid: the CPUs its rank's log says it is bound to}."""
    out = {}
    for r in ranks:
        with open(r["log"], errors="replace") as f:
            m = re.search(r"bound to CPU (\S+) ", f.read())
        if not m:
            sys.exit(f"bind_toggle: {r['log']} names no CPU share")
        cpus = []
        for part in m.group(1).split(","):
            lo, _, hi = part.partition("-")
            cpus += range(int(lo), int(hi or lo) + 1)
        out[r["pid"]] = set(cpus)
    return out


def one_pp(pp):
    tag = f"pp{pp}"
    metrics, run_dir = f"{WORK}/{tag}.jsonl", f"{WORK}/{tag}"
    cmd = [args.troupe, "launch", "--bind-cores", "--model", "tiny", "--layers", "8",
           "--channels", "8", "--heads", "1", "--seq-len", "128", "--vocab-size", "16",
           "--make-vocab-size-divisible-by", "1", "--micro-batch-size", "1",
           "--global-batch-size", "1", "--pp", str(pp), "--debug-op-cost", "0:0:0",
           "--steps", "100000000", "--metrics-jsonl", metrics, "--run-dir", run_dir]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while lines(metrics) < 200:
            if p.poll() is not None or time.time() > deadline:
                sys.exit(f"bind_toggle: pp {pp} did not train ({' '.join(cmd)})")
            time.sleep(0.1)
        with open(f"{run_dir}/launch.json") as f:
            bound = shares(json.load(f)["ranks"])
        steps = {"unbound": [], "bound": []}
        for k in range(args.windows):
            state = "unbound" if k % 2 == 0 else "bound"
            for pid, cpus in bound.items():
                set_threads(pid, ALL if state == "unbound" else cpus)
            time.sleep(0.5)  # (the threads move at their next switch)
            a, t = lines(metrics), time.time()
            time.sleep(args.seconds)
            b, dt = lines(metrics), time.time() - t
            us = dt / max(b - a, 1) * 1e6
            steps[state].append(us)
            emit(bench="bind_toggle", pp=pp, window=k, state=state, step_us=round(us, 1))
    finally:
        p.kill()
        p.wait()
        subprocess.run(["pkill", "-KILL", "-f", run_dir], check=False)
    medians = {s: statistics.median(v) for s, v in steps.items()}
    emit(bench="bind_toggle_pp", pp=pp, unbound_us=round(medians["unbound"], 1),
         bound_us=round(medians["bound"], 1), unbound_runs_us=[round(x) for x in steps["unbound"]],
         bound_runs_us=[round(x) for x in steps["bound"]])
    return medians


points = {s: [] for s in ("unbound", "bound")}
pps = [int(x) for x in args.pp.split(",")]
for pp in pps:
    m = one_pp(pp)
    for s in points:
        points[s].append((pp, m[s]))
if len(pps) > 1:
    hop = {s: slope(v) / 2 for s, v in points.items()}
    emit(bench="bind_toggle_slope", cpus=len(ALL), unbound_hop_us=round(hop["unbound"], 1),
         bound_hop_us=round(hop["bound"], 1))
    print(f"the slope over pp {args.pp}, halved (us a hop), the same runs toggled: "
          f"unbound {hop['unbound']:.1f}, bound (--bind-cores) {hop['bound']:.1f}")
