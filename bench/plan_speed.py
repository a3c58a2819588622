#!/usr/bin/python3
"""How fast `troupe plan` is on MT-NLG 530B (the issue's targets: one
simulation at 4,480 GPUs under 10 s, --search over 2,240 GPUs under 60 s),
wall time of the whole command, and what it predicts at Selene's sizes.

  plan_speed.py TROUPE
"""
import json
import subprocess
import sys
import time

troupe = sys.argv[1]
base = [troupe, "plan", "--model", "mt-nlg-530b", "--cluster", "dgx-a100-80gb-selene",
        "--micro-batch-size", "1", "--global-batch-size", "1920"]


def timed(cmd):
    t0 = time.monotonic()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return time.monotonic() - t0, out


s, out = timed(base + ["--gpus", "4480", "--tp", "8", "--pp", "35", "--recompute", "full", "--json"])
print(json.dumps({"case": "530b_4480_gpus", "wall_s": s, "target_s": 10,
                  "step_s": json.loads(out)["step_s"]}))
s, out = timed(base + ["--gpus", "2240", "--search", "--json"])
r = json.loads(out)
print(json.dumps({"case": "530b_search_2240_gpus", "wall_s": s, "target_s": 60,
                  "simulated": r["simulated"], "best": {k: r["best"][0][k] for k in (
                      "tp", "pp", "dp", "micro_batch_size", "schedule", "virtual_stages",
                      "recompute", "step_s", "tflops_per_gpu")} if r["best"] else None}))
for gpus in (2240, 2800, 3360):
    _, out = timed(base + ["--gpus", str(gpus), "--tp", "8", "--pp", "35", "--recompute", "full",
                           "--json"])
    p = json.loads(out)
    print(json.dumps({"case": f"530b_selene_{gpus}", **{k: p[k] for k in (
        "step_s", "tflops_per_gpu", "memory_gib_per_gpu", "bubble", "exposed_comm_s", "fits")}}))
_, out = timed([troupe, "plan", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb-selene",
                "--gpus", "1024", "--tp", "8", "--pp", "16", "--micro-batch-size", "1",
                "--global-batch-size", "1536", "--recompute", "full", "--json"])
p = json.loads(out)
print(json.dumps({"case": "175b_selene_1024", **{k: p[k] for k in (
    "step_s", "tflops_per_gpu", "memory_gib_per_gpu", "bubble", "exposed_comm_s", "fits")}}))
