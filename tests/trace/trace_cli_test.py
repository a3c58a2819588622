#!/usr/bin/env python3
"""`troupe trace` on simulated traces (make_trace.py): the figures it prints
against the schedule's theory, the Chrome JSON's flows, the message log,
the stall analysis, the pictures' step, bad input.

    trace_cli_test.py TROUPE WORKDIR CASE

Prints "OK: ..." or "FAIL: ..." (ctest matches them) and exits 0 or 1.
"""
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TROUPE, WORK, CASE = sys.argv[1], sys.argv[2], sys.argv[3]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def make(name, *args):
    d = os.path.join(WORK, name)
    shutil.rmtree(d, ignore_errors=True)
    subprocess.run([sys.executable, os.path.join(HERE, "make_trace.py"), d, *args], check=True)
    return d


def trace(*args, rc=0):
    p = subprocess.run([TROUPE, "trace", *args], capture_output=True, text=True, timeout=120)
    if p.returncode != rc:
        fail("troupe trace %s: exit %d (want %d)\n%s%s" % (" ".join(args), p.returncode, rc,
                                                            p.stdout, p.stderr))
    return p.stdout + p.stderr


def bubbles(out):
    m = re.search(r"bubble: measured ([0-9.]+)% \(mean over stages\), theory (.*) = ([0-9.]+)%", out)
    if not m:
        fail("no bubble line in\n" + out)
    return float(m.group(1)), m.group(2), float(m.group(3))


def case_bubble(schedule):
    # p = 4, m = 8, fixed-cost ops (10 ms forward, 20 ms backward), no
    # latency: the pipeline idles (p-1)/(m+p-1) = 3/11 of the step on every
    # stage for 1F1B and GPipe alike. Ranks' clocks 1 s apart (aligned by
    # their offsets: unaligned, nothing would line up).
    d = make("bubble_" + schedule, "--pp", "4", "--m", "8", "--schedule", schedule,
             "--offset-ms", "1000", "--steps", "3")
    out = trace(d)
    measured, formula, theory = bubbles(out)
    if formula != "(p-1)/(m+p-1) = 3/11" or abs(theory - 27.3) > 0.05:
        fail("theory %s = %s, want (p-1)/(m+p-1) = 3/11 = 27.3" % (formula, theory))
    if abs(measured - 27.3) > 0.05:
        fail("measured bubble %.1f%%, want 27.3%% (3/11)\n%s" % (measured, out))
    stages = re.findall(r"stage \d: busy ([0-9.]+) +idle ([0-9.]+) .* bubble ([0-9.]+)%", out)
    # per step: busy 8 x 30 ms = 240; span (m+p-1) x 30 = 330; idle 90
    if len(stages) != 4 or any(s != ("240.000", "90.000", "27.3") for s in stages):
        fail("per-stage figures %s, want 4 x (240.000, 90.000, 27.3)\n%s" % (stages, out))
    if "steps summarized (fully inside the trace): 1-3" not in out:
        fail("steps 1-3 not all summarized\n" + out)
    print("OK: %s bubble %.1f%% = theory %s" % (schedule, measured, formula))


