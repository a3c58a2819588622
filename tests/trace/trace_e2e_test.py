#!/usr/bin/env python3
"""`troupe trace` on what the runtime records: a 1F1B run with p = 4 and
m = 8, in one process (`troupe train --trace DIR`) and one process per rank
(`troupe launch --trace DIR`).

    trace_e2e_test.py TROUPE WORKDIR CASE

Cases:
  flows [launch]  the merged trace has exactly one flow per activation and
                  gradient message (3 boundaries x 8 micro-batches x 2
                  directions x 3 steps = 144) and nothing unmatched
  bubble          fixed-cost ops (--debug-op-cost 20:40): the measured
                  bubble within 2 points of (p-1)/(m+p-1) = 3/11
  stall [launch]  stage 2 never begins step 2 (--debug-stall-stage 2:2):
                  the flight recorder's files name rank 2 as the stalled one
Prints "OK: ..." or "FAIL: ..." and exits 0 or 1.
"""
import json
import os
import re
import shutil
import subprocess
import sys
os.environ.setdefault("TROUPE_DEVICE", "cpu")  # the tests pin the device, as ctest does

TROUPE, WORK, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
LAUNCH = "launch" in sys.argv[4:]
FLAGS = ["--model", "tiny", "--pp", "4", "--micro-batch-size", "1", "--global-batch-size", "8"]
P, M = 4, 8


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(args, timeout=300):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout


def train(name, *extra):
    """Runs training (train or launch); returns (exit code, output, run dir)."""
    run_dir = os.path.join(WORK, name + "-run")
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [TROUPE, "launch" if LAUNCH else "train", *FLAGS, *extra]
    if LAUNCH:
        cmd += ["--run-dir", run_dir]
    rc, out = run(cmd)
    return rc, out, run_dir


def case_flows():
    d = os.path.join(WORK, "flows-launch" if LAUNCH else "flows")
    shutil.rmtree(d, ignore_errors=True)
    rc, out, _ = train("flows", "--steps", "3", "--trace", d)
    if rc != 0:
        fail("training exited %d\n%s" % (rc, out))
    j = os.path.join(WORK, "flows.json")
    rc, summary = run([TROUPE, "trace", d, "-o", j])
    if rc != 0:
        fail("troupe trace exited %d\n%s" % (rc, summary))
    events = json.load(open(j))["traceEvents"]
    flows = [e for e in events if e["ph"] == "s" and e["name"] in ("activation", "gradient")]
    want = (P - 1) * M * 2 * 3
    # every send of an activation or gradient in the rank files
    sends = 0
    for f in os.listdir(d):
        if f.endswith(".trace.jsonl"):
            for line in open(os.path.join(d, f)).read().splitlines()[1:]:
                e = json.loads(line)
                sends += e["k"] == "send" and e.get("msg") in ("activation", "gradient")
    other = json.load(open(j))["otherData"]
    if sends != want or len(flows) != want or other["unmatched_messages"] != 0:
        fail("%d activation/gradient sends, %d flows (want %d each), %d unmatched\n%s" %
             (sends, len(flows), want, other["unmatched_messages"], summary))
    # Perfetto needs the slices of a thread to nest, and a flow's ends to
    # lie inside a slice of their thread.
    by_thread = {}
    for e in events:
        if e["ph"] == "X":
            by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    for key, slices in by_thread.items():
        slices.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in slices:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + 1e-6:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + 1e-6:
                fail("thread %s: '%s' overlaps '%s' without nesting" % (key, e["name"], stack[-1]["name"]))
            stack.append(e)
    for e in events:
        if e["ph"] in ("s", "f") and not any(
                x["ts"] - 1e-6 <= e["ts"] <= x["ts"] + x["dur"] + 1e-6
                for x in by_thread.get((e["pid"], e["tid"]), [])):
            fail("flow %s's '%s' is in no slice of its thread %s" % (e["id"], e["ph"], e["tid"]))
    m = re.search(r"uncertainty up to ([0-9.]+) ms", summary)
    print("OK: %d flows for %d messages, none unmatched; clock uncertainty %s ms" %
          (len(flows), want, m.group(1) if m else "?"))


def case_bubble():
    d = os.path.join(WORK, "bubble")
    shutil.rmtree(d, ignore_errors=True)
    rc, out, _ = train("bubble", "--steps", "3", "--debug-op-cost", "20:40", "--trace", d)
    if rc != 0:
        fail("training exited %d\n%s" % (rc, out))
    rc, summary = run([TROUPE, "trace", d])
    m = re.search(r"bubble: measured ([0-9.]+)% .*theory \(p-1\)/\(m\+p-1\) = 3/11 = ([0-9.]+)%", summary)
    if rc != 0 or not m:
        fail("no bubble line (exit %d)\n%s" % (rc, summary))
    measured, theory = float(m.group(1)), float(m.group(2))
    if abs(measured - theory) > 2.0:
        fail("bubble %.1f%%, theory %.1f%%: more than 2 points apart\n%s" % (measured, theory, summary))
    print("OK: bubble %.1f%%, theory %.1f%% (within 2 points)" % (measured, theory))


def case_stall():
    name = "stall-launch" if LAUNCH else "stall"
    flight = os.path.join(WORK, name + "-flight")
    shutil.rmtree(flight, ignore_errors=True)
    extra = ["--steps", "3", "--debug-stall-stage", "2:2", "--stall-timeout", "1"]
    if not LAUNCH:
        extra += ["--flight-dir", flight]
    rc, out, run_dir = train(name, *extra)
    if rc == 0:
        fail("a stalled run exited 0\n" + out)
    m = re.search(r"flight recorder: (\S+) \(rank-", out)
    if not m:
        fail("the failure message names no flight recorder directory\n" + out)
    rc, analysis = run([TROUPE, "trace", m.group(1)])
    want = "likely stalled: rank 2 (0,2,0)"
    if rc != 0 or want not in analysis or "has not begun step 2" not in analysis:
        fail("no '%s ... has not begun step 2' (exit %d)\n%s" % (want, rc, analysis))
    if analysis.count("likely stalled:") != 1:
        fail("more than one likely stalled rank\n" + analysis)
    print("OK: " + [l for l in analysis.splitlines() if l.startswith("likely stalled")][0])


os.makedirs(WORK, exist_ok=True)
cases = {"flows": case_flows, "bubble": case_bubble, "stall": case_stall}
if CASE not in cases:
    fail("unknown case " + CASE)
cases[CASE]()
