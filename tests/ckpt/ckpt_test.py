#!/usr/bin/python3
"""Command-line tests of checkpoints (--save, --load, --no-load-optim,
--keep-last) through `troupe train` and `troupe launch`.

  ckpt_test.py TROUPE WORKDIR CASE [ARGS...]

Cases:
  resume N M [launch] [slow] FLAGS...
        N+M steps straight (no --save) against N+M steps with --save-interval
        N, then --load DIR/iter_N to N+M (with `launch`: both checkpointed
        runs through `troupe launch`): loss, grad_norm, lr, val_loss and
        --fp16's loss_scale, skipped and skipped_steps (the straight run's
        the count of its skipped steps; a regression: the resumed run
        counted only its own) of every step bitwise equal, the final
        weights byte for byte, and the checkpointed run itself equal to
        the straight one. `slow`: the
        saving run pauses 0.3 s at each point of a save
        (TROUPE_DEBUG_SAVE_DELAY), so that its commit comes after the next
        steps (and evaluations) have run
  reshard N FLAGS_A... -- FLAGS_B...
        N+10 steps in layout A saving at N; --load DIR/iter_N in layout B to
        N+10: losses and grad norms within 1e-5 relative of A's steps N+1..
        N+10 (tests/compare_metrics.py)
  no_load_optim FLAGS...
        a run of N steps saves a checkpoint and --save-weights; --load DIR
        --no-load-optim for K steps must equal --init-weights of that weights
        file for K steps bitwise (an independent loader: parameters only,
        step 1's learning rate, fresh Adam moments), and differ from a
        resume
  keep_last FLAGS...
        --save-interval 2 --keep-last 2 over 8 steps: only iter 6 and 8 are
        left, the tracker says 8, and --load DIR resumes from 8
  bad_save FLAGS...
        --save naming a file, or a directory that cannot be made: a clear
        error naming --save and the path, non-zero, before any step
  crash SEED FLAGS...
        SIGKILL to `train --save --save-interval 2` inside a save's points
        (TROUPE_DEBUG_SAVE_DELAY makes each a 0.05 s pause that it announces;
        the kill lands a random, seeded part of it later): every point of
        the second save, and the first save's first point and its tracker;
        after each kill: no tracker, or one naming a complete checkpoint
        whose every tensor's CRC-32 (zlib, here) matches the manifest;
        resuming from it (--load DIR --save DIR) gives the straight run's
        metrics and weights bitwise, and leaves no temporary behind
  resave FLAGS...
        a run saves step 2; a new run from it (--no-load-optim) saves step
        2 again into the same directory and is killed while the old
        iter_0000002, the one the tracker names, is being replaced: the
        tracker must still name a complete checkpoint that loads
Each prints what it did and how long it took; "OK: " on success, "FAIL: ".
"""
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib
os.environ.setdefault("TROUPE_DEVICE", "cpu")  # the tests pin the device, as ctest does

TROUPE, WORK = sys.argv[1], sys.argv[2]
HERE = os.path.dirname(os.path.abspath(__file__))
COMPARE = os.path.join(HERE, "..", "compare_metrics.py")
KEYS = ("loss", "grad_norm", "lr", "val_loss", "loss_scale", "skipped", "skipped_steps")
os.makedirs(WORK, exist_ok=True)


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def run(args, env=None, check=True):
    t = time.time()
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=240, env=env)
    if check and r.returncode != 0:
        fail(f"{' '.join(args)} exited {r.returncode}:\n{r.stdout}")
    print(f"  {time.time() - t:5.2f}s  {' '.join(os.path.basename(a) if a == TROUPE else a for a in args)}")
    return r


def fresh(*paths):
    """No output of an earlier run may stand in for this run's."""
    for p in paths:
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.remove(p)
    return paths[0] if len(paths) == 1 else paths


