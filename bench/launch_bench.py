#!/usr/bin/python3
"""`troupe launch` measured against `troupe train` (all ranks in one
process), side by side in one run (this machine is shared and noisy: each
pair of runs alternates, and the figures are medians and ratios).

  launch_bench.py TROUPE [--only hop,speed,startup,detect] [--steps N]

  hop      the runtime's cost per pipeline hop across processes: a model of
           negligible compute (2 layers, C=16, T=8, B=1) at pp = 2 with m = 1,
           2, 4, 8 micro-batches; each micro-batch adds its round trip (one
           activation hop, one gradient hop) to the step, so the slope over m,
           halved, is the cost of one hop; the same in one process.
  speed    cpu-small, pp=2, 2 processes vs the in-process run: median step
           time after the first steps, and the ratio of speeds
  startup  8 local workers (tp2 pp2 dp2, tiny): from starting `troupe launch`
           until the first step begins
  detect   the detection time of each kind of failure (SIGKILL to a worker,
           SIGKILL to an agent, SIGINT, SIGTERM), by tests/launcher/launch_test.py

One JSON object per measurement on stdout, then a summary.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import slope  # noqa: E402
os.environ.setdefault("TROUPE_DEVICE", "cpu")  # the CPU (a GPU host defaults to cuda)

ap = argparse.ArgumentParser()
ap.add_argument("troupe")
ap.add_argument("--only", default="hop,speed,startup,detect")
ap.add_argument("--steps", type=int, default=0, help="steps per run (default per bench)")
args = ap.parse_args()
T = args.troupe
WORK = tempfile.mkdtemp(prefix="troupe-launch-bench-")
HERE = os.path.dirname(os.path.abspath(__file__))


def emit(**kw):
    print(json.dumps(kw), flush=True)


def step_times(cmd, metrics, skip):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stdout[-3000:]}")
    with open(metrics) as f:
        rows = [json.loads(line) for line in f]
    return [row["step_s"] for row in rows[skip:]]


def both(flags, steps, skip, tag, rounds=2):
    """Median step time of train and launch with `flags`, alternating."""
    train, launch = [], []
    for k in range(rounds):
        m = f"{WORK}/{tag}-{k}-train.jsonl"
        train += step_times([T, "train", *flags, "--steps", str(steps), "--metrics-jsonl", m], m, skip)
        m = f"{WORK}/{tag}-{k}-launch.jsonl"
        launch += step_times([T, "launch", *flags, "--steps", str(steps), "--metrics-jsonl", m,
                              "--run-dir", f"{WORK}/{tag}-{k}"], m, skip)
    return statistics.median(train), statistics.median(launch)


summary = []
only = args.only.split(",")
if "hop" in only:
    # pp = 2 (two worker processes; on this 2-core machine more processes
    # than cores would measure the scheduler, not the runtime), m = 1, 2, 4, 8
    # micro-batches of a model of negligible compute: with 1F1B each
    # micro-batch waits for its own round trip (activation to stage 1, its
    # gradient back), so the step time grows by two hops per micro-batch.
    # The same in one process (troupe train --pp 2: in-process transport).
    steps = args.steps or 500
    tiny = ["--model", "tiny", "--layers", "2", "--channels", "16", "--heads", "1", "--seq-len", "8",
            "--vocab-size", "64", "--make-vocab-size-divisible-by", "1", "--micro-batch-size", "1",
            "--pp", "2"]
    pts_train, pts_launch = [], []
    for m in (1, 2, 4, 8):
        tr, la = both(tiny + ["--global-batch-size", str(m)], steps, 50, f"hop-m{m}", rounds=2)
        emit(bench="launch_hop", pp=2, m=m, train_step_us=tr * 1e6, launch_step_us=la * 1e6)
        pts_train.append((m, tr * 1e6))
        pts_launch.append((m, la * 1e6))
    hop_train, hop_launch = slope(pts_train) / 2, slope(pts_launch) / 2
    emit(bench="launch_hop_cost", us_per_hop_across_processes=hop_launch,
         us_per_hop_in_process=hop_train)
    summary.append(f"hop: {hop_launch:.1f} us per pipeline hop across processes, {hop_train:.1f} us "
                   f"in one process (pp=2, slope over m); target < 60 us")
if "speed" in only:
    steps = args.steps or 12
    flags = ["--model", "cpu-small", "--pp", "2", "--micro-batch-size", "4", "--global-batch-size", "16"]
    tr, la = both(flags, steps, 2, "speed", rounds=2)
    emit(bench="launch_speed", model="cpu-small", pp=2, train_step_s=tr, launch_step_s=la,
         speed_ratio=tr / la)
    summary.append(f"speed: cpu-small pp=2, 2 processes at {tr / la:.3f} of the in-process speed "
                   f"({la * 1e3:.0f} ms vs {tr * 1e3:.0f} ms per step); target >= 0.95")
if "startup" in only:
    times = []
    for k in range(3):
        t0 = time.time()
        p = subprocess.Popen([T, "launch", "--nproc-per-node", "8", "--tp", "2", "--pp", "2", "--dp", "2",
                              "--model", "tiny", "--global-batch-size", "8", "--micro-batch-size", "2",
                              "--steps", "2", "--run-dir", f"{WORK}/startup-{k}"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first = None
        for line in p.stdout:
            if line.startswith("step 1/") and first is None:
                first = time.time() - t0
        p.wait()
        with open(f"{WORK}/startup-{k}/metrics.jsonl") as f:
            step1 = json.loads(f.readline())["step_s"]
        times.append(first - step1)
    emit(bench="launch_startup", workers=8, seconds_to_first_step=statistics.median(times),
         runs=times)
    summary.append(f"startup: {statistics.median(times):.2f} s from `troupe launch` to the first "
                   f"step with 8 local workers (median of 3)")
if "detect" in only:
    test = os.path.join(HERE, "..", "tests", "launcher", "launch_test.py")
    for case in (["kill_worker"], ["kill_agent"], ["interrupt", "SIGINT"], ["interrupt", "SIGTERM"]):
        r = subprocess.run(["/usr/bin/python3", test, T, f"{WORK}/detect", *case],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        m = re.search(r"MEASURED: (.*): the launcher exited (-?\d+) after ([0-9.]+) s", r.stdout)
        if r.returncode != 0 or not m:
            sys.exit(f"{case}: {r.stdout[-2000:]}")
        emit(bench="launch_detect", failure=m.group(1), seconds=float(m.group(3)),
             exit_code=int(m.group(2)))
        summary.append(f"detect: {m.group(1)}: stopped everything in {float(m.group(3)):.2f} s")
print("\n".join(summary))
