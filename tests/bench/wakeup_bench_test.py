"""bench/wakeup_bench.cc's output is what bench/hop_bench.py reads: one JSON
object a line, the ping-pongs with their share on one CPU, and (where this
process may run on 2 CPUs) the idle-CPU kinds for each gap asked, whose
sysfs fields are JSON values; a gap too short to let a CPU go idle is
refused.

  wakeup_bench_test.py WAKEUP_BENCH
"""
import json
import os
import subprocess
import sys

bench = sys.argv[1]
out = subprocess.run([bench, "--iters", "20", "--rounds", "1", "--idle-iters", "10",
                      "--idle-gaps-us", "5,20"], check=True, capture_output=True,
                     text=True).stdout
rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
kinds = [(r["kind"], r.get("idle_gap_us")) for r in rows]
want = [("eventfd", None), ("futex", None)]
if len(os.sched_getaffinity(0)) >= 2:
    want += [(k, g) for k in ("eventfd_idle_cpu", "futex_idle_cpu") for g in (5, 20)]
if kinds != want:
    sys.exit(f"FAIL: kinds {kinds}, want {want}\n{out}")
for r in rows:
    if not 0 < r["one_way_us"] < 1e6 or r["p10_us"] > r["one_way_us"]:
        sys.exit(f"FAIL: a median or 10th percentile out of order: {r}")
    if "same_cpu_share" in r and not 0 <= r["same_cpu_share"] <= 1:
        sys.exit(f"FAIL: a share outside [0, 1]: {r}")
    if r["kind"].endswith("_idle_cpu"):
        if r["p90_us"] < r["one_way_us"] or r["waker_cpu"] == r["waiter_cpu"]:
            sys.exit(f"FAIL: an idle-CPU line out of order: {r}")
        for key in ("cpuidle_driver", "cpuidle_governor", "guest_halt_poll_ns"):
            if key not in r:
                sys.exit(f"FAIL: no {key}: {r}")
bad = subprocess.run([bench, "--idle-gaps-us", "1"], capture_output=True, text=True)
if bad.returncode == 0 or "--idle-gaps-us" not in bad.stderr + bad.stdout:
    sys.exit(f"FAIL: a gap of 1 us was not refused naming the flag: {bad.returncode}")
print("ok")