def metrics(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError as e:
        fail(f"{path}: {e}")


def train(flags, tag, steps, extra=(), how="train", env=None):
    """One run; returns (metrics path, weights path)."""
    m, w = fresh(f"{WORK}/{tag}.jsonl", f"{WORK}/{tag}.safetensors")
    args = [TROUPE, how, *flags, "--steps", str(steps), "--metrics-jsonl", m, "--save-weights", w]
    if how == "launch":
        args += ["--run-dir", fresh(f"{WORK}/{tag}-run")]
    run(args + list(extra), env=env)
    return m, w


def bitwise(want_path, got_path, first, last, want_w=None, got_w=None):
    """Steps first..last of both files exactly equal (the JSONL has 17 digits)."""
    want = {r["step"]: r for r in metrics(want_path)}
    got = {r["step"]: r for r in metrics(got_path)}
    if sorted(got) != list(range(first, last + 1)) or any(s not in want for s in got):
        fail(f"{got_path} has steps {sorted(got)}, want {first}..{last} of {want_path}")
    for s in range(first, last + 1):
        for k in KEYS:
            if want[s].get(k) != got[s].get(k):
                fail(f"step {s}: {k} {want[s].get(k)!r} in {want_path}, {got[s].get(k)!r} in {got_path}")
    if want_w:
        with open(want_w, "rb") as a, open(got_w, "rb") as b:
            if a.read() != b.read():
                fail(f"{got_w} differs from {want_w}")
    vals = sum(1 for s in range(first, last + 1) if "val_loss" in got[s])
    return f"steps {first}..{last} bitwise ({vals} with val_loss)" + (", weights byte for byte" if want_w else "")


def counted(path):
    """Each step's skipped_steps is the count of skipped steps up to it."""
    total = 0
    for r in metrics(path):
        total += 1 if r.get("skipped") else 0
        if r.get("skipped_steps") != total:
            fail(f"{path}: step {r['step']}: skipped_steps {r.get('skipped_steps')!r}, "
                 f"but {total} steps so far say skipped")


def case_resume(args):
    n, m, flags = int(args[0]), int(args[1]), args[2:]
    how, env = "train", None
    while flags[0] in ("launch", "slow"):
        if flags[0] == "launch":
            how = "launch"
        else:
            env = dict(os.environ, TROUPE_DEBUG_SAVE_DELAY="0.3")
        flags = flags[1:]
    tag = f"resume-{how}"
    ck = fresh(f"{WORK}/{tag}-ck")
    want_m, want_w = train(flags, f"{tag}-straight", n + m)
    counted(want_m)
    saved_m, saved_w = train(flags, f"{tag}-saving", n + m, ["--save", ck, "--save-interval", str(n)],
                             how, env)
    what = bitwise(want_m, saved_m, 1, n + m, want_w, saved_w)
    got_m, got_w = train(flags, f"{tag}-resumed", n + m, ["--load", f"{ck}/iter_{n:07d}"], how)
    print(f"OK: saving run {what}; resumed from step {n}: {bitwise(want_m, got_m, n + 1, n + m, want_w, got_w)}")


def renumbered(path, first, out):
    """Steps first.. of `path` as steps 1.. (compare_metrics.py wants 1..n)."""
    rows = [r for r in metrics(path) if r["step"] >= first]
    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps(dict(r, step=r["step"] - first + 1)) + "\n")
    return out


