#!/usr/bin/python3
"""A ramped-up run saved mid-ramp and resumed in another layout continues
the uninterrupted run: the same global batches, consumed samples and
learning rates (by samples) at every later step, the losses and gradient
norms within 1e-5.

  rampup_resume_test.py TROUPE WORKDIR
"""
import json
import os
import shutil
import subprocess
import sys
os.environ.setdefault("TROUPE_DEVICE", "cpu")  # the tests pin the device, as ctest does

TROUPE, WORK = sys.argv[1], sys.argv[2]
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
# 4 to 16 by 4 over 40 samples: batches 4, 4, 4, 4, 8, 8, 12, 16, ...
FLAGS = ["--model", "tiny", "--micro-batch-size", "2", "--global-batch-size", "16",
         "--train-samples", "120", "--rampup-batch-size", "4", "4", "40",
         "--lr-warmup-samples", "24", "--threads", "1"]


def fail(why):
    print(f"FAIL: {why}")
    sys.exit(1)


def train(*extra, metrics):
    p = subprocess.run([TROUPE, "train", *FLAGS, *extra, "--metrics-jsonl", metrics],
                       capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"troupe train {' '.join(extra)}: exit {p.returncode}\n{p.stdout}{p.stderr}")
    with open(metrics) as f:
        return {m["step"]: m for m in map(json.loads, f)}


full = train(metrics=f"{WORK}/full.jsonl")
ck = f"{WORK}/ck"
# Saved after step 5, the ramp's first batch of 8.
first = train("--save", ck, "--exit-interval", "5", metrics=f"{WORK}/first.jsonl")
if sorted(first) != [1, 2, 3, 4, 5]:
    fail(f"the first part ran steps {sorted(first)}, want 1..5")
resumed = train("--load", ck, "--pp", "2", "--dp", "2", metrics=f"{WORK}/resumed.jsonl")
if sorted(resumed) != list(range(6, len(full) + 1)):
    fail(f"the resumed part ran steps {sorted(resumed)}, want 6..{len(full)}")
worst = 0.0
for step, m in resumed.items():
    want = full[step]
    for k in ("global_batch_size", "consumed_samples", "lr"):
        if m[k] != want[k]:
            fail(f"step {step}: {k} {m[k]!r} resumed, {want[k]!r} uninterrupted")
    for k in ("loss", "grad_norm"):
        rel = abs(m[k] - want[k]) / abs(want[k])
        worst = max(worst, rel)
        if rel > 1e-5:
            fail(f"step {step}: {k} {m[k]!r} resumed, {want[k]!r} uninterrupted")
print(f"OK: resumed at step 6 (batch {resumed[6]['global_batch_size']}, "
      f"{full[5]['consumed_samples']} samples consumed) in pp 2 dp 2: steps 6..{len(full)} "
      f"continue the run (worst relative difference {worst:.2g})")
