#!/usr/bin/python3
"""The GPU cluster files' GEMM curves, from measured sweeps (not assumed).

  gemm_fit.py [--clusters launcher/plan/clusters] [--data CSV --cluster NAME]
  gemm_fit.py --self-test   fits a sweep made from known parameters

Fits launcher/plan/hardware.h's curve,

  time(M, N, K) = launch + 2MNK / (peak * e(M,N,K)) * q(M,N),
  e(M,N,K)      = M/(M+m0) * N/(N+n0) * K/(K+k0),

with peak the datasheet's dense bf16 rate (the curve's asymptote: gemm_max 1)
and q the last wave's quantisation over the GPU's SMs in 256 x 128, 128 x 256
or 128 x 128 tiles (whichever wastes least), to
bench/data/xla_sm90_bf16_matmul.csv: XLA's measured H100 table (125 shapes,
each dimension 256 to 4096). The fit minimises the squared log error of the
time; m0, n0, k0 and launch are the free parameters.

Then it checks the result against figures it was not fitted to: the best
matmul rate found by a shape search ("MAMF", Bekman's ML Engineering book,
compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison
table": H100 SXM 794.5 TFLOP/s at 2048x2048x13312, A100 SXM 271.2 at
1024x10240x5120, both bf16), the A100 through the H100's curve with its
half sizes scaled by the two GPUs' machine balance (H200, the H100's
compute with faster HBM, takes its half sizes the same way) (peak FLOP/s over HBM
bytes/s: a GEMM dimension must be that much larger on the GPU that computes
more per byte to reach the same share of its peak).

A cluster with a sweep of its own is fitted to it: XLA's table for dgx-h100,
and with --data CSV --cluster NAME the sweep `scripts/gpu-check --run` writes
(gemm-sweep.csv: troupe's own GEMM on the lent GPU, its name, date and commit
in the header) for that cluster. The others take the H100's half sizes by
the machine balance.

Prints the fit, its residuals, the checks, and each cluster file's values
beside the fit's; exits 1 when a file's curve is not the fit's (within 1%).
The files scale the curve by their "gemm_max", the share of it reached in
training (bench/plan_fit.py fits the A100's to a published layer time).
"""
import argparse
import csv
import json
import math
import os
import sys

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--clusters", default="launcher/plan/clusters")
ap.add_argument("--data", help="a measured sweep (m,n,k,flops_per_s) of --cluster's GPU")
ap.add_argument("--cluster", help="the cluster file --data measured")
ap.add_argument("--self-test", action="store_true",
                help="fit a sweep made from known parameters and check they come back")
args = ap.parse_args()
if (args.data is None) != (args.cluster is None):
    sys.exit("gemm_fit.py: --data and --cluster go together")

# The measured sweeps, by cluster file.
SWEEPS = {"dgx-h100": "bench/data/xla_sm90_bf16_matmul.csv"}
if args.data:
    SWEEPS[args.cluster] = args.data
CLUSTERS = ["dgx-h100", "dgx-h200", "dgx-a100-80gb-selene"]


def cluster(name):
    with open(os.path.join(args.clusters, name + ".json")) as f:
        return json.load(f)


def read_sweep(path):
    """A sweep's rows; gpu_ops_bench's own end in "# complete: N rows" (one
    cut short by its timeout has no such line, or fewer rows)."""
    with open(path) as f:
        lines = f.read().splitlines()
    rows = [r for r in csv.reader(line for line in lines if not line.startswith("#"))]
    head, body = rows[0], rows[1:]
    if head != ["m", "n", "k", "flops_per_s"]:
        sys.exit(f"gemm_fit.py: {path}: the header is {head}, not m,n,k,flops_per_s")
    ours = any("gpu_ops_bench --gemm-sweep" in line for line in lines if line.startswith("#"))
    if ours:
        done = [line for line in lines if line.startswith("# complete: ")]
        if not done or int(done[-1].split()[2]) != len(body):
            end = done[-1] if done else 'no "# complete" line'
            sys.exit(f"gemm_fit.py: {path}: the sweep was cut short ({len(body)} rows, {end})")
    return np.array([[float(x) for x in r] for r in body])


def quantisation(M, N, sms, tm, tn):
    best = None
    s = min(tm, tn)
    for a, b in ((tm, tn), (tn, tm), (s, s)):
        tiles = np.ceil(M / a) * np.ceil(N / b)
        q = np.where(tiles < sms, 1.0, np.ceil(tiles / sms) * sms / tiles)
        best = q if best is None else np.minimum(best, q)
    return best


def gpu(c):
    t = c["efficiency"]["gemm_tile"]
    return c["gpu"]["peak_tflops"]["bf16"] * 1e12, c["gpu"]["sms"], t["m"], t["n"]


def seconds(p, M, N, K, c):
    m0, n0, k0, fixed = p
    peak, sms, tm, tn = gpu(c)
    e = M / (M + m0) * N / (N + n0) * K / (K + k0)
    return fixed + 2 * M * N * K / (peak * e) * quantisation(M, N, sms, tm, tn)


