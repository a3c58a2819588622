#!/usr/bin/python3
"""The runtime's own cost per pipeline hop, beside the floor under it, in one run.

  hop_bench.py TROUPE WAKEUP_BENCH COMM_BENCH EVENT_BENCH [--steps N] [--reps R]

A hop is from the op that makes an activation (or gradient) finishing on one
stage to the op that reads it starting on the next. Every op costs nothing
(--debug-op-cost 0:0:0: the real runtime around ops that enqueue no work),
one micro-batch a step, so a step of pp stages is 2(pp - 1) hops in a row
(the activation down, the gradient back) plus what does not depend on pp;
the slope of the step time over pp, halved, is one hop. Measured

  in_process_us     `troupe train --pp P`: the ranks as actors in one process
  cross_process_us  `troupe launch --pp P`: a worker process a stage, over UCX

at pp 1, 2, 4 and 8, each point the median step of R runs' medians; and
across processes once more with `troupe launch --bind-cores` (each worker
process on its share of the CPUs: from pp 2 on 2 cores one each, in turn;
launcher/cpu_binding.h), on a line of its own (`"bench": "hop_bound"`). The
slope holds everything a stage adds to a step, not only its hops: its
part of the step's start, its gradient buckets, its optimizer partition
and the parameters' way back, which on a 2-core host are serialised with
the hops. So the hop itself is also read from a trace of the pp 8 runs
(`--trace`): the time from an op's end on one stage to the next stage's
op's start, forwards and backwards, the median over every hop of R runs
(`direct_in_process_us`, `direct_cross_process_us`, on a line of their
own; the trace's own cost, a few recorder calls a hop, is in them), and
its parts (`"bench": "hop_segment"`: the sending stream thread, the
transport with the receiver's progress thread, the receive's callback,
the receiving stream thread's wake-up). The floor, measured in the same
run:

  ucx_one_way_us    UCX's own one-way tag latency for the same bytes between
                    two processes on this host (ucx_perftest tag_lat: half a
                    ping-pong)
  wakeup_us         one thread waking another asleep on an eventfd, one way
                    (bench/wakeup_bench.cc; the futex figure on its own line):
                    half a ping-pong, whose two threads the kernel often
                    runs on one CPU (`same_cpu_share`), then a switch
                    between threads. On their own lines (`eventfd_idle_cpu`,
                    `futex_idle_cpu`): a thread asleep on an idle CPU woken
                    from another, each wake-up timed alone, the CPU idle 10
                    us and 200 us before it, beside the cpuidle settings
                    that decide it on a virtual machine (a halted vCPU)

And anchors (`"bench": "hop_reference"`): the same pipeline with nothing
but its messages, a process a stage passing the bytes down and back, each
waiting for its input before it sends on, over troupe's own transport
alone (bench/comm_bench.cc `--mode chain`), OpenMPI (shared memory, its
waits polling) and Gloo (TCP, its waits asleep, below 64 KiB only;
bench/comm_mpi.cc and bench/comm_gloo.cc `chain`), at the same pp, the slope halved; the table
gives troupe's slope across over each.

What the slope is spent on (`"bench": "hop_cpu"`): the CPU time and the
context switches a step costs, every thread of every process, at pp 1 and
8 (a run of 3x the steps less the runs above: the start-up cancels out),
and what a stage adds (their difference over 7). On a 2-core host a deep
pipeline of zero-cost ops is bound by the CPU, not by the chain of hops:
a stage's CPU over the cores, per hop (cpu_bound_hop_us: over 2 x cores),
is then the hop figure the slope gives (in_process_us, cross_process_us).
(Across processes the progress threads' yield-polling uses what would be
idle, so there the CPU is an upper bound.)

The activation is B x T x C fp32 with B = 1 and C = 8 (so the parameters,
and the optimizer's work, stay negligible): T = 128 gives 4 KiB, T = 32768
1 MiB. One JSON line per size with the keys above, then the details.

The other hops on a step's critical path, each on a line of its own
(`"bench": "hop_path"`), in one process and between processes:

  step_loop        the coordinator's step loop: a rank's wait for the clip
                   factor, from its squared gradient norm sent to the
                   coordinator to the update back (the optimizer's `clip`
                   wait in the trace), at pp 1; a round trip, halved for the
                   per-hop figure. It is the coordinator's one round trip on
                   a step's path: the next step's begin_step rides on the
                   update when nothing is due between the steps, and the
                   shard takes it as it goes ready (its step end to its next
                   begin, `step_gap` in the details, is then 0)
  tp_all_reduce    a tensor-parallel group's all-reduce of a LayerNorm-sized
                   tensor (4 KiB: C = 1024 fp32, GPT-2 medium's), 2 ranks:
                   threads of one process over the in-process transport (as
                   `troupe train --tp 2`), processes of this host (as
                   `troupe launch`; through the shared memory segment since
                   f6e534d, before by UCX messages); bench/comm_bench.cc,
                   the mean of 5,000
  api_event        the embedding API's metrics event (troupe/troupe.h): from
                   the rank's step end to a subscriber's handler in the host
                   program (bench/event_bench.cc; in one process only: a
                   `troupe watch` feed is not on a step's path), the host's
                   actor system made with troupe::configure_actor_system,
                   the subscriber a scoped actor asleep in main's receive;
                   with an event-based actor of that system instead
                   (api_event_actor: no thread of the host's to wake); and
                   with CAF's default scheduler (api_event_caf_defaults)

Last, each target of the issue (4 KiB: under 20 us in one process, 60
across) against this run's median (`"bench": "hop_target"`), beside what
this run measured that bounds it (`bound_us`, `bound_is`): the CPU a stage
costs for a slope, UCX's one-way and a wake-up for the traced hop, two
wake-ups for the step loop's way, and for the API's event the subscriber's
wake-up on another CPU (`futex_idle_cpu`'s least 10th percentile: the
host's thread sleeps on a condition variable in its receive; on one CPU
two ping-pong wake-ups, the next step's stream's and the subscriber's).
The traced hop's and the step loop's wake-ups are the ping-pong's median,
a mix of switches beside the waker and wake-ups of the other CPU
(`same_cpu_share`). A bound is what the run measured of the path's parts,
not the path: the table says where one is below a limit the target
misses, or above the measure of a target met.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from report import free_port, perftest, run_ranks, slope  # noqa: E402
from hop_chains import GLOO_CHAIN_LIMIT_BYTES, chain_step_us  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("troupe")
ap.add_argument("wakeup_bench")
ap.add_argument("comm_bench")
ap.add_argument("event_bench")
ap.add_argument("--steps", type=int, default=300, help="steps per run (the first 50 are left out)")
ap.add_argument("--reps", type=int, default=3, help="runs per point (their medians' median)")
ap.add_argument("--only", choices=["hops", "paths"],
                help="the pipeline hops of each size, or the other paths (default both)")
ap.add_argument("--sizes", default="4096,1048576", help="activation bytes")
args = ap.parse_args()
WORK = tempfile.mkdtemp(prefix="troupe-hop-bench-")
C = 8
SKIP = 50
STAGES = (1, 2, 4, 8)
CORES = len(os.sched_getaffinity(0))


def emit(**kw):
    print(json.dumps(kw), flush=True)


def children_usage():
    """CPU seconds and context switches of the children waited for so far
    (a launcher's workers are its children, so theirs count too)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime, ru.ru_nvcsw + ru.ru_nivcsw


def run_usage(cmd):
    """Runs `cmd`; its CPU seconds and context switches, all processes."""
    before = children_usage()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"hop_bench: failed: {' '.join(cmd)}\n{r.stdout[-3000:]}")
    after = children_usage()
    return after[0] - before[0], after[1] - before[1]