def case_json():
    d = make("json", "--pp", "4", "--m", "8", "--steps", "2", "--latency-ms", "0.5")
    out_json = os.path.join(WORK, "json.trace.json")
    trace(d, "-o", out_json)
    j = json.load(open(out_json))
    starts = [e for e in j["traceEvents"] if e["ph"] == "s"]
    ends = {e["id"]: e for e in j["traceEvents"] if e["ph"] == "f"}
    # every activation (3 stage boundaries x 8 micro-batches) and gradient
    # (likewise) of 2 steps: 96 messages, each exactly one flow
    if len(starts) != 96 or len(ends) != 96 or len({e["id"] for e in starts}) != 96:
        fail("%d flow starts, %d ends; want 96 of each, unique ids" % (len(starts), len(ends)))
    for s in starts:
        f = ends.get(s["id"])
        if f is None or abs(f["pid"] - s["pid"]) != 1 or f["ts"] < s["ts"]:
            fail("flow %s: %s -> %s" % (s["id"], s, f))
    if j["otherData"]["unmatched_messages"] != 0:
        fail("unmatched messages: %s" % j["otherData"])
    names = sorted(e["args"]["name"] for e in j["traceEvents"]
                   if e["ph"] == "M" and e["name"] == "process_name")
    if names != ["rank %d (0,%d,0) host%d" % (r, r, r // 2) for r in range(4)]:
        fail("process names %s" % names)
    print("OK: 96 flows, one per message, none unmatched")


def case_messages():
    d = make("messages", "--pp", "4", "--m", "8", "--steps", "2", "--latency-ms", "0.5")
    out = trace(d, "--messages", "--rank", "1", "--kind", "gradient")
    lines = out.strip().splitlines()
    # rank 1 receives 8 gradients from rank 2 and sends 8 to rank 0, per step
    if len(lines) != 32 or any(" gradient " not in l or "latency 0.500 ms" not in l for l in lines):
        fail("want 32 gradient lines of latency 0.5 ms:\n" + out)
    times = [float(l.split()[0]) for l in lines]
    if times != sorted(times):
        fail("not in time order:\n" + out)
    mb3 = trace(d, "--messages", "--micro-batch", "3").strip().splitlines()
    if len(mb3) != 12 or any("mb 3 " not in l for l in mb3):  # 6 messages of mb 3 per step
        fail("--micro-batch 3: %d lines\n%s" % (len(mb3), "\n".join(mb3)))
    print("OK: message log filters and latencies")


def case_stall():
    # Stage 2 never begins step 2: the others wait for it.
    d = make("stall", "--pp", "4", "--m", "4", "--steps", "3", "--stall-stage", "2",
             "--stall-step", "2")
    out = trace(d)
    want = "likely stalled: rank 2 (0,2,0) host1: has not begun step 2 (waited for by ranks 1, 3)"
    if want not in out or out.count("likely stalled:") != 1:
        fail("want exactly one 'likely stalled:', '%s', in\n%s" % (want, out))
    if "steps summarized (fully inside the trace): 1\n" not in out or "skipped step 2" not in out:
        fail("step 2 should be skipped\n" + out)
    if "rank 1 waits for rank 2: receive of gradient mb 0 of step 2" not in out:
        fail("rank 1's open receive not reported\n" + out)
    print("OK: " + want)


def case_svg():
    d = make("svg", "--pp", "4", "--m", "8", "--steps", "2")
    svg = os.path.join(WORK, "svg.svg")
    trace(d, "--svg", svg, "--arrows")
    text = open(svg).read()
    if "step 2: 1f1b, p=4, m=8" not in text:
        fail("the default step is the last complete one (2)")
    arrows = text.count('marker-end="url(#arrow)"') - 1  # less the legend's
    blocks = len(re.findall(r"<g><title>", text))
    if arrows != 48 or blocks != 64:
        fail("%d arrows (want 48 messages), %d blocks (want 4 x 16 ops)" % (arrows, blocks))
    trace(d, "--svg", svg, "--step", "1")
    if "step 1:" not in open(svg).read() or 'url(#arrow)"/>' in open(svg).read().split("</defs>")[1]:
        fail("--step 1 without --arrows")
    print("OK: svg of the last complete step, 64 blocks, 48 arrows")


def case_bad():
    d = make("bad", "--pp", "2", "--m", "2", "--steps", "1")
    f = os.path.join(d, "rank-00001.trace.jsonl")
    lines = open(f).read().splitlines(True)
    open(f, "w").write("".join(lines[:3]) + lines[3][:10])
    out = trace(d, rc=1)
    if "rank-00001.trace.jsonl:4: the last line has no newline" not in out:
        fail("truncated file: " + out)
    open(f, "w").write("".join(lines[:2]) + "{oops\n")
    out = trace(d, rc=1)
    if "rank-00001.trace.jsonl:3: not JSON: '{oops'" not in out:
        fail("bad JSON: " + out)
    good_dir = make("bad_step", "--pp", "2", "--m", "2", "--steps", "1")
    out = trace(good_dir, "--step", "7", rc=1)
    if "--step 7: no event of that step in" not in out:
        fail("--step outside the trace: " + out)
    out = trace(good_dir, "-o", "/nonexistent/dir/x.json", rc=1)
    if "-o /nonexistent/dir/x.json" not in out or "cannot" not in out:
        fail("unwritable -o: " + out)
    p = subprocess.run([TROUPE, "trace", good_dir, "--rank", "1"], capture_output=True, text=True)
    if p.returncode == 0 or "--rank requires --messages" not in p.stdout + p.stderr:
        fail("--rank without --messages: exit %d %s%s" % (p.returncode, p.stdout, p.stderr))
    out = trace(os.path.join(WORK, "nonexistent"), rc=1)
    if "nonexistent: not a directory" not in out:
        fail("missing dir: " + out)
    out = trace(HERE, rc=1)
    if "no rank-NNNNN.trace.jsonl files" not in out:
        fail("dir without trace files: " + out)
    good = make("bad_metrics", "--pp", "2", "--m", "2", "--steps", "1")
    open(os.path.join(good, "metrics.jsonl"), "a").write('{"step": 2}\n')
    out = trace(good, "--html", os.path.join(WORK, "x.html"), rc=1)
    if "--metrics " not in out or "metrics.jsonl:2: no number \"loss\"" not in out:
        fail("bad metrics: " + out)
    if os.path.exists(os.path.join(WORK, "x.html")):
        fail("an HTML file was written despite the error")
    print("OK: bad input named by file and line, exit 1")


os.makedirs(WORK, exist_ok=True)
cases = {"bubble_1f1b": lambda: case_bubble("1f1b"), "bubble_gpipe": lambda: case_bubble("gpipe"),
         "json": case_json, "messages": case_messages, "stall": case_stall, "svg": case_svg,
         "bad": case_bad}
if CASE not in cases:
    fail("unknown case " + CASE)
cases[CASE]()