def fit(name, path):
    c = cluster(name)
    S = read_sweep(path)
    M, N, K, F = S.T
    T = 2 * M * N * K / F

    def loss(p):
        r = np.log(seconds(p, M, N, K, c) / T)
        return float(np.mean(r * r))

    # Deterministic pattern search in log space (numpy alone; no SciPy here).
    p = np.array([128.0, 128.0, 128.0, 5e-6])
    step = np.full(4, 0.5)
    while step.max() > 1e-5:
        moved = False
        for i in range(4):
            for s in (1 + step[i], 1 / (1 + step[i])):
                q = p.copy()
                q[i] *= s
                if loss(q) < loss(p):
                    p, moved = q, True
        if not moved:
            step *= 0.5
    res = np.log(seconds(p, M, N, K, c) / T)
    big = (M >= 1024) & (N >= 1024) & (K >= 1024)
    peak, sms, tm, tn = gpu(c)
    print(f"{name}: fitted to {len(S)} shapes of {path}: m0 {p[0]:.0f}, n0 {p[1]:.0f}, "
          f"k0 {p[2]:.0f}, fixed {p[3] * 1e6:.2f} us (peak {peak / 1e12:.1f} TFLOP/s, {sms} SMs, "
          f"{tm}x{tn} tiles)")
    print(f"  time residuals: rms {100 * math.sqrt(np.mean(res ** 2)):.1f}%, worst "
          f"{100 * np.abs(res).max():.1f}%; shapes with every dimension >= 1024 "
          f"({int(big.sum())}): rms {100 * math.sqrt(np.mean(res[big] ** 2)):.1f}%, worst "
          f"{100 * np.abs(res[big]).max():.1f}%")
    return p


def balance(c):  # FLOP per byte of HBM at the bf16 peak
    return c["gpu"]["peak_tflops"]["bf16"] * 1e3 / c["gpu"]["memory_gbytes_per_s"]


if args.self_test:
    # The fit must give back the parameters a sweep was made from (dgx-h200's
    # SMs and tiles; every shape of XLA's table).
    import tempfile
    known = np.array([150.0, 140.0, 90.0, 4e-6])
    grid = np.array([(m, n, k) for m in (256, 512, 1024, 2048, 4096)
                     for n in (256, 512, 1024, 2048, 4096) for k in (256, 512, 1024, 2048, 4096)],
                    dtype=float)
    M, N, K = grid.T
    rate = 2 * M * N * K / seconds(known, M, N, K, cluster("dgx-h200"))
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write("m,n,k,flops_per_s\n")
        for (m, n, k), r in zip(grid, rate):
            f.write(f"{m:.0f},{n:.0f},{k:.0f},{r:.6e}\n")
    got = fit("dgx-h200", f.name)
    os.unlink(f.name)
    ok = bool(np.all(np.abs(got / known - 1) < 0.005))
    print(f"self-test: made from m0/n0/k0/fixed {known[0]:.0f}/{known[1]:.0f}/{known[2]:.0f}/"
          f"{known[3] * 1e6:.2f} us, fitted {got[0]:.1f}/{got[1]:.1f}/{got[2]:.1f}/"
          f"{got[3] * 1e6:.3f} us: {'recovered' if ok else 'NOT recovered'} (within 0.5%)")
    sys.exit(0 if ok else 1)

curves = {name: fit(name, path) for name, path in SWEEPS.items()}
h100 = cluster("dgx-h100")
for name in CLUSTERS:
    if name in curves:
        continue
    c = cluster(name)
    r = balance(c) / balance(h100)
    m0, n0, k0, fixed = curves["dgx-h100"]
    curves[name] = np.array([m0 * r, n0 * r, k0 * r, fixed])
    print(f"{name}: the H100's half sizes x {r:.3f} (machine balance {balance(c):.0f} against "
          f"{balance(h100):.0f} FLOP/B): m0 {m0 * r:.0f}, n0 {n0 * r:.0f}, k0 {k0 * r:.0f}")

print("checks against measurements not fitted to (MAMF: the best rate a shape search found):")
for name, shape, measured in (("dgx-h100", (2048, 2048, 13312), 794.5),
                              ("dgx-a100-80gb-selene", (1024, 10240, 5120), 271.2)):
    M, N, K = (float(x) for x in shape)
    rate = 2 * M * N * K / seconds(curves[name], M, N, K, cluster(name)) / 1e12
    print(f"  {name}: {M:.0f}x{N:.0f}x{K:.0f} predicted {rate:.1f} TFLOP/s, measured {measured} "
          f"({100 * (rate / measured - 1):+.1f}%)")

bad = False
for name in CLUSTERS:
    e = cluster(name)["efficiency"]
    have = (e["gemm_half_m"], e["gemm_half_n"], e["gemm_half_k"], e.get("gemm_launch_us", 0))
    m0, n0, k0, fixed = curves[name]
    want = (m0, n0, k0, fixed * 1e6)
    ok = all(abs(h - w) <= 0.01 * w + 0.5 for h, w in zip(have, want))
    bad |= not ok
    print(f"{name}.json: half m/n/k {have[0]}/{have[1]}/{have[2]}, fixed {have[3]} us: "
          f"{'the fit' if ok else 'NOT the fit (want %.0f/%.0f/%.0f, %.2f us)' % want}; "
          f"in training {e['gemm_max']} of the curve (gemm_max: bench/plan_fit.py)")
sys.exit(1 if bad else 0)