def case_reshard(args):
    n = int(args[0])
    a, b = args[1:args.index("--")], args[args.index("--") + 1:]
    tag = "reshard"
    ck = fresh(f"{WORK}/{tag}-ck")
    want_m, _ = train(a, f"{tag}-a", n + 10, ["--save", ck, "--save-interval", str(n)])
    got_m, _ = train(b, f"{tag}-b", n + 10, ["--load", f"{ck}/iter_{n:07d}"])
    r = subprocess.run([sys.executable, COMPARE, renumbered(want_m, n + 1, f"{WORK}/{tag}-a-tail.jsonl"),
                        renumbered(got_m, n + 1, f"{WORK}/{tag}-b-tail.jsonl"), "--rtol", "1e-5",
                        "--steps", "10", "--keys", "loss,grad_norm"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(r.stdout)
    if r.returncode != 0:
        fail(f"layout B's steps {n + 1}..{n + 10} are not layout A's within 1e-5")
    print(f"OK: resharded at step {n}, 10 steps within 1e-5 of the original layout")


def case_no_load_optim(args):
    # (A resume must keep the LR schedule: fixed here, not --steps'.)
    args = [*args, "--lr-decay-iters", "10"]
    n, k = 3, 3
    ck = fresh(f"{WORK}/nlo-ck")
    _, w_n = train(args, "nlo-saving", n, ["--save", ck])  # saves iter_n and the weights at n
    want_m, want_w = train(args, "nlo-init-weights", k, ["--init-weights", w_n])
    got_m, got_w = train(args, "nlo-finetune", k, ["--load", ck, "--no-load-optim"])
    what = bitwise(want_m, got_m, 1, k, want_w, got_w)
    # The moments matter: a resume of the same checkpoint (optimizer state
    # loaded) ends elsewhere.
    res_m, _ = train(args, "nlo-resume", n + k, ["--load", ck])
    if metrics(res_m)[-1]["loss"] == metrics(got_m)[-1]["loss"]:
        fail("--no-load-optim ends where a resume does: the optimizer state was loaded")
    print(f"OK: --no-load-optim equals --init-weights of the step-{n} parameters: {what}")


def case_keep_last(args):
    # (A resume must keep the LR schedule: fixed here, not --steps'.)
    args = [*args, "--lr-decay-iters", "10"]
    ck = fresh(f"{WORK}/keep-ck")
    train(args, "keep", 8, ["--save", ck, "--save-interval", "2", "--keep-last", "2"])
    left = sorted(n for n in os.listdir(ck) if not n.startswith("."))  # (the lock)
    if left != ["iter_0000006", "iter_0000008", "latest_checkpointed_iteration.txt"]:
        fail(f"{ck} holds {left} after --keep-last 2")
    with open(f"{ck}/latest_checkpointed_iteration.txt") as f:
        if f.read() != "8\n":
            fail("the tracker does not say 8")
    r = run([TROUPE, "train", *args, "--steps", "9", "--load", ck])
    if f"resuming from {ck}/iter_0000008 (step 8" not in r.stdout or "step 9/9" not in r.stdout:
        fail("--load DIR did not resume from the tracker's iter_0000008:\n" + r.stdout)
    print(f"OK: --keep-last 2 left {left[:2]}, the tracker 8, and --load resumes from it")


def case_bad_save(args):
    afile = f"{WORK}/a-file"
    with open(afile, "w") as f:
        f.write("x")
    for bad in (afile, f"{afile}/ck", "/proc/troupe-ckpt-test"):
        t = time.time()
        r = run([TROUPE, "train", *args, "--steps", "3", "--save", bad], check=False)
        if r.returncode == 0 or f"--save {bad}" not in r.stdout or "step 1/" in r.stdout:
            fail(f"--save {bad}: want a clear error naming it before training, got exit "
                 f"{r.returncode}:\n{r.stdout}")
        print(f"  --save {bad}: exit {r.returncode} in {time.time() - t:.2f}s: {r.stdout.strip().splitlines()[-1]}")
    print("OK: an unusable --save is an error before training")


def verify_crcs(ck_dir):
    """Every tensor of the manifest against its bytes in the rank file (zlib
    here, not the code under test). Returns the number of tensors."""
    try:
        with open(f"{ck_dir}/manifest.json") as f:
            manifest = json.load(f)
        files = {}
        for t in manifest["tensors"]:
            if t["file"] not in files:
                with open(f"{ck_dir}/{t['file']}", "rb") as f:
                    data = f.read()
                (hlen,) = struct.unpack("<Q", data[:8])
                files[t["file"]] = (json.loads(data[8:8 + hlen]), data[8 + hlen:])
            header, body = files[t["file"]]
            b, e = header[t["name"]]["data_offsets"]
            if zlib.crc32(body[b:e]) != t["crc32"] or e - b != 4 * (t["end"] - t["begin"]):
                fail(f"{ck_dir}/{t['file']}: tensor {t['name']} does not match the manifest")
    except (OSError, ValueError, KeyError, struct.error) as e:
        fail(f"{ck_dir}: not a complete checkpoint: {e!r}")
    if sorted(files) != sorted(manifest["rank_files"]):
        fail(f"{ck_dir}: rank files {sorted(files)} but the manifest lists {manifest['rank_files']}")
    return len(manifest["tensors"])


def kill_at_point(args, env, point, pause):
    """Runs `args`, SIGKILLs it `pause` seconds after its point-th save
    point (TROUPE_DEBUG_SAVE_DELAY's lines, counted from 0); returns that
    point's line."""
    p = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = -1
    for line in p.stdout:
        if line.startswith("debug: save point: "):
            seen += 1
            if seen == point:
                time.sleep(pause)
                p.send_signal(signal.SIGKILL)
                break
    p.stdout.close()
    p.wait()
    if seen != point:
        fail(f"the run ended after {seen + 1} save points, before point {point}")
    return line.strip()[len("debug: save point: "):]


def case_crash(args):
    seed, flags = int(args[0]), args[1:]
    steps, delay = 8, 0.05
    rng = random.Random(seed)
    print(f"seed {seed}, TROUPE_DEBUG_SAVE_DELAY={delay}")
    want_m, want_w = train(flags, "crash-straight", steps)
    env = dict(os.environ, TROUPE_DEBUG_SAVE_DELAY=str(delay))
    ck = fresh(f"{WORK}/crash-ck")
    saving = [TROUPE, "train", *flags, "--steps", str(steps), "--save", ck, "--save-interval", "2"]
    points = [x for x in run(saving, env=env).stdout.splitlines() if x.startswith("debug: save point: ")]
    # Every point of the second save (step 4: a complete checkpoint of step
    # 2 exists), the first save's first (none yet) and its tracker.
    trials = [i for i, x in enumerate(points) if i == 0 or x.endswith("(2)")
              or "iter_0000004" in x or x.endswith("(4)")]
    print(f"  {len(points)} save points in a run; killing within each of points {trials}")
    for trial, point in enumerate(trials):
        fresh(ck)
        pause = rng.uniform(0, delay)
        what = kill_at_point(saving, env, point, pause)
        left = sorted(os.listdir(ck)) if os.path.isdir(ck) else []
        tracker = f"{ck}/latest_checkpointed_iteration.txt"
        step, tensors = 0, 0
        if os.path.exists(tracker):
            with open(tracker) as f:
                text = f.read()
            if not text.endswith("\n") or not text.strip().isdigit():
                fail(f"trial {trial}: the tracker holds {text!r}")
            step = int(text)
            tensors = verify_crcs(f"{ck}/iter_{step:07d}")
        print(f"  trial {trial}: kill {pause:.3f}s after point {point} ({what}): left {left}; "
              f"tracker {step or 'none'} ({tensors} tensors verified)")
        got_m, got_w = train(flags, f"crash-resumed-{trial}", steps, ["--load", ck, "--save", ck])
        bitwise(want_m, got_m, step + 1, steps, want_w, got_w)
        if any(".tmp-" in x for x in os.listdir(ck)):
            fail(f"trial {trial}: a temporary is left in {ck}: {os.listdir(ck)}")
    print(f"OK: {len(trials)} kills inside saves; each left a loadable checkpoint (or none) and the "
          "resume matched bitwise")


def case_resave(args):
    """A save over the very checkpoint the tracker names, killed inside."""
    flags = [*args, "--lr-decay-iters", "10"]  # (the resume keeps the LR schedule)
    env = dict(os.environ, TROUPE_DEBUG_SAVE_DELAY="0.05")
    ck = fresh(f"{WORK}/resave-ck")
    run([TROUPE, "train", *flags, "--steps", "2", "--save", ck])  # iter_0000002, the tracker 2
    again = [TROUPE, "train", *flags, "--steps", "4", "--save", ck, "--save-interval", "2", "--load", ck,
             "--no-load-optim"]  # a new run from its parameters: saves step 2 again
    points = [x for x in run(again, env=env).stdout.splitlines() if x.startswith("debug: save point: ")]
    replacing = [i for i, x in enumerate(points) if x.startswith("debug: save point: replacing")]
    if not replacing:
        fail("the second run did not replace iter_0000002:\n" + "\n".join(points))
    fresh(ck)
    run([TROUPE, "train", *flags, "--steps", "2", "--save", ck])
    what = kill_at_point(again, env, replacing[0], 0.025)
    with open(f"{ck}/latest_checkpointed_iteration.txt") as f:
        step = int(f.read())
    tensors = verify_crcs(f"{ck}/iter_{step:07d}")
    r = run([TROUPE, "train", *flags, "--steps", "3", "--load", ck])
    if f"resuming from {ck}/iter_0000002" not in r.stdout:
        fail("--load did not resume from iter_0000002:\n" + r.stdout)
    print(f"OK: killed at '{what}': the tracker names {step}, complete ({tensors} tensors), and it loads")


CASES = {"resume": case_resume, "reshard": case_reshard, "no_load_optim": case_no_load_optim,
         "keep_last": case_keep_last, "resave": case_resave, "bad_save": case_bad_save, "crash": case_crash}
if __name__ == "__main__":
    start = time.time()
    CASES[sys.argv[3]](sys.argv[4:])
    print(f"({time.time() - start:.1f}s)")
