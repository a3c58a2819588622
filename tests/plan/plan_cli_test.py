#!/usr/bin/python3
"""troupe plan end to end: calibrate this machine on a tiny model (into a
directory of the test's own), plan a pp 2 layout on it, check the JSON's
fields and that its numbers are consistent with each other (tokens/s is the
global batch's tokens over the step; the memory parts add up), draw the
step (an SVG with both stages and every micro-batch's blocks), and plan
MT-NLG 530B on Selene with --search (the fastest first, rejections said).

  plan_cli_test.py TROUPE DIR
"""
import json
import os
import shutil
import subprocess
import sys

troupe, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
cluster = os.path.join(work, "tiny-machine.json")


def run(*args):
    p = subprocess.run([troupe, *args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"troupe {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.stdout


run("plan", "calibrate", "--model", "tiny", "--micro-batch-size", "2", "--threads", "1",
    "--reps", "1", "--output", cluster)
c = json.load(open(cluster))
assert c["name"] == "this-machine" and c["calibration"]["threads"][0]["threads"] == 1, c
fam = c["calibration"]["threads"][0]["family_gbytes_per_s"]
for f in ("layernorm_fwd", "gelu_bwd", "crossentropy_partial", "adamw"):
    assert fam[f] > 0, (f, fam)

# Both attention kernels' rates; selective recompute reruns the reference
# kernel's attention and has nothing to rerun with flash.
rates = c["calibration"]["threads"][0]
for k in ("attention_fwd_gflops", "attention_bwd_gflops", "reference_attention_fwd_gflops",
          "reference_attention_bwd_gflops"):
    assert rates[k] > 0, (k, rates)


def step_s(kernel, recompute):
    return json.loads(run("plan", "--model", "tiny", "--cluster", cluster, "--micro-batch-size",
                          "2", "--global-batch-size", "8", "--attention-kernel", kernel,
                          "--recompute", recompute, "--json"))["step_s"]


assert step_s("flash", "selective") == step_s("flash", "none")
assert step_s("reference", "selective") > step_s("reference", "none")

svg = os.path.join(work, "step.svg")
p = json.loads(run("plan", "--model", "tiny", "--cluster", cluster, "--pp", "2",
                   "--micro-batch-size", "2", "--global-batch-size", "8", "--json", "--svg", svg))
for k in ("step_s", "tokens_per_s", "tflops_per_gpu", "bubble", "exposed_comm_s",
          "memory_gib_per_gpu", "fits"):
    assert k in p, k
assert p["memory"]["mode"] == "counted" and p["precision"] == "fp32", p
assert abs(p["tokens_per_s"] - 8 * 64 / p["step_s"]) < 1e-6 * p["tokens_per_s"], p
parts = sum(p["memory"][k] for k in ("params_gib", "grads_gib", "optimizer_gib",
                                     "activations_gib", "buffers_gib"))
assert abs(parts - p["memory_gib_per_gpu"]) < 1e-9, p
assert 0 < p["bubble"] < 1 and p["pipeline_s"] <= p["step_s"], p
text = open(svg).read()
assert text.startswith("<svg") or "<svg" in text[:200], text[:200]
assert "stage 0" in text and "stage 1" in text, "rows"
assert text.count("<rect") >= 2 * 2 * 4, "a block per op"

s = json.loads(run("plan", "--model", "mt-nlg-530b", "--cluster", "dgx-a100-80gb-selene",
                   "--gpus", "2240", "--micro-batch-size", "1", "--global-batch-size", "1920",
                   "--search", "--json"))
best = s["best"]
assert 0 < len(best) <= 10 and s["simulated"] >= len(best), s["simulated"]
assert all(a["step_s"] <= b["step_s"] for a, b in zip(best, best[1:])), "fastest first"
assert all(b["fits"] and b["tp"] * b["pp"] * b["dp"] == 2240 for b in best), best
assert any("layers do not split" in r for r in s["rejected"]), s["rejected"]
print(f"plan_cli_test: ok ({len(best)} layouts, {s['simulated']} simulated)")
