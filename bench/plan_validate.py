#!/usr/bin/python3
"""`troupe plan` against published training runs it was not fitted to.

  plan_validate.py TROUPE

Each row is a published run: its model, layout, cluster and measured
throughput per GPU, with its source. The planner predicts the same run
(`troupe plan --json`, paper memory mode, bf16) and the error is
predicted / measured - 1. Nothing in the planner is fitted to these rows:
the A100 cluster file's efficiencies are stated assumptions (see its
"note"), so every row is a prediction. Prints one JSON line per row, then
the table and the mean absolute and worst error (docs/PLAN.md keeps it).

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM" (SC'21), Table 1: GPT models of sequence
2048 and vocabulary 51,200 on Selene's A100s, full activation recompute.
Where the paper does not give the micro-batch size or the schedule, the
prediction uses micro-batch 1 and 1F1B (said in each row).

Smith et al. 2022, "Using DeepSpeed and Megatron to Train Megatron-Turing
NLG 530B" (arXiv 2201.11990), section 2.4: MT-NLG (105 layers, hidden
20,480, 128 heads, sequence 2048, GPT-2's 50,257-token vocabulary) at tp 8,
pp 35 with global batch 1920 on 280, 350 and 420 DGX A100 servers of
Selene: 60.1, 50.2 and 44.4 s an iteration, 126, 121 and 113 TFLOP/s per
GPU (as quoted in llm-analysis's MT-NLG example, github.com/cli99/
llm-analysis; the per-GPU figures follow from the iteration times by the
same FLOP count as Narayanan et al.'s, with full recompute: 125.7, 120.4,
113.5). The system troupe is built after: these rows are never fitted.
"""
import json
import subprocess
import sys

troupe = sys.argv[1]

NARAYANAN = "Narayanan et al. 2021 (SC'21), Table 1"
# (billions of parameters, heads, hidden, layers, tp, pp, GPUs, global batch,
#  measured TFLOP/s per GPU)
TABLE1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]

MTNLG = "Smith et al. 2022 (MT-NLG), section 2.4"
# (servers, iteration seconds, measured TFLOP/s per GPU)
MTNLG_RUNS = [(280, 60.1, 126), (350, 50.2, 121), (420, 44.4, 113)]

RUNS = [(f"GPT {b}B", NARAYANAN, h, c, l, tp, pp, g, batch, 51200, m)
        for b, h, c, l, tp, pp, g, batch, m in TABLE1]
RUNS += [(f"MT-NLG {n * 8} GPUs", MTNLG, 128, 20480, 105, 8, 35, n * 8, 1920, 50257, m)
         for n, _, m in MTNLG_RUNS]

rows = []
for name, source, heads, hidden, layers, tp, pp, gpus, batch, vocab, measured in RUNS:
    cmd = [troupe, "plan", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb-selene",
           "--layers", str(layers), "--channels", str(hidden), "--heads", str(heads),
           "--seq-len", "2048", "--vocab-size", str(vocab), "--tp", str(tp), "--pp", str(pp),
           "--gpus", str(gpus), "--global-batch-size", str(batch), "--micro-batch-size", "1",
           "--recompute", "full", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"plan_validate: {' '.join(cmd)}: {r.stderr[-2000:]}")
    plan = json.loads(r.stdout)
    predicted = plan["tflops_per_gpu"]
    row = {"run": name, "source": source, "tp": tp, "pp": pp, "gpus": gpus,
           "global_batch": batch, "assumed": "micro-batch 1, 1f1b", "measured_tflops": measured,
           "predicted_tflops": round(predicted, 1), "error": round(predicted / measured - 1, 4),
           "fits": plan["fits"]}
    rows.append(row)
    print(json.dumps(row), flush=True)

print()
print(f"{'run':>18s} {'tp':>3s} {'pp':>3s} {'GPUs':>5s} {'batch':>6s} {'measured':>9s} "
      f"{'predicted':>10s} {'error':>7s}")
for r in rows:
    print(f"{r['run']:>18s} {r['tp']:3d} {r['pp']:3d} {r['gpus']:5d} {r['global_batch']:6d} "
          f"{r['measured_tflops']:9.0f} {r['predicted_tflops']:10.1f} {100 * r['error']:+6.1f}%")
errors = [abs(r["error"]) for r in rows]
print(f"mean absolute error {100 * sum(errors) / len(errors):.1f}%, worst {100 * max(errors):.1f}% "
      f"(target: mean <= 10%, none over 20%)")