def median_step_us(cmd, metrics):
    usage = run_usage(cmd)
    with open(metrics) as f:
        rows = [json.loads(line) for line in f]
    return statistics.median(row["step_s"] for row in rows[SKIP:]) * 1e6, usage


# The ways a pipeline runs: "train" (the ranks as actors of one process),
# "launch" (a worker process a rank, as `troupe launch` starts them by
# default) and "launch-bound" (the same with --bind-cores: each worker on
# its share of the CPUs: at pp 1 all of them, from pp 2 on a 2-core host one
# each, in turn by rank).
def troupe_argv(command):
    return [args.troupe, "train" if command == "train" else "launch"]


def launch_flags(command, tag):
    """What a `troupe launch` run adds: its run directory, and --bind-cores."""
    if command == "train":
        return []
    return ["--run-dir", f"{WORK}/{tag}"] + (["--bind-cores"] if command == "launch-bound" else [])


def flags_for(size, pp):
    T = size // (4 * C)
    return ["--model", "tiny", "--layers", "8", "--channels", str(C), "--heads", "1",
            "--seq-len", str(T), "--vocab-size", "16", "--make-vocab-size-divisible-by", "1",
            "--micro-batch-size", "1", "--global-batch-size", "1", "--pp", str(pp),
            "--debug-op-cost", "0:0:0", "--steps", str(args.steps)]


