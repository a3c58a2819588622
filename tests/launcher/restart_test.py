#!/usr/bin/python3
"""`troupe launch --max-restarts`: a worker killed with SIGKILL at a seeded
moment -- just before a save, while the ranks write it, just after it is
committed -- and the job starts again from the newest complete checkpoint
and ends with metrics bitwise equal to an uninterrupted run and the same
final weights, byte for byte.

  restart_test.py TROUPE WORKDIR kills SEED TRIALS   trials with the phases in turn
  restart_test.py TROUPE WORKDIR elastic             hostB's agent killed; the job
                                                     goes on on hostA with dp 1
  restart_test.py TROUPE WORKDIR policy              a failure that is not a rank's
                                                     death (a stage that throws) ends the
                                                     job; a restart never resumes from
                                                     another run's checkpoint in --save
  restart_test.py TROUPE WORKDIR sigterm train|launch  --exit-signal-handler: SIGTERM
                                                     mid-run saves after that step and
                                                     exits 0; resuming from it ends
                                                     bitwise equal to the straight run

Each trial prints its seed, its kill point and what it measured: the time
from the kill to the job training again. (`scripts/bench restart` runs 20.)
"""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
os.environ.setdefault("TROUPE_DEVICE", "cpu")  # the tests pin the device, as ctest does

TROUPE, WORK = sys.argv[1], sys.argv[2]
os.makedirs(WORK, exist_ok=True)
STEPS, INTERVAL = 24, 6
FLAGS = ["--model", "tiny", "--global-batch-size", "8", "--micro-batch-size", "2",
         "--steps", str(STEPS), "--lr-warmup-iters", "3"]
LAYOUTS = [["--tp", "2", "--pp", "2"], ["--pp", "2", "--dp", "2"]]
STEP_LINE = re.compile(r"^step +(\d+)/")


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def reference(layout, tag):
    m, w = f"{WORK}/{tag}-straight.jsonl", f"{WORK}/{tag}-straight.safetensors"
    if not (os.path.exists(m) and os.path.exists(w)):
        r = subprocess.run([TROUPE, "train", *FLAGS, *layout, "--metrics-jsonl", m,
                            "--save-weights", w], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=240)
        if r.returncode != 0:
            fail("troupe train: " + r.stdout)
    return m, w


def same_as_straight(want_m, want_w, got, got_w, how):
    """Steps 1..STEPS with the straight run's loss, grad norm and lr, bit
    for bit, and its final weights byte for byte."""
    want = read_metrics(want_m)
    if [x["step"] for x in got] != list(range(1, STEPS + 1)):
        fail(f"the metrics have steps {[x['step'] for x in got]}")
    for a, b in zip(want, got):
        for key in ("loss", "grad_norm", "lr"):
            if a[key] != b[key]:
                fail(f"step {a['step']}: {key} {a[key]!r} straight, {b[key]!r} {how}")
    with open(want_w, "rb") as f1, open(got_w, "rb") as f2:
        if f1.read() != f2.read():
            fail(f"{got_w} differs from {want_w}")


def pids_of(run_dir, attempt_log=""):
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with open(f"{run_dir}/launch.json") as f:
                ranks = json.load(f)["ranks"]
            if all(r["pid"] for r in ranks) and all(attempt_log in r["log"] for r in ranks):
                return [r["pid"] for r in ranks]
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    fail(f"{run_dir}/launch.json never had every pid")


def rank_file_in_temp(save, step):
    """A rank has written its file of step's save, which is not committed."""
    try:
        for n in os.listdir(save):
            if n.startswith(f"iter_{step:07d}.tmp-") and \
                    any(f.startswith("rank_") for f in os.listdir(f"{save}/{n}")):
                return True
    except OSError:
        pass
    return False


