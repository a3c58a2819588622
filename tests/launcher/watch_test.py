#!/usr/bin/python3
"""`troupe watch` and the attach example against a running `troupe launch`.

  watch_test.py TROUPE ATTACH WORKDIR

One launch job (pp2 x dp2, 150 steps, saves every 50); while it runs:
  - two `troupe watch`es attach with the token file launch wrote (RUNDIR/token,
    mode 0600); one is killed (SIGKILL) after a few steps, the other streams to
    the end: its progress lines carry the job's losses (JSONL, 4 decimals), the
    saves, and it exits 0 saying the job ended after the last step;
  - the attach example (examples/attach.cc, the public API's JobWatcher)
    streams every step after it attached, each loss bit for bit the JSONL's;
  - a watcher with a wrong token, and one with none, are refused (non-zero,
    the reason named);
then the job's metrics are compared with `troupe train` of the same flags
(nobody watching): bitwise equal, so the watchers, the killed one included,
did not disturb it.
"""
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
os.environ.setdefault("TROUPE_DEVICE", "cpu")  # the tests pin the device, as ctest does

TROUPE, ATTACH, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
STEPS = 150
FLAGS = ["--model", "tiny", "--global-batch-size", "32", "--micro-batch-size", "4", "--pp", "2",
         "--dp", "2", "--steps", str(STEPS), "--threads", "1"]


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


run_dir = os.path.join(WORK, "run")
launch = subprocess.Popen([TROUPE, "launch", *FLAGS, "--log-interval", "50", "--run-dir", run_dir,
                           "--save", os.path.join(WORK, "ckpt"), "--save-interval", "50"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
port = None
banner = []
deadline = time.time() + 60
while port is None and time.time() < deadline:
    line = launch.stdout.readline()
    if not line:
        break
    banner.append(line)
    m = re.search(r"coordinator: [\d.]+:(\d+) \(watch it: troupe watch", line)
    if m:
        port = m.group(1)
if port is None:
    launch.kill()
    fail("no coordinator line in the launcher's banner:\n" + "".join(banner))
token_file = os.path.join(run_dir, "token")
mode = stat.S_IMODE(os.stat(token_file).st_mode)
if mode & 0o077:
    fail(f"{token_file} has mode {oct(mode)}: others may read the job token")


def start(args, env=None):
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)


watch = [TROUPE, "watch", "--master-port", port]
full = start([*watch, "--token-file", token_file, "--log-interval", "1"])
doomed = start([*watch, "--token-file", token_file, "--log-interval", "1"])
attach = start([ATTACH, "127.0.0.1", port, token_file])
with open(os.path.join(WORK, "wrong"), "w") as f:
    f.write("x" * 64 + "\n")
wrong = subprocess.run([*watch, "--token-file", os.path.join(WORK, "wrong")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
env = dict(os.environ)
env.pop("TROUPE_JOB_TOKEN", None)
none = subprocess.run(watch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                      timeout=60, env=env)

# The doomed watcher dies once it has shown three steps.
seen = 0
doomed_out = []
while seen < 3:
    line = doomed.stdout.readline()
    if not line:
        break
    doomed_out.append(line)
    if line.startswith("step "):
        seen += 1
doomed.send_signal(signal.SIGKILL)
doomed.wait()
if seen < 3:
    fail("the second watcher showed no steps:\n" + "".join(doomed_out))

try:
    launch_out, _ = launch.communicate(timeout=300)
    full_out, _ = full.communicate(timeout=60)
    attach_out, _ = attach.communicate(timeout=60)
except subprocess.TimeoutExpired:
    for p in (launch, full, attach):
        p.kill()
    fail("the job or a watcher did not end")
if launch.returncode != 0:
    fail(f"launch exited {launch.returncode}:\n{launch_out[-3000:]}")
metrics = jsonl(os.path.join(run_dir, "metrics.jsonl"))
if [m["step"] for m in metrics] != list(range(1, STEPS + 1)):
    fail("the job's metrics do not cover every step")
by_step = {m["step"]: m for m in metrics}

# troupe watch: every step after it attached, its loss as the JSONL's.
if full.returncode != 0:
    fail(f"troupe watch exited {full.returncode}:\n{full_out[-3000:]}")
first = re.search(r"^troupe watch: 127\.0\.0\.1:\d+: tiny: .*; tp=1 pp=2 dp=2 \(4 ranks\); "
                  rf"at step (\d+) of {STEPS}$",
                  full_out, re.M)
if not first:
    fail("troupe watch's first line:\n" + full_out[:500])
shown = [(int(a), float(b)) for a, b in re.findall(rf"^step +(\d+)/{STEPS} \| loss ([\d.]+)", full_out, re.M)]
start_step = int(first.group(1))
if [s for s, _ in shown] != list(range(start_step + 1, STEPS + 1)):
    fail(f"troupe watch showed steps {[s for s, _ in shown][:5]}... from step {start_step}")
for s, loss in shown:
    if f"{by_step[s]['loss']:.4f}" != f"{loss:.4f}":
        fail(f"step {s}: watch shows loss {loss}, the job's is {by_step[s]['loss']}")
saves = [int(s) for s in re.findall(r"^saved checkpoint .*/iter_(\d+)", full_out, re.M)]
if saves and saves[0] == start_step:
    saves = saves[1:]  # (attached at a save's step, before its commit)
if saves != [s for s in (50, 100, 150) if s > start_step]:
    fail(f"troupe watch showed saves {saves}")
if not full_out.rstrip().endswith(f"troupe watch: the job ended after step {STEPS}"):
    fail("troupe watch's last line:\n" + full_out[-300:])

# The attach example (the public API): losses bit for bit.
if attach.returncode != 0:
    fail(f"attach exited {attach.returncode}:\n{attach_out[-2000:]}")
streamed = [(int(a), float(b)) for a, b in re.findall(r"^step (\d+) loss (\S+)$", attach_out, re.M)]
a0 = int(re.search(rf"at step (\d+) of {STEPS}", attach_out).group(1))
if [s for s, _ in streamed] != list(range(a0 + 1, STEPS + 1)):
    fail(f"attach streamed steps {[s for s, _ in streamed][:5]}... from step {a0}")
for s, loss in streamed:
    if loss != by_step[s]["loss"]:
        fail(f"step {s}: attach got loss {loss!r}, the job's is {by_step[s]['loss']!r}")

# Refused without the token.
if wrong.returncode == 0 or "wrong job token" not in wrong.stdout:
    fail(f"a wrong token: exit {wrong.returncode}:\n{wrong.stdout}")
if none.returncode == 0 or "no job token" not in none.stdout:
    fail(f"no token: exit {none.returncode}:\n{none.stdout}")
if "the job token does not match" not in launch_out:
    fail("the launcher did not log the refused watcher")

# Undisturbed: the same run in one process, nobody watching.
train_jsonl = os.path.join(WORK, "train.jsonl")
r = subprocess.run([TROUPE, "train", *FLAGS, "--metrics-jsonl", train_jsonl],
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
if r.returncode != 0:
    fail("troupe train:\n" + r.stdout[-2000:])
reference = jsonl(train_jsonl)
for a, b in zip(metrics, reference):
    for k in ("loss", "grad_norm", "lr"):
        if a[k] != b[k]:
            fail(f"step {a['step']}: {k} {a[k]!r} under watch, {b[k]!r} in troupe train")
print(f"OK: troupe watch from step {start_step} and attach from step {a0} streamed to step {STEPS}; "
      f"a watcher killed at step {start_step + 3}ish; wrong and missing tokens refused; "
      f"the job's {STEPS} steps equal troupe train's bit for bit")