SEGMENTS = ("op_to_send", "send_to_received", "received_to_gate", "gate_to_op")


def traced_hops_us(command, size, pp, segments=None):
    """Every hop of a traced run's steps after SKIP: an op's end on one
    stage to the next stage's op's start (forward: s to s+1, backward:
    s+1 to s), in us. With `segments` (a dict of lists), each hop's parts
    too: the op's end to its send's start (the sending stream thread),
    the send's start to the receive's completion on the other stage (the
    transport, and across processes the receiver's progress thread), the
    completion to the gate's opening (the receive's callback), and the
    gate to the op's start (the receiving stream thread's wake-up)."""
    tag = f"{command}-{size}-traced"
    trace = f"{WORK}/{tag}-trace"
    extra = launch_flags(command, tag)
    r = subprocess.run([*troupe_argv(command), *flags_for(size, pp), "--trace", trace,
                        "--trace-steps", f"{SKIP}:{args.steps}", *extra],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"hop_bench: failed: traced {command}\n{r.stdout[-3000:]}")
    ops, msgs = {}, {}
    for rank in range(pp):
        with open(f"{trace}/rank-{rank:05d}.trace.jsonl") as f:
            for line in list(f)[1:]:
                e = json.loads(line)
                if e["k"] in ("forward", "backward"):
                    ops[(rank, e["step"], e["k"])] = e
                elif e["k"] in ("send", "recv") and e.get("msg") in ("activation", "gradient"):
                    msgs[(rank, e["step"], e["k"], e["msg"], e["peer"])] = e
                elif e["k"] == "wait" and e.get("actor") == "stream":
                    msgs[(rank, e["step"], "wait", e["what"], e["peer"])] = e
    hops = []
    for step in sorted({k[1] for k in ops}):
        for s in range(pp - 1):
            for kind, src, dst in (("forward", s, s + 1), ("backward", s + 1, s)):
                a, b = ops.get((src, step, kind)), ops.get((dst, step, kind))
                if not (a and b):
                    continue
                hops.append((b["b"] - a["e"]) / 1e3)
                msg = "activation" if kind == "forward" else "gradient"
                send = msgs.get((src, step, "send", msg, dst))
                recv = msgs.get((dst, step, "recv", msg, src))
                gate = msgs.get((dst, step, "wait", msg, src))
                if segments is not None and send and recv and gate:
                    for name, t0, t1 in (("op_to_send", a["e"], send["b"]),
                                         ("send_to_received", send["b"], recv["e"]),
                                         ("received_to_gate", recv["e"], gate["e"]),
                                         ("gate_to_op", gate["e"], b["b"])):
                        segments[name].append((t1 - t0) / 1e3)
    return hops


