#!/usr/bin/python3
"""The planner against reality, side by side in one run: `troupe plan
calibrate` measures this machine (into a temporary cluster directory), then
for each layout `troupe train` runs it and `troupe plan --cluster
this-machine` predicts it:

  1 rank        cpu-small (the actor runtime, as the planner models it:
                --trace makes `troupe train` use it for one rank)
  pp 2          two stages, 1F1B
  dp 2          two replicas, ZeRO-1 partitions
  tp 2          two tensor-parallel slices
  pp 2 zb-h1    two stages, the zero-bubble ZB-H1 schedule (B and W apart)
  tp 2 pp 2     four ranks in one process on 2 cores: two stages of two
                slices, taking turns on the cores
  launch-pp2dp2 four processes through `troupe launch` (UCX between them:
                the pipeline's hops and the replicas' reduction)

  plan_check.py TROUPE [--model cpu-small] [--micro-batch-size 4]
                [--global-batch-size 16] [--steps 5] [--layouts 1,pp2,dp2,tp2,pp2-zbh1,tp2pp2,launch-pp2dp2]

Step time: the median of the metrics JSONL's step_s over the steps after the
first (warm-up). Memory: the largest of what each rank allocated (`troupe
train` prints it) against the counted memory of the stage that needs the
most. One JSON object per layout, then a table; exits 1 when a prediction
misses by more than the issue's bounds (15% time, 10% memory).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
os.environ.setdefault("TROUPE_DEVICE", "cpu")  # the CPU (a GPU host defaults to cuda)

ap = argparse.ArgumentParser()
ap.add_argument("troupe")
ap.add_argument("--model", default="cpu-small")
ap.add_argument("--micro-batch-size", type=int, default=4)
ap.add_argument("--global-batch-size", type=int, default=16)
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--layouts", default="1,pp2,dp2,tp2,pp2-zbh1,tp2pp2,launch-pp2dp2")
args = ap.parse_args()

LAYOUTS = {"1": [], "pp2": ["--pp", "2"], "dp2": ["--dp", "2"], "tp2": ["--tp", "2"],
           "pp2-zbh1": ["--pp", "2", "--schedule", "zb-h1"], "tp2pp2": ["--tp", "2", "--pp", "2"],
           "launch-pp2dp2": ["--pp", "2", "--dp", "2"]}
common = ["--model", args.model, "--micro-batch-size", str(args.micro_batch_size),
          "--global-batch-size", str(args.global_batch_size)]

with tempfile.TemporaryDirectory() as tmp:
    env = dict(os.environ, TROUPE_CLUSTER_DIR=tmp, TROUPE_FLIGHT_DIR=tmp)
    subprocess.run([args.troupe, "plan", "calibrate", "--model", args.model,
                    "--micro-batch-size", str(args.micro_batch_size)], env=env, check=True)
    rows, bad = [], False
    for name in args.layouts.split(","):
        flags = LAYOUTS[name]
        metrics = os.path.join(tmp, f"{name}.jsonl")
        command = "launch" if name.startswith("launch-") else "train"
        extra = ["--trace", os.path.join(tmp, "trace")] if not flags else []
        if command == "launch":
            extra = ["--run-dir", os.path.join(tmp, f"{name}-run")]
        out = subprocess.run([args.troupe, command, *common, *flags, "--steps", str(args.steps),
                              "--metrics-jsonl", metrics, *extra],
                             env=env, check=True, capture_output=True, text=True).stdout
        alloc = re.search(r"memory allocated per rank \(MiB, by rank\): ([0-9., ]+)", out)
        measured_mib = max(float(x) for x in alloc.group(1).split(",")) if alloc else None
        steps = [json.loads(line)["step_s"] for line in open(metrics)][1:]
        measured_s = statistics.median(steps)
        plan = json.loads(subprocess.run(
            [args.troupe, "plan", "--cluster", "this-machine", "--json", *common,
             *(flags if flags else []), "--transport", "ucx" if command == "launch" else "inproc"],
            env=env, check=True, capture_output=True,
            text=True).stdout)
        predicted_mib = plan["memory"]["bytes"] / 2**20
        row = {"layout": name, "measured_step_s": measured_s, "predicted_step_s": plan["step_s"],
               "time_error": plan["step_s"] / measured_s - 1,
               "measured_mib": measured_mib, "predicted_mib": predicted_mib,
               "memory_error": predicted_mib / measured_mib - 1 if measured_mib else None,
               "steps_s": steps, "predicted_bubble": plan["bubble"],
               "predicted_exposed_comm_s": plan["exposed_comm_s"]}
        print(json.dumps(row), flush=True)
        rows.append(row)
        bad |= abs(row["time_error"]) > 0.15
        bad |= row["memory_error"] is not None and abs(row["memory_error"]) > 0.10

print(f"\n{'layout':13} {'measured s':>11} {'predicted s':>12} {'error':>7}   "
      f"{'measured MiB':>13} {'predicted MiB':>14} {'error':>7}")
for r in rows:
    mem = (f"{r['measured_mib']:13.1f} {r['predicted_mib']:14.1f} {100 * r['memory_error']:6.1f}%"
           if r["measured_mib"] else f"{'-':>13} {r['predicted_mib']:14.1f} {'-':>7}")
    print(f"{r['layout']:13} {r['measured_step_s']:11.3f} {r['predicted_step_s']:12.3f} "
          f"{100 * r['time_error']:6.1f}%   {mem}")
sys.exit(1 if bad else 0)
