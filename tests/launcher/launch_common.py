"""What tests/launcher/launch_test.py's cases share: running troupe, the
one-process reference run, the bitwise (or, on GPUs, close) comparison of
a distributed run's metrics and weights with it, and a long job mid-run
with its processes. Takes TROUPE and WORK from the test's command line
(launch_test.py TROUPE WORKDIR CASE ...)."""
import json
import os
import shutil
import subprocess
import sys
import time

TROUPE, WORK = sys.argv[1], sys.argv[2]
os.makedirs(WORK, exist_ok=True)
SMALL = ["--model", "tiny", "--global-batch-size", "8", "--micro-batch-size", "2"]
LONG = SMALL + ["--pp", "2", "--dp", "2", "--steps", "100000", "--log-interval", "1"]


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def run(args, **kw):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=kw.pop("timeout", 240), **kw)


def read_metrics(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError as e:
        fail(f"{path}: {e}")


def compare(want_path, got_path, want_weights=None, got_weights=None):
    want, got = read_metrics(want_path), read_metrics(got_path)
    if len(want) != len(got) or not want:
        fail(f"{len(want)} steps in one-process run, {len(got)} in the distributed run")
    for a, b in zip(want, got):
        for k in ("loss", "grad_norm", "lr", "val_loss", "global_batch_size", "consumed_samples"):
            if a.get(k) != b.get(k):  # the JSONL has 17 digits: the doubles exactly
                fail(f"step {a['step']}: {k} {a[k]!r} in one process, {b[k]!r} across processes")
    if want_weights:
        with open(want_weights, "rb") as f1, open(got_weights, "rb") as f2:
            if f1.read() != f2.read():
                fail(f"{got_weights} differs from {want_weights}")
    print(f"OK: {len(want)} steps bitwise equal" + (", weights byte for byte" if want_weights else ""))


def compare_close(want_path, got_path, tolerance):
    want, got = read_metrics(want_path), read_metrics(got_path)
    if len(want) != len(got) or not want:
        fail(f"{len(want)} steps in one-process run, {len(got)} in the distributed run")
    worst = 0.0
    for a, b in zip(want, got):
        for k in ("lr", "global_batch_size", "consumed_samples"):
            if a.get(k) != b.get(k):
                fail(f"step {a['step']}: {k} {a[k]!r} on the CPU, {b[k]!r} on the GPUs")
        for k in ("loss", "grad_norm"):
            rel = abs(a[k] - b[k]) / max(abs(a[k]), 1e-30)
            worst = max(worst, rel)
            if rel > tolerance:
                fail(f"step {a['step']}: {k} {a[k]!r} on the CPU, {b[k]!r} on the GPUs "
                     f"({rel:.2e} relative, more than {tolerance})")
    print(f"OK: {len(want)} steps within {tolerance} of the CPU (at most {worst:.2e} relative)")


def remove(*paths):
    """No output of an earlier run may stand in for this run's."""
    for p in paths:
        if os.path.exists(p):
            os.remove(p)


def reference(flags, tag):
    m, w = f"{WORK}/{tag}-train.jsonl", f"{WORK}/{tag}-train.safetensors"
    remove(m, w)
    if "--device" in flags:  # the reference is the CPU's
        at = flags.index("--device")
        flags = flags[:at] + flags[at + 2:]
    flags = [a for a in flags if not a.startswith("--device=")] + ["--device", "cpu"]
    r = run([TROUPE, "train", *flags, "--metrics-jsonl", m, "--save-weights", w])
    if r.returncode != 0:
        fail("troupe train: " + r.stdout)
    return m, w


def tag_of(flags):
    words = "-".join(os.path.basename(a.strip("-")) for a in flags)
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in words)[:80]


def pids_of(run_dir, timeout=60):
    """Every rank's pid from launch.json, once all are there."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(f"{run_dir}/launch.json") as f:
                ranks = json.load(f)["ranks"]
            if all(r["pid"] for r in ranks):
                return [r["pid"] for r in ranks]
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    fail(f"{run_dir}/launch.json never had every pid")


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def fresh(run_dir):
    """A run directory of this test run only (not a previous run's launch.json)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    return run_dir


def start_long(run_dir, extra=()):
    fresh(run_dir)
    p = subprocess.Popen([TROUPE, "launch", *extra, *LONG, "--run-dir", run_dir],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids = pids_of(run_dir)
    # Mid-run: wait for a few steps.
    seen = ""
    while "step " not in seen or seen.count("\n") < 15:
        line = p.stdout.readline()
        if not line:
            fail("the launcher ended before training:\n" + seen)
        seen += line
    return p, pids, seen


def finish(p, seen, start, limit, what):
    try:
        out, _ = p.communicate(timeout=limit + 30)
    except subprocess.TimeoutExpired:
        p.kill()
        fail(f"the launcher did not exit after {what}")
    took = time.time() - start
    out = seen + out
    print(out[-3000:])
    print(f"MEASURED: {what}: the launcher exited {p.returncode} after {took:.2f} s")
    if took > limit:
        fail(f"took {took:.2f} s (limit {limit} s)")
    return out


def check_gone(pids, extra=()):
    deadline = time.time() + 5
    while time.time() < deadline and any(alive(x) for x in list(pids) + list(extra)):
        time.sleep(0.05)
    left = [x for x in list(pids) + list(extra) if alive(x)]
    if left:
        fail(f"processes of the job still running: {left}")
    print(f"OK: none of the job's {len(pids) + len(extra)} processes is left")