def reference_hop_us(size):
    """The same pipeline with nothing but its messages: pp processes pass
    `size` bytes down and back, each waiting for its input before it sends
    on, over troupe's own transport (comm/, UCX, as `troupe launch`'s
    workers), OpenMPI (shared memory, its waits polling) and Gloo (TCP, its
    waits asleep; below GLOO_CHAIN_LIMIT_BYTES only); the slope over the
    same pp, halved, as troupe's. {impl: us a hop} for those that ran at
    every pp."""
    hops = {}
    for impl, name in (("troupe-ucx", "comm_bench"), ("openmpi", "comm_mpi"),
                       ("gloo", "comm_gloo")):
        binary = os.path.join(os.path.dirname(os.path.abspath(args.comm_bench)), name)
        if not os.path.exists(binary):
            print(f"hop_bench: no {binary}: no {impl} reference", file=sys.stderr)
            continue
        if impl == "gloo" and size >= GLOO_CHAIN_LIMIT_BYTES:
            continue
        points = []
        for pp in STAGES:
            runs = [chain_step_us(impl, binary, size, pp, WORK) for _ in range(args.reps)]
            runs = [r for r in runs if r is not None]
            if not runs:
                break
            step = statistics.median(runs)
            emit(bench="hop_reference", impl=impl, activation_bytes=size, pp=pp,
                 step_us=round(step, 2), runs_us=runs)
            points.append((pp, step))
        if len(points) == len(STAGES):
            hops[impl] = slope(points) / 2
            emit(bench="hop_reference", impl=impl, activation_bytes=size,
                 hop_us=round(hops[impl], 2))
    return hops


def direct_hop_us(command, size):
    hops, segments = [], {name: [] for name in SEGMENTS}
    for _ in range(args.reps):
        hops += traced_hops_us(command, size, STAGES[-1], segments)
    for name, v in segments.items():
        if len(v) >= 2:
            q = statistics.quantiles(v, n=10)
            emit(bench="hop_segment", command=command, activation_bytes=size, pp=STAGES[-1],
                 segment=name, median_us=round(statistics.median(v), 2), p10_us=round(q[0], 2),
                 p90_us=round(q[-1], 2))
    return statistics.median(hops), statistics.quantiles(hops, n=10)


def hop_us(command, size):
    """The slope over pp, halved; and what a stage adds to a step's CPU."""
    points, usage = [], {}
    for pp in STAGES:
        flags = flags_for(size, pp)
        runs = []
        for k in range(args.reps):
            tag = f"{command}-{size}-pp{pp}-{k}"
            metrics = f"{WORK}/{tag}.jsonl"
            extra = launch_flags(command, tag)
            runs.append(median_step_us([*troupe_argv(command), *flags, "--metrics-jsonl", metrics,
                                        *extra], metrics))
        step = statistics.median(r[0] for r in runs)
        emit(bench="hop_step", command=command, activation_bytes=size, pp=pp, step_us=step,
             runs_us=[r[0] for r in runs])
        points.append((pp, step))
        usage[pp] = [r[1] for r in runs]
    return slope(points) / 2, stage_cpu(command, size, usage)


def stage_cpu(command, size, usage):
    """CPU time and context switches a step costs, every thread of every
    process, at pp 1 and the deepest pp: the difference of a run of 3x the
    steps and the median of the runs above (the start-up cancels out), per
    step. What a stage adds, over the cores and per hop, is the hop figure a
    step bound by the CPU would give (the slope follows it on 2 cores)."""
    per_step = {}
    for pp in (STAGES[0], STAGES[-1]):
        tag = f"{command}-{size}-pp{pp}-long"
        extra = launch_flags(command, tag)
        flags = flags_for(size, pp)
        flags[flags.index("--steps") + 1] = str(3 * args.steps)
        cpu, switches = run_usage([*troupe_argv(command), *flags, "--metrics-jsonl",
                                   f"{WORK}/{tag}.jsonl", *extra])  # (as the runs above)
        base_cpu = statistics.median(u[0] for u in usage[pp])
        base_switches = statistics.median(u[1] for u in usage[pp])
        per_step[pp] = ((cpu - base_cpu) / (2 * args.steps) * 1e6,
                        (switches - base_switches) / (2 * args.steps))
        emit(bench="hop_cpu", command=command, activation_bytes=size, pp=pp,
             cpu_us_per_step=round(per_step[pp][0], 1),
             switches_per_step=round(per_step[pp][1], 1))
    deep = STAGES[-1] - STAGES[0]
    cpu_stage = (per_step[STAGES[-1]][0] - per_step[STAGES[0]][0]) / deep
    switches_stage = (per_step[STAGES[-1]][1] - per_step[STAGES[0]][1]) / deep
    bound = cpu_stage / (2 * CORES)  # two hops a stage, a step's CPU spread over every core
    emit(bench="hop_cpu", command=command, activation_bytes=size,
         cpu_us_per_stage=round(cpu_stage, 1), switches_per_stage=round(switches_stage, 1),
         cores=CORES, cpu_bound_hop_us=round(bound, 1))
    return cpu_stage, switches_stage, bound


