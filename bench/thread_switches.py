#!/usr/bin/python3
"""The threads' context switches and CPU time a training step, by thread name.

  thread_switches.py TROUPE [--pp P] [--command train|launch] [--seconds S]
                     [--bind-cores]

Runs the zero-cost pipeline of `scripts/bench hop` (4 KiB activations, one
micro-batch a step, --debug-op-cost 0:0:0) for a long run, reads every
thread's voluntary_ctxt_switches from /proc twice, S seconds apart, and
divides by the steps done in between (the lines of --metrics-jsonl). Each
switch is a thread going to sleep, to be woken by another: the hand-offs
a step costs, which on 2 cores are most of a stage's share of the step
(thread names: gpu/thread_name.h; CAF's workers are caf.multiplexer).
Beside them, each thread's involuntary switches (preempted, or a yield
that let another thread run: the UCX progress thread's quiet phase) and
its time on a CPU (/proc's schedstat; 0 where the kernel has none).
With --command launch --bind-cores, each worker process runs on its share
of the CPUs (launcher/cpu_binding.h). Prints a header, one line per thread
name and one JSON line.
"""
import argparse
import collections
import json
import os
import subprocess
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("troupe")
ap.add_argument("--pp", type=int, default=8)
ap.add_argument("--command", choices=["train", "launch"], default="train")
ap.add_argument("--seconds", type=float, default=2.0)
ap.add_argument("--bind-cores", action="store_true",
                help="launch only: each worker bound to its share of the CPUs")
args = ap.parse_args()
work = tempfile.mkdtemp(prefix="troupe-switches-")
metrics = os.path.join(work, "metrics.jsonl")
cmd = [args.troupe, args.command, "--model", "tiny", "--layers", "8", "--channels", "8",
       "--heads", "1", "--seq-len", "128", "--vocab-size", "16",
       "--make-vocab-size-divisible-by", "1", "--micro-batch-size", "1",
       "--global-batch-size", "1", "--pp", str(args.pp), "--debug-op-cost", "0:0:0",
       "--steps", "1000000", "--metrics-jsonl", metrics]
if args.command == "launch":
    cmd += ["--run-dir", os.path.join(work, "run")] + (["--bind-cores"] if args.bind_cores else [])
elif args.bind_cores:
    ap.error("--bind-cores needs --command launch")
job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       start_new_session=True)


def processes():
    """The job's processes: the command and, for launch, its workers."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[3]) != job.pid and int(pid) != job.pid:
                    continue  # (field 5: the session; the workers are in the job's)
        except (OSError, ValueError, IndexError):
            continue
        out.append(pid)
    return out


HAS_SCHEDSTAT = os.path.exists("/proc/self/schedstat")


def sample():
    counts = {}
    for pid in processes():
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{pid}/task/{t}/comm") as f:
                    name = f.read().strip()
                with open(f"/proc/{pid}/task/{t}/status") as f:
                    status = f.read()
                switches = (int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0]),
                            int(status.split("\nnonvoluntary_ctxt_switches:")[1].split()[0]))
            except (OSError, ValueError, IndexError):
                continue  # (the thread ended in between)
            run_ns = 0  # (a kernel without schedstats)
            if HAS_SCHEDSTAT:
                try:
                    with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                        run_ns = int(f.read().split()[0])  # time on a CPU
                except (OSError, ValueError, IndexError):
                    continue  # (the thread ended in between)
            counts[(pid, t, name)] = (*switches, run_ns)
    steps = 0
    if os.path.exists(metrics):
        with open(metrics) as f:
            steps = sum(1 for _ in f)
    return counts, steps


try:
    time.sleep(3.0)  # past the start
    a, s0 = sample()
    time.sleep(args.seconds)
    b, s1 = sample()
finally:
    os.killpg(job.pid, 9)
    job.wait()
steps = s1 - s0
if steps <= 0:
    raise SystemExit("thread_switches: no steps were done (did the run start?)")
# By thread name: voluntary switches (a thread asleep, woken by another),
# involuntary ones (preempted, or a yield that let another run) and the
# time on a CPU (schedstat), each a step.
vol, invol, cpu = collections.Counter(), collections.Counter(), collections.Counter()
for key, v in b.items():
    if key in a:
        vol[key[2]] += v[0] - a[key][0]
        invol[key[2]] += v[1] - a[key][1]
        cpu[key[2]] += (v[2] - a[key][2]) / 1e3
bound = " --bind-cores" if args.bind_cores else ""
print(f"pp {args.pp} `troupe {args.command}{bound}`: {steps} steps in {args.seconds:.1f} s "
      f"({args.seconds * 1e6 / steps:.0f} us a step with the sampling); a step:")
print(f"  {'thread':18s} {'switches':>8s} {'preempted':>9s} {'CPU us':>8s}")
for name, v in vol.most_common():
    if v or cpu[name]:
        print(f"  {name:18s} {v / steps:8.1f} {invol[name] / steps:9.1f} {cpu[name] / steps:8.1f}")
total = sum(vol.values()) / steps
print(f"  {'all':18s} {total:8.1f} {sum(invol.values()) / steps:9.1f} "
      f"{sum(cpu.values()) / steps:8.1f}")
print(json.dumps({"bench": "thread_switches", "command": args.command, "pp": args.pp,
                  "bind_cores": args.bind_cores,
                  "steps": steps, "switches_per_step": round(total, 1),
                  "preempted_per_step": round(sum(invol.values()) / steps, 1),
                  "cpu_us_per_step": round(sum(cpu.values()) / steps, 1),
                  "by_thread": {k: round(v / steps, 1) for k, v in vol.items() if v},
                  "preempted_by_thread": {k: round(v / steps, 1) for k, v in invol.items() if v},
                  "cpu_us_by_thread": {k: round(v / steps, 1) for k, v in cpu.items() if v}}))
