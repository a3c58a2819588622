#!/usr/bin/python3
"""--log-interval: the progress line every N steps and after the last one,
averaged over the steps since the line before (checked against the metrics
JSONL, which keeps every step); the default by the run's length alone; no
live line when stdout is not a terminal, and one refreshed in place on a
terminal.

  log_interval_test.py TROUPE WORKDIR
"""
import json
import os
import pty
import re
import subprocess
import sys
os.environ.setdefault("TROUPE_DEVICE", "cpu")  # the tests pin the device, as ctest does

TROUPE, WORK = sys.argv[1], sys.argv[2]
os.makedirs(WORK, exist_ok=True)
LINE = re.compile(r"step +(\d+)/(\d+) \| loss ([0-9.]+) \| lr \S+ \| grad norm \S+ \| "
                  r"(\d+) tok/s \| ([0-9.]+) s/step")


def fail(why):
    print(f"FAIL: {why}")
    sys.exit(1)


def train(steps, *flags):
    jsonl = f"{WORK}/metrics-{steps}.jsonl"
    p = subprocess.run([TROUPE, "train", "--model", "tiny", "--steps", str(steps), "--threads",
                        "1", "--metrics-jsonl", jsonl, *flags], capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"troupe train --steps {steps} {' '.join(flags)}: exit {p.returncode}: {p.stderr}")
    with open(jsonl) as f:
        metrics = [json.loads(line) for line in f]
    return p.stdout, metrics


# --log-interval 4 over 10 steps: lines after steps 4, 8 and 10, each the
# mean of its window's losses and step times, and its tokens over its time.
out, metrics = train(10, "--log-interval", "4")
if len(metrics) != 10:
    fail(f"{len(metrics)} JSONL lines for 10 steps")
lines = [LINE.search(line) for line in out.splitlines() if LINE.search(line)]
if [int(m.group(1)) for m in lines] != [4, 8, 10]:
    fail(f"progress lines after steps {[int(m.group(1)) for m in lines]}, want 4, 8, 10")
first = 0
for m in lines:
    last = int(m.group(1))
    window = metrics[first:last]
    loss = sum(x["loss"] for x in window) / len(window)
    secs = sum(x["step_s"] for x in window)
    tokens = sum(x["tokens_per_s"] * x["step_s"] for x in window)
    if abs(float(m.group(3)) - loss) > 5e-5:
        fail(f"step {last}: loss {m.group(3)} printed, the window's mean is {loss:.6f}")
    if abs(float(m.group(5)) - secs / len(window)) > 5e-4:
        fail(f"step {last}: {m.group(5)} s/step printed, the window's mean is {secs / len(window)}")
    if abs(int(m.group(4)) - tokens / secs) > 1 + 1e-6 * tokens / secs:
        fail(f"step {last}: {m.group(4)} tok/s printed, the window's is {tokens / secs:.1f}")
    first = last
if "\r" in out or "\033[" in out:
    fail("a live line went to a stdout that is not a terminal")
if "a progress line every 4 steps" not in out:
    fail("the banner does not say the interval")

# A run that ends early (--exit-interval) still prints its last steps.
out, metrics = train(10, "--log-interval", "4", "--exit-interval", "6")
steps = [int(LINE.search(line).group(1)) for line in out.splitlines() if LINE.search(line)]
if steps != [4, 6] or len(metrics) != 6:
    fail(f"--exit-interval 6 printed lines after steps {steps}, want 4 and 6")

# The default: every step up to 100 steps; 250 steps: every 3rd (about
# 100 lines) and the last.
out, _ = train(100)
if sum(1 for line in out.splitlines() if LINE.search(line)) != 100:
    fail("100 steps did not print a line each")
out, metrics = train(250)
steps = [int(LINE.search(line).group(1)) for line in out.splitlines() if LINE.search(line)]
if steps != list(range(3, 250, 3)) + [250] or len(metrics) != 250:
    fail(f"250 steps printed lines after {steps[:5]}...{steps[-3:]} ({len(steps)} lines)")

# On a terminal, the steps between lines refresh one line in place.
pid, fd = pty.fork()
if pid == 0:
    os.execv(TROUPE, [TROUPE, "train", "--model", "tiny", "--steps", "6", "--threads", "1",
                      "--log-interval", "3"])
raw = b""
while True:
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        break
    if not chunk:
        break
    raw += chunk
os.waitpid(pid, 0)
text = raw.decode(errors="replace")
if "\r\033[Kstep 3/6" not in text or "\r\033[Kstep 6/6" not in text:
    fail(f"no line refreshed in place on a terminal: {text[-300:]!r}")
print(f"OK: lines after steps 4, 8, 10 averaged as the JSONL says; 100 steps 100 lines, "
      f"250 steps {len(steps)}; a live line on a terminal only")