def trace_events(trace, rank=0):
    with open(f"{trace}/rank-{rank:05d}.trace.jsonl") as f:
        return [json.loads(line) for line in list(f)[1:]]


def step_events(trace, rank=0):
    return {e["step"]: e for e in trace_events(trace, rank) if e["k"] == "step"}


def step_loop_us(command):
    """At pp 1, every step after SKIP of R traced runs: rank 0's wait for the
    clip factor, and its step end to its next step's begin (us)."""
    clip, gaps = [], []
    for k in range(args.reps):
        tag = f"{command}-loop-{k}"
        trace = f"{WORK}/{tag}-trace"
        extra = launch_flags(command, tag)
        r = subprocess.run([*troupe_argv(command), *flags_for(4096, 1), "--trace", trace,
                            "--trace-steps", f"{SKIP}:{args.steps}", *extra],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            sys.exit(f"hop_bench: failed: traced {command} at pp 1\n{r.stdout[-3000:]}")
        clip += [(e["e"] - e["b"]) / 1e3 for e in trace_events(trace)
                 if e["k"] == "wait" and e.get("actor") == "optimizer" and e.get("what") == "clip"]
        steps = step_events(trace)
        gaps += [(steps[s + 1]["b"] - steps[s]["e"]) / 1e3 for s in sorted(steps) if s + 1 in steps]
    if not clip or not gaps:
        sys.exit(f"hop_bench: no clip waits or consecutive steps in the trace of {command} at pp 1")
    emit(bench="hop_path_detail", path="step_gap", command=command,
         median_us=round(statistics.median(gaps), 2),
         how="rank 0's step end to its next step's begin at pp 1 (median)")
    return clip


def tp_all_reduce_us(inproc):
    """The mean of 5,000 all-reduces of 4 KiB between 2 ranks, the median of R runs."""
    base = [args.comm_bench, "--size", "2", "--min-bytes", "4096", "--max-bytes", "4096",
            "--iters", "5000"]
    runs = []
    for _ in range(args.reps):
        if inproc:
            out = subprocess.run([*base, "--inproc"], check=True, capture_output=True,
                                 text=True).stdout
        else:
            port = str(free_port())
            out = run_ranks(lambda r: [*base, "--rank", str(r), "--port", port], 2)
        runs.append(json.loads(out.splitlines()[0])["time_us"])
    return statistics.median(runs)


def api_event_us(*extra):
    """The rank's step end to the subscriber's handler, every step after SKIP of R runs."""
    lags = []
    for k in range(args.reps):
        trace = f"{WORK}/event-{k}{'-'.join(extra)}-trace"
        out = subprocess.run([args.event_bench, "--trace", trace, "--steps", str(args.steps),
                              *extra], check=True, capture_output=True, text=True).stdout
        got = {row["step"]: row["received_ns"] for row in map(json.loads, out.splitlines())}
        steps = step_events(trace)
        lags += [(got[s] - e["e"]) / 1e3 for s, e in steps.items() if s > SKIP and s in got]
    return lags


def path_row(path, in_process, cross_process, how):
    emit(bench="hop_path", path=path, in_process_us=round(in_process, 2),
         cross_process_us=None if cross_process is None else round(cross_process, 2), how=how)
    return (path, in_process, cross_process)


out = subprocess.run([args.wakeup_bench], check=True, capture_output=True, text=True).stdout
wakeups = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
for w in wakeups:
    emit(**w)
wakeup = next(w["one_way_us"] for w in wakeups if w["kind"] == "eventfd")
# The least of a futex wake-up on another CPU (10th percentile, whichever
# idle gap); None where this process may run on one CPU only.
wakeup_idle_cpu = min((w["p10_us"] for w in wakeups if w["kind"] == "futex_idle_cpu"),
                      default=None)

if args.only != "paths":
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        in_process, cpu_in = hop_us("train", size)
        cross_process, cpu_across = hop_us("launch", size)
        bound, cpu_bound = hop_us("launch-bound", size)
        ucx = statistics.median(perftest("tag_lat", size)[0] for _ in range(args.reps))
        direct = {}
        for command in ("train", "launch", "launch-bound"):
            median, deciles = direct_hop_us(command, size)
            direct[command] = median
            emit(bench="hop_direct", command=command, activation_bytes=size, pp=STAGES[-1],
                 median_us=round(median, 2), p10_us=round(deciles[0], 2), p90_us=round(deciles[-1], 2))
        emit(bench="hop_direct", activation_bytes=size,
             direct_in_process_us=round(direct["train"], 2),
             direct_cross_process_us=round(direct["launch"], 2))
        emit(bench="hop_bound", activation_bytes=size, slope_us=round(bound, 2),
             traced_us=round(direct["launch-bound"], 2),
             how="across processes, `troupe launch --bind-cores`")
        row = {"hop_bytes": size, "in_process_us": round(in_process, 2),
               "cross_process_us": round(cross_process, 2), "ucx_one_way_us": round(ucx, 2),
               "wakeup_us": round(wakeup, 2)}
        rows.append(dict(row, direct_in=direct["train"], direct_across=direct["launch"],
                         cpu_in=cpu_in, cpu_across=cpu_across, bound=bound,
                         direct_bound=direct["launch-bound"], cpu_bound=cpu_bound,
                         reference=reference_hop_us(size)))
        print(json.dumps(row), flush=True)

    print()
    print("slope: a stage's whole cost to a step, per hop; traced: the hop itself (median)")
    print(f"{'bytes':>9s} {'in process':>20s} {'across':>20s} {'UCX 1-way':>10s} {'wake-up':>8s} "
          f"{'traced across - floor':>22s}")
    print(f"{'':9s} {'slope':>10s} {'traced':>9s} {'slope':>10s} {'traced':>9s}")
    for r in rows:
        floor = r["ucx_one_way_us"] + r["wakeup_us"]
        print(f"{r['hop_bytes']:9d} {r['in_process_us']:8.1f}us {r['direct_in']:7.1f}us "
              f"{r['cross_process_us']:8.1f}us {r['direct_across']:7.1f}us "
              f"{r['ucx_one_way_us']:8.1f}us {r['wakeup_us']:6.1f}us {r['direct_across'] - floor:20.1f}us")
    for r in rows:
        print(f"{r['hop_bytes']:9d} across, each worker process on its share of the {CORES} CPUs "
              f"(--bind-cores): slope {r['bound']:.1f}us, traced {r['direct_bound']:.1f}us")
    print()
    print("the same pipeline with nothing but its messages (a process a stage, the bytes down "
          "and back, no op, no step's control), per hop; troupe's slope across over it")
    for r in rows:
        ref = r["reference"]
        cells = [f"{impl} {ref[impl]:6.1f}us ({r['cross_process_us'] / ref[impl]:.2f}x)"
                 for impl in ("troupe-ucx", "openmpi", "gloo") if impl in ref]
        print(f"{r['hop_bytes']:9d}   " + ("   ".join(cells) if cells else "(none ran)"))
    print("  troupe-ucx: troupe's transport alone (comm/); openmpi: shared memory, its waits "
          "poll (yielding); gloo: TCP, its waits sleep")
    print()
    print(f"what a stage adds to a step's CPU (every thread, every process) and its context "
          f"switches; over {CORES} cores, per hop: the slope's figure "
          f"where the CPU bounds the step")
    print(f"{'bytes':>9s} {'in process':>32s} {'across':>32s} {'across, --bind-cores':>32s}")
    for r in rows:
        cells = [f"{c:7.1f}us {n:5.1f} sw -> {b:5.1f}us"
                 for c, n, b in (r["cpu_in"], r["cpu_across"], r["cpu_bound"])]
        print(f"{r['hop_bytes']:9d} {cells[0]:>32s} {cells[1]:>32s} {cells[2]:>32s}")

if args.only != "hops":
    paths = []
    loops = {c: step_loop_us(c) for c in ("train", "launch")}
    paths.append(path_row("step_loop", statistics.median(loops["train"]) / 2,
                          statistics.median(loops["launch"]) / 2,
                          "a rank's norm to the coordinator's update at pp 1, halved (median)"))
    paths.append(path_row("tp_all_reduce", tp_all_reduce_us(True), tp_all_reduce_us(False),
                          "4 KiB all-reduce of 2 ranks (mean of 5,000, median of runs)"))
    paths.append(path_row("api_event", statistics.median(api_event_us()), None,
                          "the rank's step end to the subscriber's handler (median), "
                          "the host's system made with troupe::configure_actor_system"))
    paths.append(path_row("api_event_actor",
                          statistics.median(api_event_us("--subscriber", "actor")), None,
                          "the same to an event-based subscriber, an actor of that system"))
    paths.append(path_row("api_event_caf_defaults",
                          statistics.median(api_event_us("--caf-defaults")), None,
                          "the same, the host's system with CAF's default scheduler"))
    print()
    print(f"{'other hops':>22s} {'in process':>11s} {'across':>9s}")
    for path, inp, cross in paths:
        across = "-" if cross is None else f"{cross:7.1f}us"
        print(f"{path:>22s} {inp:9.1f}us {across:>9s}")
# Each target beside what this run measured that bounds it (the issue's "or
# the measured floor that prevents it"): the transport and a wake-up; the
# CPU a stage costs a step over the cores (where the 2 cores are full, the
# slope follows it; across processes an upper bound, as the progress
# threads' yield-polling fills what would be idle); for the API's event,
# the subscriber's own wake-up on another CPU (docs/ARCHITECTURE.md).
targets = []
if args.only != "paths":
    for r in (r for r in rows if r["hop_bytes"] == 4096):
        targets.append(("hop in process (slope)", r["in_process_us"], 20, r["cpu_in"][2],
                        "the CPU a stage adds to a step, over the cores"))
        targets.append(("hop across (slope)", r["cross_process_us"], 60, r["cpu_across"][2],
                        "the CPU a stage adds to a step, over the cores (with yield-polling)"))
        targets.append(("hop across (traced)", r["direct_across"], 60,
                        r["ucx_one_way_us"] + r["wakeup_us"], "UCX one-way + one wake-up"))
        targets.append(("hop across, bound (slope)", r["bound"], 60, r["cpu_bound"][2],
                        "the same, with --bind-cores"))
        targets.append(("hop across, bound (traced)", r["direct_bound"], 60,
                        r["ucx_one_way_us"] + r["wakeup_us"], "UCX one-way + one wake-up"))
if args.only != "hops":
    for path, inp, cross in paths:
        if path == "step_loop":
            targets.append(("step loop in process", inp, 20, None, ""))
            targets.append(("step loop across", cross, 60, 2 * wakeup,
                            "two wake-ups a way, the frame reader's and a CAF worker's "
                            "(and a loopback TCP frame, not measured)"))
        elif path == "tp_all_reduce":
            targets.append(("TP all-reduce in process", inp, 20, None, ""))
            targets.append(("TP all-reduce across", cross, 60, None, ""))
        elif path == "api_event":
            if wakeup_idle_cpu is None:  # one CPU: both switches, one after the other
                targets.append(("API event", inp, 20, 2 * wakeup,
                                "two wake-ups: the next step's stream, then the subscriber"))
            else:
                targets.append(("API event", inp, 20, wakeup_idle_cpu,
                                "the subscriber's wake-up on another, idle CPU "
                                "(futex, 10th percentile)"))
        elif path == "api_event_actor":
            # No thread of the host's is woken, only a CAF worker (in turn:
            # busy, polling or asleep); not split further here.
            targets.append(("API event, to an actor", inp, 20, None, ""))
print()
print("targets (4 KiB; medians of this run), and what bounds each, measured here")
for name, got, limit, floor, why in targets:
    emit(bench="hop_target", target=name, measured_us=round(got, 2), limit_us=limit,
         met=got < limit, bound_us=None if floor is None else round(floor, 2), bound_is=why or None)
for name, got, limit, floor, why in targets:
    met = "met" if got < limit else "NOT met"
    below = "" if floor is None else f"  bound {floor:6.1f}us: {why}"
    if floor is not None and got >= limit and floor < limit:
        below += " (below the limit)"
    elif floor is not None and got < floor:
        below += " (above the measure: not a floor here)"
    print(f"{name:>26s} {got:7.1f}us < {limit:3d}us {met:>8s}{below}")
