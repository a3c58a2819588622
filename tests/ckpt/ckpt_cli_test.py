#!/usr/bin/python3
"""Command-line tests of `troupe ckpt` and of --load's bad input.

  ckpt_cli_test.py TROUPE WORKDIR CASE

WORKDIR/ck is the shared checkpoint (`make` writes it; ctest's fixture):
tiny, tp2 pp2, 6 steps, saved after steps 3 and 6, with the run's metrics
and final weights (--save-weights) beside it.

Cases:
  make        the fixture: the tp2 pp2 run that saves WORKDIR/ck
  info        info of the save dir (the tracker's step 6) and of --iter 3:
              step, layout, every tensor, sizes, rank files, verified
  export      export of iter 3 + `train --init-weights` for 3 more steps ==
              `train --load ck/iter_0000003 --no-load-optim`: every step's
              loss, grad norm, lr and the final weights bitwise
  export_numpy  export of step 6, read here with json + numpy (no troupe
              code): Hugging Face GPT-2 names and shapes, every tensor
              bitwise the run's own --save-weights file
  convert     convert iter 3 to tp1 pp2 dp2 (and to 1 rank); resuming from
              the converted one == resuming from ck directly in that layout,
              bitwise (metrics and final weights)
  convert_more  its own checkpoints (V = 600, so the vocabulary padding
              differs by tp; tp2, and one rank): converted to tp1, to
              interleaved pp2 dp2 v2, and 1 rank to pp2 dp2; each resume
              bitwise equal to --load of the original
  truncated, corrupt (a parameter's byte), corrupt_state (Adam v's byte),
  missing_rank, coverage_gap (a piece left out of the manifest),
  manifest_model (a manifest of 3 layers over files of 4),
  tracker_missing_iter, not_a_checkpoint: a damaged copy of ck: `ckpt
              info`, `ckpt export`, `ckpt convert` and `train --load` each
              exit non-zero with an error naming the file (and tensor) and
              the problem, and no file under the copy changes, no output is
              written
  other_model `train --load ck` with another model: an error naming each
              difference; ck unchanged
Prints "OK: ..." or "FAIL: ..." (ctest's pass/fail expressions).
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
os.environ.setdefault("TROUPE_DEVICE", "cpu")  # the tests pin the device, as ctest does

RUN = ["--model", "tiny", "--steps", "6", "--micro-batch-size", "2", "--global-batch-size", "8"]


class Failure(Exception):
    pass


def run(troupe, args, cwd, expect_ok=True):
    p = subprocess.run([troupe] + args, cwd=cwd, capture_output=True, text=True, timeout=240)
    if expect_ok and p.returncode != 0:
        raise Failure(f"troupe {' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
    return p


def metrics(path):
    """Each step's (step, loss, grad_norm, lr): what must be bitwise equal."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in rows]


def same_run(work, a, b, steps):
    ma, mb = metrics(os.path.join(work, a + ".jsonl")), metrics(os.path.join(work, b + ".jsonl"))
    if [m[0] for m in ma] != steps or ma != mb:
        raise Failure(f"{a}.jsonl and {b}.jsonl differ (or lack steps {steps}):\n{ma}\n{mb}")
    with open(os.path.join(work, a + ".safetensors"), "rb") as f:
        wa = f.read()
    with open(os.path.join(work, b + ".safetensors"), "rb") as f:
        wb = f.read()
    if wa != wb:
        raise Failure(f"{a}.safetensors and {b}.safetensors differ")


def train(troupe, work, name, flags, base=None):
    run(troupe, ["train"] + (base or RUN) + flags + ["--metrics-jsonl", name + ".jsonl",
                                           "--save-weights", name + ".safetensors"], work)