def trial(rng, k):
    """One kill at a seeded point; returns the seconds from kill to training."""
    layout = LAYOUTS[k % len(LAYOUTS)]
    phase = ("before", "during", "after")[k % 3]
    save_step = INTERVAL * rng.randint(2, STEPS // INTERVAL - 1)  # a save with one before it
    world = 4
    victim_rank = rng.randrange(world)
    tag = "-".join(a.strip("-") for a in layout)
    want_m, want_w = reference(layout, tag)
    run_dir, save = f"{WORK}/trial{k}-run", f"{WORK}/trial{k}-ckpt"
    got_m, got_w = f"{WORK}/trial{k}.jsonl", f"{WORK}/trial{k}.safetensors"
    for p in (run_dir, save):
        shutil.rmtree(p, ignore_errors=True)
    for p in (got_m, got_w):
        if os.path.exists(p):
            os.remove(p)
    print(f"trial {k}: {' '.join(layout)}, SIGKILL to rank {victim_rank} {phase} the save of "
          f"step {save_step}", flush=True)
    # Each point of a save lasts 100 ms longer (model/checkpoint.cc), so
    # that a kill can land inside one.
    env = dict(os.environ, TROUPE_DEBUG_SAVE_DELAY="0.1")
    p = subprocess.Popen([TROUPE, "launch", *FLAGS, *layout, "--save", save, "--save-interval",
                          str(INTERVAL), "--max-restarts", "2", "--run-dir", run_dir,
                          "--metrics-jsonl", got_m, "--save-weights", got_w],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    pids = pids_of(run_dir)
    out, killed_at = [], None
    for line in p.stdout:
        out.append(line)
        m = STEP_LINE.match(line)
        hit = False
        if phase == "before" and m and int(m.group(1)) == save_step - 1:
            hit = True
        elif phase == "during" and m and int(m.group(1)) >= save_step:
            # The step is reported, the state copied, the writes begun: the
            # kill comes once one rank's file is there, before the commit.
            deadline = time.time() + 5
            while not rank_file_in_temp(save, save_step) and time.time() < deadline:
                time.sleep(0.005)
            hit = True
        elif phase == "after" and f"iter_{save_step:07d}" in line and "saved checkpoint" in line:
            hit = True
        if hit:
            os.kill(pids[victim_rank], signal.SIGKILL)
            killed_at = time.time()
            break
    if killed_at is None:
        p.kill()
        fail("the kill point never came:\n" + "".join(out))
    again = None
    for line in p.stdout:
        out.append(line)
        if again is None and "training again" in line:
            again = time.time() - killed_at
    p.wait(timeout=240)
    text = "".join(out)
    if p.returncode != 0:
        fail(f"the launcher exited {p.returncode}:\n{text[-4000:]}")
    # The restart resumes from the newest checkpoint committed before it
    # (a save still being written when the rank died never is).
    if "restart 1 of 2" not in text:
        fail(f"no 'restart 1 of 2':\n{text[-4000:]}")
    before = text[:text.index("restart 1 of 2")]
    committed = [int(x) for x in re.findall(r"saved checkpoint \S*iter_(\d+)", before)]
    want_resume = max(committed, default=0)
    said = f"resuming from step {want_resume} " if want_resume else "resuming from the start"
    if said not in text:
        fail(f"not 'resuming from step {want_resume}' (the newest committed):\n{text[-4000:]}")
    if phase == "during" and want_resume >= save_step:
        fail(f"the save of step {save_step}, killed while written, was committed")
    if phase == "after" and want_resume < save_step:
        fail(f"the save of step {save_step} was committed, but the restart resumed from "
             f"{want_resume}")
    if again is None:
        fail("no 'training again' line")
    same_as_straight(want_m, want_w, read_metrics(got_m), got_w, "with the restart")
    print(f"MEASURED: trial {k} ({phase}): resumed from step {want_resume}; training again "
          f"{again:.2f} s after the kill; {STEPS} steps bitwise equal, weights byte for byte",
          flush=True)
    return again


def kills(seed, trials):
    print(f"seed {seed} (rerun: restart_test.py TROUPE WORKDIR kills {seed} {trials})")
    rng = random.Random(seed)
    times = [trial(rng, k) for k in range(trials)]
    times.sort()
    print(f"MEASURED: kill to training again over {trials} trials: median "
          f"{times[len(times) // 2]:.2f} s, max {times[-1]:.2f} s")
    print(f"OK: {trials} restarts, each bitwise equal to the uninterrupted run")


AGENTS = ["--hosts", "hostA,hostB", "--nproc-per-node", "2", "--rsh", "env TROUPE_HOST={host}"]


def elastic():
    """pp2 dp2 over two pretend hosts; hostB's agent is killed after the save
    of step 12; the job goes on with dp 1 on hostA (the checkpoint resharded)
    and its losses are within 1e-5 of the uninterrupted dp 2 run."""
    layout = ["--pp", "2", "--dp", "2"]
    want_m, _ = reference(layout, "pp-2-dp-2")
    run_dir, save, got_m = f"{WORK}/elastic-run", f"{WORK}/elastic-ckpt", f"{WORK}/elastic.jsonl"
    for x in (run_dir, save):
        shutil.rmtree(x, ignore_errors=True)
    p = subprocess.Popen([TROUPE, "launch", *AGENTS, *FLAGS, *layout, "--save", save,
                          "--save-interval", str(INTERVAL), "--max-restarts", "1", "--elastic",
                          "--run-dir", run_dir, "--metrics-jsonl", got_m],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    for line in p.stdout:
        out.append(line)
        if "saved checkpoint" in line and "iter_0000012" in line:
            break
    port = json.load(open(f"{run_dir}/launch.json"))["agent_port"]
    victim = None
    for pid in os.listdir("/proc"):
        try:
            argv = open(f"/proc/{pid}/cmdline").read().split("\0")
        except OSError:
            continue
        if "agent" in argv and argv[argv.index("--master-port") + 1] == str(port) and \
                argv[argv.index("--index") + 1] == "1":
            victim = int(pid)
    if victim is None:
        fail("hostB's agent not found")
    os.kill(victim, signal.SIGKILL)
    out += list(p.stdout)
    p.wait(timeout=240)
    text = "".join(out)
    print(text[-3000:])
    if p.returncode != 0 or "now with --dp 1 on 1 host(s)" not in text:
        fail(f"exit {p.returncode}, or no restart with --dp 1 on one host")
    want, got = read_metrics(want_m), read_metrics(got_m)
    if [x["step"] for x in got] != list(range(1, STEPS + 1)):
        fail(f"the metrics have steps {[x['step'] for x in got]}")
    worst = 0.0
    for a, b in zip(want, got):
        rel = abs(a["loss"] - b["loss"]) / abs(a["loss"])
        worst = max(worst, rel)
        if rel > 1e-5:
            fail(f"step {a['step']}: loss {b['loss']!r} after the elastic restart, {a['loss']!r} "
                 f"straight (relative difference {rel:.2e})")
    print(f"OK: the elastic restart (dp 2 -> 1) matches the uninterrupted run within "
          f"{worst:.1e} relative over {STEPS} steps")


def agent_pids(run_dir):
    port = json.load(open(f"{run_dir}/launch.json")).get("agent_port")
    found = []
    for pid in os.listdir("/proc"):
        try:
            argv = open(f"/proc/{pid}/cmdline").read().split("\0")
        except OSError:
            continue
        if "agent" in argv and "--master-port" in argv and \
                argv[argv.index("--master-port") + 1] == str(port):
            found.append(int(pid))
    return found


def sigterm(how, agents=False):
    layout = ["--pp", "2", "--dp", "2"]
    want_m, want_w = reference(layout, "pp-2-dp-2")
    save, run_dir = f"{WORK}/sigterm-{how}-ckpt", f"{WORK}/sigterm-{how}-run"
    a_m, b_m, b_w = (f"{WORK}/sigterm-{how}-{x}" for x in ("a.jsonl", "b.jsonl", "b.safetensors"))
    for x in (save, run_dir):
        shutil.rmtree(x, ignore_errors=True)
    extra = ["--run-dir", run_dir] if how == "launch" else []
    if agents:
        extra += AGENTS
    # Slow writes, so that the signal finds the run training, not saving.
    p = subprocess.Popen([TROUPE, how, *FLAGS, *layout, "--save", save, "--exit-signal-handler",
                          "--metrics-jsonl", a_m, *extra], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    out = []
    for line in p.stdout:
        out.append(line)
        m = STEP_LINE.match(line)
        if m and int(m.group(1)) == 5:
            # As SLURM before a preemption: every process of the job hears it.
            workers = pids_of(run_dir) if how == "launch" else []
            if agents:
                workers += agent_pids(run_dir)
            p.send_signal(signal.SIGTERM)
            for w in workers:
                os.kill(w, signal.SIGTERM)
            t0 = time.time()
            break
    out += list(p.stdout)
    p.wait(timeout=120)
    took = time.time() - t0
    text = "".join(out)
    print(text[-1500:])
    steps = [int(x) for x in re.findall(r"^step +(\d+)/", text, re.M)]
    last = steps[-1]
    if p.returncode != 0 or f"ending after step {last} with a checkpoint" not in text or \
            last >= STEPS:
        fail(f"exit {p.returncode}; no 'ending after step {last} with a checkpoint' before the end")
    with open(f"{save}/latest_checkpointed_iteration.txt") as f:
        if f.read() != f"{last}\n":
            fail(f"the tracker does not name step {last}")
    print(f"MEASURED: {how}: SIGTERM at step 5, saved after step {last} and exited 0 in {took:.2f} s")
    r = subprocess.run([TROUPE, how, *FLAGS, *layout, "--load", save, "--metrics-jsonl", b_m,
                        "--save-weights", b_w, *(["--run-dir", run_dir + "-b"] if extra else [])],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    if r.returncode != 0:
        fail("the resume failed:\n" + r.stdout)
    same_as_straight(want_m, want_w, read_metrics(a_m) + read_metrics(b_m), b_w,
                     "stopped and resumed")
    print(f"OK: {how}: stopped by SIGTERM after step {last} with a checkpoint, resumed: "
          f"{STEPS} steps bitwise equal, weights byte for byte")


def policy():
    # A stage that throws: the rank reports it and exits 1 -- bad input or a
    # bug, which a restart would only repeat.
    save = f"{WORK}/policy-ckpt"
    shutil.rmtree(save, ignore_errors=True)
    r = subprocess.run([TROUPE, "launch", *FLAGS, "--pp", "2", "--save", save, "--max-restarts", "2",
                        "--debug-fail-stage", "1:3", "--run-dir", f"{WORK}/policy-run"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    if r.returncode == 0 or "restart 1 of" in r.stdout:
        fail(f"exit {r.returncode}; a stage's exception was restarted:\n{r.stdout[-3000:]}")
    print("OK: a stage that throws ends the job without a restart")
    # Another run's checkpoint (step 6) in --save; this job starts afresh
    # (no --load), a worker is killed before its first save: the restart
    # begins again at the start, not at the other run's step 6.
    foreign = f"{WORK}/policy-foreign"
    shutil.rmtree(foreign, ignore_errors=True)
    r = subprocess.run([TROUPE, "train", *FLAGS, "--pp", "2", "--exit-interval", "6", "--save",
                        foreign], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=240)
    if r.returncode != 0:
        fail("the other run failed:\n" + r.stdout)
    run_dir = f"{WORK}/policy-foreign-run"
    shutil.rmtree(run_dir, ignore_errors=True)
    p = subprocess.Popen([TROUPE, "launch", *FLAGS, "--pp", "2", "--save", foreign, "--save-interval",
                          "20", "--max-restarts", "1", "--run-dir", run_dir],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids = pids_of(run_dir)
    out = []
    for line in p.stdout:
        out.append(line)
        if STEP_LINE.match(line) and int(STEP_LINE.match(line).group(1)) == 3:
            os.kill(pids[1], signal.SIGKILL)
            break
    out += list(p.stdout)
    p.wait(timeout=240)
    text = "".join(out)
    if p.returncode != 0 or "resuming from the start" not in text or "resuming from step 6" in text:
        fail(f"exit {p.returncode}; the restart did not begin at the start:\n{text[-3000:]}")
    print("OK: the restart began at the start, not at another run's checkpoint in --save")
    # Two runs saving into one directory would remove each other's
    # temporaries: the second is refused while the first holds the lock.
    busy = f"{WORK}/policy-busy"
    shutil.rmtree(busy, ignore_errors=True)
    first = subprocess.Popen([TROUPE, "train", *FLAGS[:-4], "--steps", "100000", "--log-interval", "1",
                              "--save", busy],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in first.stdout:
        if STEP_LINE.match(line):
            break
    r = subprocess.run([TROUPE, "launch", *FLAGS, "--save", busy], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    first.kill()
    first.wait()
    if r.returncode == 0 or "another run is saving checkpoints there" not in r.stdout:
        fail(f"a second run saving into {busy}: exit {r.returncode}\n{r.stdout[-2000:]}")
    print("OK: a second run saving into the same directory is refused, naming it")


case = sys.argv[3]
if case == "kills":
    kills(int(sys.argv[4]), int(sys.argv[5]))
elif case == "elastic":
    elastic()
elif case == "policy":
    policy()
elif case == "sigterm":
    sigterm(sys.argv[4], sys.argv[5:] == ["agents"])
else:
    fail(f"unknown case {case}")
