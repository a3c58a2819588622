#!/usr/bin/env python3
"""Writes the rank trace files of a simulated pipeline run, for the tests of
`troupe trace` (an independent model of the schedule, not troupe's code).

    make_trace.py DIR --pp 4 --m 8 --schedule 1f1b --fwd-ms 10 --bwd-ms 20 \
        [--latency-ms 0] [--steps 2] [--offset-ms 1000] [--stall-stage S --stall-step K]

One rank per stage (tp = dp = 1). Each stage walks its op list (GPipe: all
forwards then all backwards; 1F1B: min(p-s-1, m) warm-up forwards, then
forward/backward pairs, then the remaining backwards, as Megatron's
schedules.py). An op starts when its stream is free and its input has
arrived: an activation `latency` after the previous stage's forward of that
micro-batch ended, a gradient `latency` after the next stage's backward
ended. Receives are posted when the step begins. Rank r's clock is
r * offset behind the coordinator's (its header says so). With a stall,
stage S never begins step K; the others run until they wait, and their
waits, receives and sends to S stay open, as the flight recorder writes
them. metrics.jsonl gets one line per step (the keys of --metrics-jsonl).
"""
import argparse
import json
import os


def op_list(kind, p, s, m):
    if kind == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(p - s - 1, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warm, m)]


def simulate(a, start, stalled):
    """Start and end of every op of one step: {(s, 'F'|'B', mb): (b, e)}."""
    p, m = a.pp, a.m
    lists = [op_list(a.schedule, p, s, m) if s != stalled else [] for s in range(p)]
    pos, free, done = [0] * p, [start] * p, {}
    progress = True
    while progress:
        progress = False
        for s in range(p):
            if pos[s] == len(lists[s]):
                continue
            kind, mb = lists[s][pos[s]]
            if kind == "F":
                dep = (s - 1, "F", mb) if s > 0 else None
            else:
                dep = (s + 1, "B", mb) if s < p - 1 else None
            if dep is not None and dep not in done:
                continue
            ready = done[dep][1] + a.latency_ms if dep else start
            b = max(free[s], ready)
            e = b + (a.fwd_ms if kind == "F" else a.bwd_ms)
            done[(s, kind, mb)] = (b, e)
            free[s] = e
            pos[s] += 1
            progress = True
    return done, lists, pos


def tag(step, kind, mb):
    return "0x%x" % ((step << 16) | ((1 if kind == "activation" else 2) << 8) | mb)


def ns(ms):
    return int(round(ms * 1e6))


def step_events(a, k, start, stalled, out):
    """Appends step k's events to out[s] (ms, coordinator clock); returns its end."""
    p, m = a.pp, a.m
    done, lists, pos = simulate(a, start, stalled)
    end = max([e for _, e in done.values()] + [start])
    for s in range(p):
        ev = out[s]
        if s == stalled:
            continue
        for kind, mb in lists[s][: pos[s]]:
            b, e = done[(s, kind, mb)]
            ev.append({"k": "forward" if kind == "F" else "backward", "b": b, "e": e,
                       "step": k, "mb": mb, "chunk": 0, "vs": s})
            peer = s + 1 if kind == "F" else s - 1
            if 0 <= peer < p:
                msg = "activation" if kind == "F" else "gradient"
                arrived = peer != stalled  # a stalled stage takes nothing
                send = {"k": "send", "b": e, "e": e + a.latency_ms, "step": k, "peer": peer,
                        "msg": msg, "mb": mb, "chunk": 0, "bytes": 65536,
                        "tag": tag(k, msg, mb), "status": "ok"}
                if not arrived:
                    del send["e"]
                    send["open"] = True
                ev.append(send)
        # Receives, posted at the step's start: an activation from s-1 for
        # each forward, a gradient from s+1 for each backward.
        for kind, mb in op_list(a.schedule, p, s, m):
            peer = s - 1 if kind == "F" else s + 1
            if not 0 <= peer < p:
                continue
            msg = "activation" if kind == "F" else "gradient"
            src = done.get((peer, kind, mb))
            r = {"k": "recv", "b": start, "step": k, "peer": peer, "msg": msg, "mb": mb,
                 "chunk": 0, "bytes": 65536, "tag": tag(k, msg, mb), "status": "ok"}
            if src is None:
                r["open"] = True
            else:
                r["e"] = src[1] + a.latency_ms
            ev.append(r)
        blocked = pos[s] < len(lists[s])
        if blocked:
            kind, mb = lists[s][pos[s]]
            ev.append({"k": "wait", "b": max(done[x][1] for x in done if x[0] == s) if pos[s] else start,
                       "open": True, "step": k, "actor": "shard",
                       "what": "activation" if kind == "F" else "gradient",
                       "peer": s - 1 if kind == "F" else s + 1, "mb": mb, "chunk": 0})
            ev.append({"k": "step", "b": start, "open": True, "step": k, "pass": "train"})
        else:
            last = max(e for (st, _, _), (_, e) in done.items() if st == s)
            ev.append({"k": "step", "b": start, "e": last, "step": k, "pass": "train"})
    return end


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    ap.add_argument("--fwd-ms", type=float, default=10)
    ap.add_argument("--bwd-ms", type=float, default=20)
    ap.add_argument("--latency-ms", type=float, default=0)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--offset-ms", type=float, default=0)
    ap.add_argument("--stall-stage", type=int, default=-1)
    ap.add_argument("--stall-step", type=int, default=-1)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    out = [[] for _ in range(a.pp)]
    start, metrics = 0.0, []
    for k in range(1, a.steps + 1):
        stalled = a.stall_stage if k == a.stall_step else -1
        end = step_events(a, k, start, stalled, out)
        metrics.append({"step": k, "loss": 10.0 / k, "grad_norm": 1.0 + 0.1 * k,
                        "lr": 1e-4 * k / a.steps, "tokens_per_s": 1000.0 + 10 * k,
                        "step_s": (end - start) / 1e3, "elapsed_s": end / 1e3})
        start = end + 2.0  # the optimizer step and the next begin_step
        if stalled >= 0:
            break
    stall = a.stall_step > 0
    for s in range(a.pp):
        off = ns(s * a.offset_ms)
        header = {"format": "troupe-trace", "version": 1, "rank": s, "d": 0, "s": s, "t": 0,
                  "host": "host%d" % (s // 2), "pid": 1000 + s,
                  "layout": {"tp": 1, "pp": a.pp, "dp": 1, "v": 1}, "schedule": a.schedule,
                  "m": a.m, "reason": "stall" if stall else "end",
                  "message": "no progress for 1.0 s in step %d" % a.stall_step if stall else "",
                  "clock": {"offset_ns": off, "uncertainty_ns": 10000 if s else 0},
                  "capacity": 262144, "recorded": len(out[s]), "dropped": 0, "trace_steps": None}
        # Completion order, as the recorder writes: closed events by end,
        # open ones last.
        evs = sorted(out[s], key=lambda e: (e.get("open", False), e.get("e", 0)))
        with open(os.path.join(a.dir, "rank-%05d.trace.jsonl" % s), "w") as f:
            f.write(json.dumps(header) + "\n")
            for e in evs:
                e = dict(e)
                e["b"] = ns(e["b"]) - off
                if "e" in e:
                    e["e"] = ns(e["e"]) - off
                f.write(json.dumps(e) + "\n")
    with open(os.path.join(a.dir, "metrics.jsonl"), "w") as f:
        for row in metrics:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