def case_make(troupe, work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    train(troupe, work, "straight", ["--tp", "2", "--pp", "2", "--save", "ck", "--save-interval", "3"])
    return "tp2 pp2 checkpoint at steps 3 and 6"


def case_info(troupe, work):
    out = run(troupe, ["ckpt", "info", "ck"], work).stdout
    for want in [r"checkpoint ck/iter_0000006\n", r"step 6, consumed samples 48",
                 r"layout tp=2 pp=2 dp=1 1f1b \(4 rank files\)", r"writer troupe ",
                 r"wte\.weight +512x64 +param 0,1  master 0,1  adam_m 0,1  adam_v 0,1",
                 r"h\.3\.mlp\.c_fc\.weight +256x64 +param 2,3", r"rank_00003\.safetensors \d+ bytes",
                 r"sizes: param [0-9.]+ MiB; master", r"verified: \d+ pieces' CRC-32s; every element "
                 r"of 208 global tensors present"]:
        if not re.search(want, out):
            raise Failure(f"ckpt info ck: no /{want}/ in:\n{out}")
    out3 = run(troupe, ["ckpt", "info", "ck", "--iter", "3"], work).stdout
    if "step 3, consumed samples 24" not in out3:
        raise Failure(f"ckpt info ck --iter 3:\n{out3}")
    return "info of the tracker's checkpoint and of --iter 3"


def case_export(troupe, work):
    run(troupe, ["ckpt", "export", "ck", "--iter", "3", "--to", "m3.safetensors"], work)
    par = ["--tp", "2", "--pp", "2"]
    train(troupe, work, "finetune", par + ["--load", "ck/iter_0000003", "--no-load-optim"])
    train(troupe, work, "from_export", par + ["--init-weights", "m3.safetensors"])
    same_run(work, "finetune", "from_export", [1, 2, 3, 4, 5, 6])
    return "--init-weights of the export == --no-load-optim, 6 steps, bitwise"


def read_safetensors(path):
    """{name: array} and the metadata, parsed by the format's spec alone."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    out = {}
    for name, e in header.items():
        if e["dtype"] != "F32":
            raise Failure(f"{path}: {name} is {e['dtype']}, not F32")
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(body[b:end], dtype="<f4").reshape(e["shape"])
    return out, meta


def case_export_numpy(troupe, work):
    run(troupe, ["ckpt", "export", "ck", "--to", "m6.safetensors"], work)
    got, meta = read_safetensors(os.path.join(work, "m6.safetensors"))
    want, _ = read_safetensors(os.path.join(work, "straight.safetensors"))
    # Hugging Face GPT-2 (tiny: C=64, V=512, T=64, 4 layers; Conv1D (in, out)).
    shapes = {"wte.weight": (512, 64), "wpe.weight": (64, 64), "ln_f.weight": (64,),
              "h.0.attn.c_attn.weight": (64, 192), "h.3.mlp.c_proj.weight": (256, 64)}
    for name, shape in shapes.items():
        if name not in got or got[name].shape != shape:
            raise Failure(f"m6.safetensors: {name} is {got.get(name, np.zeros(0)).shape}, want {shape}")
    if meta.get("n_layer") != "4" or meta.get("n_embd") != "64":
        raise Failure(f"m6.safetensors: metadata {meta}")
    if sorted(got) != sorted(want):
        raise Failure(f"tensor names differ: {sorted(set(got) ^ set(want))}")
    for name in want:
        if got[name].shape != want[name].shape or not np.array_equal(got[name], want[name]):
            raise Failure(f"{name}: export differs from the run's --save-weights")
    return f"{len(got)} tensors read with numpy, bitwise the run's final weights"


def case_convert(troupe, work):
    run(troupe, ["ckpt", "convert", "ck", "--iter", "3", "--to", "ck2", "--tp", "1", "--pp", "2",
                 "--dp", "2"], work)
    info = run(troupe, ["ckpt", "info", "ck2"], work).stdout
    if "layout tp=1 pp=2 dp=1" in info or "layout tp=1 pp=2 dp=2 1f1b" not in info:
        raise Failure(f"ckpt info ck2:\n{info}")
    par = ["--pp", "2", "--dp", "2"]
    train(troupe, work, "resume_direct", par + ["--load", "ck/iter_0000003"])
    train(troupe, work, "resume_converted", par + ["--load", "ck2"])
    same_run(work, "resume_direct", "resume_converted", [4, 5, 6])
    # To one rank: the single-rank trainer's load of it.
    run(troupe, ["ckpt", "convert", "ck/iter_0000003", "--to", "ck1"], work)
    train(troupe, work, "resume1_direct", ["--load", "ck/iter_0000003"])
    train(troupe, work, "resume1_converted", ["--load", "ck1"])
    same_run(work, "resume1_direct", "resume1_converted", [4, 5, 6])
    # A second convert into the same place overwrites nothing.
    p = run(troupe, ["ckpt", "convert", "ck", "--iter", "3", "--to", "ck2", "--pp", "2"], work,
            expect_ok=False)
    if p.returncode == 0 or "ck2/iter_0000003 exists (not overwritten)" not in p.stderr:
        raise Failure(f"convert onto an existing checkpoint: exit {p.returncode}: {p.stderr}")
    return "tp2pp2 -> tp1pp2dp2 and -> 1 rank: resumes bitwise equal to --load of the original"


def case_convert_more(troupe, work):
    """Vocabulary padding and the interleaved schedule; a single-rank writer."""
    work = os.path.join(work, "convert_more")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    # V = 600: padded to 768 at tp 2 (a multiple of 128 x 2), 640 at tp 1.
    v600 = ["--model", "tiny", "--vocab-size", "600", "--steps", "4", "--micro-batch-size", "2",
            "--global-batch-size", "8"]
    run(troupe, ["train"] + v600 + ["--tp", "2", "--save", "ck", "--save-interval", "2"], work)
    run(troupe, ["train"] + v600 + ["--save", "s1", "--save-interval", "2"], work)
    pairs = [("ck", ["--tp", "1"], "Vp=640"),
             ("ck", ["--pp", "2", "--dp", "2", "--schedule", "interleaved", "--virtual-stages", "2"],
              "interleaved v=2"),
             ("s1", ["--pp", "2", "--dp", "2"], "tp=1 pp=2 dp=2")]
    for k, (src, layout, want) in enumerate(pairs):
        to = f"c{k}"
        run(troupe, ["ckpt", "convert", src, "--iter", "2", "--to", to] + layout, work)
        info = run(troupe, ["ckpt", "info", to], work).stdout
        if want not in info:
            raise Failure(f"ckpt info {to}: no '{want}' in:\n{info}")
        train(troupe, work, f"{to}_direct", layout + ["--load", f"{src}/iter_0000002"], v600)
        train(troupe, work, f"{to}_converted", layout + ["--load", to], v600)
        same_run(work, f"{to}_direct", f"{to}_converted", [3, 4])
    return "tp2 V=600 -> tp1 (padding 768 -> 640), -> interleaved pp2 dp2, 1 rank -> pp2 dp2: bitwise"


def tree_digest(root):
    """Every file under root with its SHA-256."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def flip_byte(path, tensor):
    """Flips one bit of the middle byte of `tensor`'s data (found by the header)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        b, e = json.loads(f.read(n))[tensor]["data_offsets"]
    offset = 8 + n + (b + e) // 2
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


def empty_save_dir(w):
    """A directory that is not a checkpoint: ck without its checkpoints and tracker."""
    bad = os.path.join(w, "bad")
    for d in os.listdir(bad):
        if d.startswith("iter_"):
            shutil.rmtree(os.path.join(bad, d))
    os.remove(os.path.join(bad, "latest_checkpointed_iteration.txt"))


def write_tracker(w, text):
    with open(os.path.join(w, "bad/latest_checkpointed_iteration.txt"), "w") as f:
        f.write(text)


def drop_record(w):
    """The manifest without rank 1's piece of param/h.1.attn.c_attn.weight."""
    path = os.path.join(w, "bad/iter_0000006/manifest.json")
    with open(path) as f:
        m = json.load(f)
    m["tensors"] = [t for t in m["tensors"] if not (t["file"] == "rank_00001.safetensors" and
                                                    t["name"] == "param/h.1.attn.c_attn.weight")]
    with open(path, "w") as f:
        json.dump(m, f)


def manifest_of_fewer_layers(w):
    """The manifest says 3 layers; the files hold 4."""
    path = os.path.join(w, "bad/iter_0000006/manifest.json")
    with open(path) as f:
        m = json.load(f)
    m["options"]["model"]["layers"] = 3
    with open(path, "w") as f:
        json.dump(m, f)


# Each damage: what it does to the copy `bad` of ck (in WORKDIR/<case>), and
# the error's regex.
RANK1 = "bad/iter_0000006/rank_00001.safetensors"
RANK2 = "bad/iter_0000006/rank_00002.safetensors"
DAMAGE = {
    "truncated": (lambda w: os.truncate(os.path.join(w, RANK1), 1000000),
                  re.escape(RANK1) + r": tensor '[a-z_]+/[a-z0-9_.]+': data .* lies outside the "
                  r"\d+ data bytes \(truncated file\?\)"),
    # A parameter's byte: what every command reads (a state's byte would not
    # stop an export, which reads the parameters only).
    "corrupt": (lambda w: flip_byte(os.path.join(w, RANK2), "param/h.2.mlp.c_fc.weight"),
                re.escape(RANK2) + r": tensor param/h\.2\.mlp\.c_fc\.weight is damaged \(its "
                r"CRC-32 differs from the manifest's\)"),
    "corrupt_state": (lambda w: flip_byte(os.path.join(w, RANK2), "adam_v/h.3.attn.c_proj.weight"),
                      re.escape(RANK2) + r": tensor adam_v/h\.3\.attn\.c_proj\.weight is damaged "
                      r"\(its CRC-32 differs from the manifest's\)"),
    "missing_rank": (lambda w: os.remove(os.path.join(w, "bad/iter_0000006/rank_00003.safetensors")),
                     r"bad/iter_0000006/rank_00003\.safetensors: missing \(a rank's file\)"),
    # c_attn is 192x64 = 12288 elements, split by rows over tp 2: half lost.
    "coverage_gap": (drop_record, r"bad/iter_0000006/manifest\.json: 6144 of 12288 elements of "
                     r"param/h\.1\.attn\.c_attn\.weight are in no rank's file"),
    # The first record of a 4th layer: rank 2 holds layers 2 and 3 (pp 2).
    "manifest_model": (manifest_of_fewer_layers,
                       r"bad/iter_0000006/rank_00002\.safetensors: tensor param/h\.3\.ln_1\.weight is "
                       r"not a parameter of the manifest's model \(tiny: L=3",
                       r"--load: bad/iter_0000006 holds another model: --layers 4 here, 3 in the "
                       r"checkpoint"),
    "tracker_missing_iter": (lambda w: write_tracker(w, "9\n"),
                             r"bad/latest_checkpointed_iteration\.txt names iteration 9 but "
                             r"bad/iter_0000009 is not a complete checkpoint"),
    "not_a_checkpoint": (empty_save_dir,
                         r"bad: not a checkpoint \(no manifest\.json\) and no "
                         r"latest_checkpointed_iteration\.txt naming one"),
}


def expect_error(troupe, work, args, regex, before):
    p = run(troupe, args, work, expect_ok=False)
    if p.returncode == 0:
        raise Failure(f"troupe {' '.join(args)} exited 0 on a damaged checkpoint")
    if not re.search(regex, p.stderr):
        raise Failure(f"troupe {' '.join(args)}: no /{regex}/ in: {p.stderr.strip()}")
    if tree_digest(os.path.join(work, "bad")) != before:
        raise Failure(f"troupe {' '.join(args)} changed files under bad/")
    return p.stderr.strip().splitlines()[-1]


def case_damage(troupe, work, name):
    damage, regex, *load_regex = DAMAGE[name]
    ck = os.path.join(work, "ck")
    work = os.path.join(work, name)  # (the cases may run side by side)
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(ck, os.path.join(work, "bad"))
    os.makedirs(os.path.join(work, "out"))
    damage(work)
    before = tree_digest(os.path.join(work, "bad"))
    line = expect_error(troupe, work, ["ckpt", "info", "bad"], regex, before)
    if name != "corrupt_state":  # (an export reads no optimizer state)
        expect_error(troupe, work, ["ckpt", "export", "bad", "--to", "out/m.safetensors"], regex,
                     before)
    expect_error(troupe, work, ["ckpt", "convert", "bad", "--to", "out", "--pp", "2"], regex, before)
    # (--load naming the --save directory with no checkpoint in it is the
    # first start of a job that restarts itself: not an error.)
    save = [] if name == "not_a_checkpoint" else ["--save", "bad"]
    expect_error(troupe, work, ["train"] + RUN + ["--tp", "2", "--pp", "2", "--load", "bad"] + save,
                 load_regex[0] if load_regex else "--load: " + regex, before)
    if os.path.exists(os.path.join(work, "out")) and os.listdir(os.path.join(work, "out")):
        raise Failure(f"a failed export or convert wrote {os.listdir(os.path.join(work, 'out'))}")
    return line


def case_other_model(troupe, work):
    before = tree_digest(os.path.join(work, "ck"))
    p = run(troupe, ["train", "--model", "tiny", "--steps", "6", "--micro-batch-size", "2",
                     "--global-batch-size", "8", "--channels", "32", "--heads", "2", "--layers", "2",
                     "--load", "ck", "--save", "ck"], work, expect_ok=False)
    want = (r"--load: ck/iter_0000006 holds another model: --layers 2 here, 4 in the checkpoint; "
            r"--channels 32 here, 64 in the checkpoint; --heads 2 here, 4 in the checkpoint")
    if p.returncode == 0 or not re.search(want, p.stderr):
        raise Failure(f"--load into another model: exit {p.returncode}: {p.stderr.strip()}")
    if tree_digest(os.path.join(work, "ck")) != before:
        raise Failure("the failed --load changed files under ck/")
    return p.stderr.strip()


def main():
    troupe, work, case = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3]
    cases = {"make": case_make, "info": case_info, "export": case_export,
             "export_numpy": case_export_numpy, "convert": case_convert,
             "convert_more": case_convert_more,
             "other_model": case_other_model}
    try:
        if case in DAMAGE:
            what = case_damage(troupe, work, case)
        elif case in cases:
            what = cases[case](troupe, work)
        else:
            raise Failure(f"unknown case {case}")
    except (Failure, OSError, subprocess.TimeoutExpired) as e:
        print(f"FAIL: {case}: {e}")
        return 1
    print(f"OK: {case}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
