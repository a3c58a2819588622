#!/usr/bin/python3
"""Command-line tests of `troupe launch` and `troupe worker`: one process per
rank, compared with `troupe train` (all ranks in one process), and what
happens when something goes wrong.

  launch_test.py TROUPE WORKDIR CASE [ARGS...]

Cases:
  equivalence FLAGS...  launch and train with FLAGS: losses, grad norms and
                        learning rates bitwise equal at every step, the saved
                        weights byte for byte the same (train runs on the
                        CPU: a --device in FLAGS is the launch's alone)
  gpus N FLAGS...       launch with --device cuda (FLAGS has it) where at least N
                        GPUs are, against train on the CPU: losses and grad
                        norms within 1e-4 relative (other sum orders; no
                        TF32), learning rates equal; exit 77 (skipped) with
                        fewer GPUs
  bind_cores FLAGS...   equivalence with `launch --bind-cores`: each rank's log
                        says it is bound to its local rank's share of the
                        CPUs this test may use (launcher/cpu_binding.h's
                        rule: a block each, or one each in turn where the
                        workers outnumber the CPUs), every local rank once
  agents FLAGS...       the same through one agent per (pretend) host, started
                        by an --rsh template
  torchrun FLAGS...     workers started with torchrun's variables (RANK,
                        WORLD_SIZE, MASTER_ADDR, MASTER_PORT), rank 0 hosting
                        the coordinator; compared with train
  mpirun FLAGS...       the same under Debian's OpenMPI
  kill_worker [FLAGS...]  SIGKILL to a worker mid-run: the launcher exits
                        non-zero within 5 s naming it, and no process is left
                        (FLAGS: more flags of the run, e.g. --device opaque,
                        whose pipeline waits in its links' streams)
  kill_agent            SIGKILL to an agent mid-run: the same
  stop_worker           SIGSTOP to a worker (hung, its socket open): the
                        heartbeats find it within 10 s, named, and everything
                        stops (the stopped process too)
  kill_launcher [agents]  SIGKILL to the launcher mid-run: every worker (and
                        agent) is gone within 5 s (PR_SET_PDEATHSIG; the
                        agents see the launcher's connection close)
  interrupt SIGNAL      SIGINT or SIGTERM to the launcher: everything stops
                        within 5 s, nothing is left, exit 128 + the signal
  stall                 a stage that never starts a step: the stall table and
                        the culprit line name it
  default_device ON|OFF  a launch on this host with neither --device nor
                        TROUPE_DEVICE: its workers get --device once, cuda
                        where troupe was built with CUDA (ON) and nvidia-smi
                        lists a GPU per worker, each of compute capability
                        8.0 or newer, else cpu; the table says it
  mixed_devices         two workers started as torchrun would, one with
                        --device cpu, one with --device opaque: both exit
                        non-zero within 60 s, naming both ranks' devices
  intruders [agents]    a worker without the token, random bytes and an absurd
                        length prefix at the coordinator's port (and the
                        agents' port): refused, and the run's result is the
                        reference's
Each prints what it measured (detection times) for the note.
"""
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
os.environ.setdefault("TROUPE_DEVICE", "cpu")  # the tests pin the device, as ctest does

from launch_common import (SMALL, TROUPE, WORK, check_gone, compare, compare_close,  # noqa: E402
                           fail, finish, fresh, pids_of, reference, remove, run, start_long,
                           tag_of)


def gpu_count():
    """The GPUs nvidia-smi lists, as many as CUDA_VISIBLE_DEVICES leaves."""
    try:
        r = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    n = sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        n = min(n, len([d for d in visible.split(",") if d.strip()]))
    return n


def on_gpus(need, flags):
    have = gpu_count()
    if have < need:
        print(f"SKIP: needs {need} GPUs; this machine has {have}")
        sys.exit(77)
    tag = tag_of(flags)
    want_m, _ = reference(flags, tag)
    got_m = f"{WORK}/{tag}-launch.jsonl"
    remove(got_m)
    r = run([TROUPE, "launch", "--nproc-per-node", str(need), *flags, "--run-dir",
             f"{WORK}/{tag}-run", "--metrics-jsonl", got_m])
    print(r.stdout)
    if r.returncode != 0:
        fail(f"troupe launch exited {r.returncode}")
    compare_close(want_m, got_m, 1e-4)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_and_compare(flags, extra, relative=False):
    """relative: the launcher runs in WORK and names its outputs relative to
    it (the agents start elsewhere: they must run the workers here)."""
    tag = tag_of(flags) + ("-" + tag_of(extra) if extra else "")
    want_m, want_w = reference(flags, tag)
    got_m, got_w = f"{WORK}/{tag}-launch.jsonl", f"{WORK}/{tag}-launch.safetensors"
    remove(got_m, got_w)
    if "--data-cache-path" in flags:  # the ranks build the sample index at once
        shutil.rmtree(flags[flags.index("--data-cache-path") + 1], ignore_errors=True)
    out = [f"{tag}-run", got_m, got_w]
    if relative:
        out = [os.path.relpath(x, WORK) for x in (f"{WORK}/{tag}-run", got_m, got_w)]
    r = run([TROUPE, "launch", *extra, *flags, "--run-dir", out[0], "--metrics-jsonl", out[1],
             "--save-weights", out[2]], cwd=WORK if relative else None)
    print(r.stdout)
    if r.returncode != 0:
        fail(f"troupe launch exited {r.returncode}")
    compare(want_m, got_m, want_w, got_w)
    # A job on this host: its workers reach the coordinator through its local
    # socket; on "hosts" (agents): over TCP.
    run_dir = out[0] if not relative else f"{WORK}/{out[0]}"
    want = "over TCP" if "--hosts" in extra else "through the coordinator's local socket"
    logs = [n for n in sorted(os.listdir(run_dir)) if n.startswith("rank-") and n.endswith(".log")]
    if not logs:
        fail(f"no rank logs in {run_dir}")
    for name in logs:
        with open(f"{run_dir}/{name}", errors="replace") as f:
            if f"the control channel {want}" not in f.read():
                fail(f"{name}: no 'the control channel {want}'")
    return run_dir


def cpu_list(cpus):
    """[0, 1, 2, 5] -> "0-2,5"."""
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def share_of(allowed, local, workers):
    """launcher/cpu_binding.h's rule: the CPUs by package, then core (sysfs'
    topology), a block each; or, more workers than CPUs, one each in turn,
    every core's first hardware thread before any core's second."""
    def topo(cpu, name, otherwise):
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/{name}") as f:
                return int(f.read())
        except (OSError, ValueError):
            return otherwise
    cpus = sorted((topo(c, "physical_package_id", 0), topo(c, "core_id", c), c) for c in allowed)
    c = len(cpus)
    if workers > c:
        nth = {}
        spread = []
        for package, core, cpu in cpus:
            nth[(package, core)] = nth.get((package, core), -1) + 1
            spread.append((nth[(package, core)], package, core, cpu))
        return [sorted(spread)[local % c][3]]
    return sorted(cpu for _, _, cpu in cpus[local * c // workers:(local + 1) * c // workers])


def bound_cpus(run_dir):
    """{rank: its share, as its log says} for every rank log of run_dir,
    each share checked against the rule for its local rank, every local
    rank once."""
    allowed = sorted(os.sched_getaffinity(0))
    shares, seen = {}, {}
    for name in sorted(os.listdir(run_dir)):
        if not (name.startswith("rank-") and name.endswith(".log")):
            continue
        rank = int(name[5:10])
        with open(f"{run_dir}/{name}", errors="replace") as f:
            text = f.read()
        m = re.search(r"rank (\d+) bound to CPU (\S+) \(local rank (\d+) of (\d+) on CPU (\S+)\)", text)
        if not m or int(m.group(1)) != rank:
            fail(f"{name}: no 'rank {rank} bound to CPU ...' line")
        local, workers = int(m.group(3)), int(m.group(4))
        want = share_of(allowed, local, workers)
        if m.group(2) != cpu_list(want) or m.group(5) != cpu_list(allowed):
            fail(f"{name}: '{m.group(0)}'; local rank {local} of {workers} on CPU "
                 f"{cpu_list(allowed)} takes CPU {cpu_list(want)}")
        shares[rank], seen[local] = m.group(2), workers
    if not seen or sorted(seen) != list(range(len(seen))) or set(seen.values()) != {len(seen)}:
        fail(f"local ranks {seen} are not 0..{len(seen) - 1} of {len(seen)}")
    return shares


def bind_cores(flags):
    """--bind-cores: bitwise the one-process run, each rank's log names the
    share the rule gives it, and mid-run every thread of every worker of a
    longer job (the actors', the transport's, the streams') runs there."""
    shares = bound_cpus(launch_and_compare(flags, ["--bind-cores"]))
    run_dir = f"{WORK}/bind-cores-long"
    p, pids, seen = start_long(run_dir, ["--bind-cores"])
    threads = 0
    try:
        live = bound_cpus(run_dir)
        for rank, pid in enumerate(pids):
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{tid}/status") as f:
                        got = re.search(r"Cpus_allowed_list:\s*(\S+)", f.read()).group(1)
                except FileNotFoundError:  # (a thread that ended meanwhile)
                    continue
                if got != live[rank]:
                    fail(f"rank {rank}'s thread {tid} may run on CPU {got}, not its share {live[rank]}")
                threads += 1
    finally:
        p.send_signal(signal.SIGINT)
    finish(p, seen, time.time(), 10, "SIGINT")
    check_gone(pids)
    print(f"OK: {len(shares)} workers bound to their shares; mid-run, {threads} threads of "
          f"{len(pids)} workers each on its worker's share")


def engine_and_compare(flags, engine):
    tag = tag_of(flags) + "-" + engine
    want_m, want_w = reference(flags, tag)
    got_m, got_w = f"{WORK}/{tag}.jsonl", f"{WORK}/{tag}.safetensors"
    remove(got_m, got_w)
    port = free_port()
    world = 1
    for k in ("--tp", "--pp", "--dp"):
        if k in flags:
            world *= int(flags[flags.index(k) + 1])
    env = dict(os.environ, TROUPE_JOB_TOKEN="0123456789abcdef-test-token")
    worker = [TROUPE, "worker", *flags, "--metrics-jsonl", got_m, "--save-weights", got_w]
    if engine == "mpirun":
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        r = run(["mpirun", "-np", str(world), "--oversubscribe", "-x", "TROUPE_JOB_TOKEN",
                 *worker, "--master-addr", "127.0.0.1", "--master-port", str(port)], env=env)
        print(r.stdout)
        if r.returncode != 0:
            fail(f"mpirun exited {r.returncode}")
    else:
        procs = []
        for rank in range(world):
            e = dict(env, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                     LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen(worker, env=e, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        for rank, p in enumerate(procs):
            out, _ = p.communicate(timeout=240)
            if p.returncode != 0:
                fail(f"rank {rank} exited {p.returncode}:\n{out}")
    compare(want_m, got_m, want_w, got_w)


def default_device(built_with_cuda):
    run_dir = f"{WORK}/default-device-run"
    shutil.rmtree(run_dir, ignore_errors=True)
    env = dict(os.environ)
    env.pop("TROUPE_DEVICE", None)
    r = run([TROUPE, "launch", "--nproc-per-node", "2", "--pp", "2", *SMALL, "--steps", "1",
             "--run-dir", run_dir], env=env)
    print(r.stdout[-3000:])
    if r.returncode != 0:
        fail(f"troupe launch exited {r.returncode}")
    want = "cpu"
    if built_with_cuda and gpu_count() >= 2:
        # Each GPU the workers may see (CUDA_VISIBLE_DEVICES by index only).
        sm = subprocess.run(["nvidia-smi", "--query-gpu=index,compute_cap",
                             "--format=csv,noheader"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
        caps = {}
        for line in sm.stdout.splitlines() if sm.returncode == 0 else []:
            index, _, cap = line.partition(",")
            try:
                caps[index.strip()] = float(cap)
            except ValueError:
                pass
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            caps = {i: c for i, c in caps.items() if i in [v.strip() for v in visible.split(",")]}
        # (Where nvidia-smi cannot say, either answer is taken; --device once still.)
        want = None if len(caps) < 2 else ("cuda" if all(c >= 8.0 for c in caps.values())
                                           else "cpu")
    with open(f"{run_dir}/launch.json") as f:
        ranks = json.load(f)["ranks"]
    for r_ in ranks:
        argv = r_["argv"]
        at = [i for i, a in enumerate(argv) if a == "--device" or a.startswith("--device=")]
        if len(at) != 1 or argv[at[0]] != "--device" or argv[at[0] + 1] not in ("cpu", "cuda") \
                or (want is not None and argv[at[0] + 1] != want):
            fail(f"rank {r_['rank']}'s argv has {[argv[i:i + 2] for i in at]}, want one "
                 f"--device {want or 'cpu or cuda'}")
        got = argv[at[0] + 1]
    column = [line.split()[-1] for line in r.stdout.splitlines()
              if line.strip().startswith(("0  (0,0,0)", "1  (0,1,0)"))]
    want_column = ["cuda:0", "cuda:1"] if got == "cuda" else ["cpu", "cpu"]
    if column != want_column:
        fail(f"the table's device column says {column}, want {want_column}")
    print(f"OK: both workers got --device {got} once; the table says {column}")


def mixed_devices():
    port = free_port()
    env = dict(os.environ, TROUPE_JOB_TOKEN="0123456789abcdef-test-token", WORLD_SIZE="2",
               LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env.pop("TROUPE_DEVICE", None)
    start = time.time()
    procs = [subprocess.Popen([TROUPE, "worker", *SMALL, "--pp", "2", "--steps", "3",
                               "--device", device],
                              env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank, device in enumerate(["cpu", "opaque"])]
    outs = []
    for rank, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1, 60 - (time.time() - start)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            fail(f"rank {rank} still runs after 60 s")
        print(f"rank {rank} (exit {p.returncode}):", out.strip()[-600:])
        if p.returncode == 0:
            fail(f"rank {rank} exited 0 on mixed devices")
        outs.append(out)
    want = ("the ranks' devices differ: rank 0 on host", "computes on cpu, rank 1 on host",
            "computes on cpu (opaque)", "give every rank the same --device")
    for rank, out in enumerate(outs):
        missing = [w for w in want if w not in out]
        if missing:
            fail(f"rank {rank}'s output lacks {missing}")
    print(f"OK: both ranks stopped in {time.time() - start:.1f} s, naming the devices")


def check_stopped(run_dir, ranks, culprit):
    """The survivors stopped by themselves, naming the lost rank: none was
    killed by the launcher's grace period (a rank waiting in a transfer to
    the lost one, a link's stream or a collective, must give up, not hang)."""
    for r in ranks:
        with open(f"{run_dir}/rank-{r:05d}.log", errors="replace") as f:
            log = f.read()
        if f"troupe worker: stopped: the job stopped: {culprit}" not in log:
            fail(f"rank {r} did not stop by itself naming {culprit}; its log ends:\n"
                 + log[-1500:])
    print(f"OK: ranks {ranks} stopped by themselves, naming {culprit}")


def kill_worker(extra):
    rd = f"{WORK}/kill-worker"
    p, pids, seen = start_long(rd, extra)
    victim = pids[2]
    t0 = time.time()
    os.kill(victim, signal.SIGKILL)
    out = finish(p, seen, t0, 5, "SIGKILL to rank 2")
    if p.returncode == 0 or "rank 2 (d=0 s=1 t=0)" not in out or "killed by SIGKILL" not in out:
        fail("the message does not name rank 2 (d=0 s=1 t=0) killed by SIGKILL")
    check_gone(pids)
    check_stopped(rd, [0, 1, 3], "rank 2 (d=0 s=1 t=0)")


def stop_worker():
    rd = f"{WORK}/stop-worker"
    p, pids, seen = start_long(rd)
    victim = pids[1]
    t0 = time.time()
    os.kill(victim, signal.SIGSTOP)
    out = finish(p, seen, t0, 10, "SIGSTOP to rank 1")
    if p.returncode == 0 or "rank 1 (d=1 s=0 t=0)" not in out or "sent nothing for" not in out:
        fail("the message does not name rank 1 (d=1 s=0 t=0) as silent")
    check_gone(pids)


def agent_pids(run_dir):
    """This job's agents: their command line names its agent port."""
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with open(f"{run_dir}/launch.json") as f:
                port = json.load(f).get("agent_port")
        except (OSError, ValueError):
            port = None
        if port:
            found = []
            for pid in os.listdir("/proc"):
                try:
                    with open(f"/proc/{pid}/cmdline") as f:
                        argv = f.read().split("\0")
                except OSError:
                    continue
                if "agent" in argv and "--master-port" in argv and \
                        argv[argv.index("--master-port") + 1] == str(port):
                    found.append(int(pid))
            if len(found) >= 2:
                return found
        time.sleep(0.1)
    fail("this job's agents were not found")


AGENTS = ["--hosts", "hostA,hostB", "--nproc-per-node", "2", "--rsh", "env TROUPE_HOST={host}"]


def kill_agent():
    rd = f"{WORK}/kill-agent"
    p, pids, seen = start_long(rd, AGENTS)
    agents = agent_pids(rd)
    # The agent of hostB: its command line says --index 1.
    victim = next(a for a in agents if "--index\x001" in open(f"/proc/{a}/cmdline").read())
    t0 = time.time()
    os.kill(victim, signal.SIGKILL)
    out = finish(p, seen, t0, 5, "SIGKILL to hostB's agent")
    if p.returncode == 0 or "hostB" not in out:
        fail("the message does not name hostB")
    check_gone(pids, agents)


def kill_launcher(agents):
    rd = f"{WORK}/kill-launcher" + ("-agents" if agents else "")
    extra = AGENTS if agents else []
    p, pids, seen = start_long(rd, extra)
    others = agent_pids(rd) if agents else []
    t0 = time.time()
    p.kill()
    p.wait()
    check_gone(pids, others)
    print(f"MEASURED: SIGKILL to the launcher: every process gone after {time.time() - t0:.2f} s")
    if time.time() - t0 > 5:
        fail("took more than 5 s")


def interrupt(name):
    sig = getattr(signal, name)
    rd = f"{WORK}/interrupt-{name}"
    p, pids, seen = start_long(rd)
    t0 = time.time()
    p.send_signal(sig)
    out = finish(p, seen, t0, 5, name)
    if p.returncode != 128 + sig or f"interrupted by {name}" not in out:
        fail(f"exit {p.returncode}, or no 'interrupted by {name}'")
    check_gone(pids)


def stall():
    r = run([TROUPE, "launch", *SMALL, "--pp", "2", "--dp", "2", "--steps", "3",
             "--debug-stall-stage", "1:2", "--stall-timeout", "1", "--run-dir", f"{WORK}/stall"])
    print(r.stdout)
    if r.returncode == 0:
        fail("a stalled run exited 0")
    for want in ("no progress for 1.0 s in step 2", "has not begun step 2",
                 "likely culprit: rank 2 (d=0 s=1 t=0) on host"):
        if want not in r.stdout:
            fail(f"no '{want}'")
    print("OK: the culprit is named")


def intruders(agents):
    flags = SMALL + ["--pp", "2", "--dp", "2", "--steps", "40"]
    want_m, _ = reference(flags, "intruders")
    rd = fresh(f"{WORK}/intruders")
    got_m = f"{WORK}/intruders-launch.jsonl"
    remove(got_m)
    p = subprocess.Popen([TROUPE, "launch", *(AGENTS if agents else []), *flags, "--run-dir", rd,
                          "--metrics-jsonl", got_m],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids_of(rd)
    with open(f"{rd}/launch.json") as f:
        record = json.load(f)
    host, port = record["coordinator"].rsplit(":", 1)
    ports = [int(port)] + ([record["agent_port"]] if agents else [])
    # Random bytes, and a frame header with an absurd length, to each port.
    rnd = random.Random(7)
    for port in ports:
        for payload in (bytes(rnd.getrandbits(8) for _ in range(4096)),
                        b"TRPC" + (1).to_bytes(4, "little") + (1 << 62).to_bytes(8, "little"),
                        b"\xff" * 100000):
            with socket.create_connection((host, port), timeout=5) as s:
                try:
                    s.sendall(payload)
                    s.settimeout(10)
                    s.recv(100)
                except OSError:
                    pass
    port = ports[0]
    # A worker of this job's shape with the wrong token.
    env = dict(os.environ, TROUPE_JOB_TOKEN="not-the-token-of-this-job")
    env.pop("TROUPE_TOKEN_STDIN", None)
    r = run([TROUPE, "worker", *flags, "--rank", "1", "--world", "4", "--master-addr", host,
             "--master-port", str(port), "--join-timeout", "5"], env=env, timeout=60)
    print("the intruding worker:", r.stdout.strip()[-500:])
    if r.returncode == 0:
        fail("a worker without the token joined")
    out, _ = p.communicate(timeout=240)
    print(out[-2000:])
    if p.returncode != 0:
        fail(f"the job did not survive the intruders (exit {p.returncode})")
    if "refused" not in out:
        fail("the launcher did not log the refused connections")
    compare(want_m, got_m)


case, args = sys.argv[3], sys.argv[4:]
# (An exception is a failure ctest must see: its pass is an "OK: " line,
# which a case may print before a later check.)
try:
    if case == "equivalence":
        launch_and_compare(args, [])
    elif case == "bind_cores":
        bind_cores(args)
    elif case == "gpus":
        on_gpus(int(args[0]), args[1:])
    elif case == "agents":
        world = 1
        for k in ("--tp", "--pp", "--dp"):
            if k in args:
                world *= int(args[args.index(k) + 1])
        # The agents start in / with an environment of their own (as ssh would
        # start them): the workers must still run in the launcher's directory.
        launch_and_compare(args, ["--hosts", "hostA,hostB", "--rsh",
                                  "env -i -C / PATH=/usr/bin:/bin 'TROUPE_HOST={host}'",
                                  "--nproc-per-node", str((world + 1) // 2)], relative=True)
    elif case in ("torchrun", "mpirun"):
        engine_and_compare(args, case)
    elif case == "kill_worker":
        kill_worker(args)
    elif case == "stop_worker":
        stop_worker()
    elif case == "kill_agent":
        kill_agent()
    elif case == "kill_launcher":
        kill_launcher(args == ["agents"])
    elif case == "interrupt":
        interrupt(args[0])
    elif case == "stall":
        stall()
    elif case == "default_device":
        default_device(args == ["ON"])
    elif case == "mixed_devices":
        mixed_devices()
    elif case == "intruders":
        intruders(args == ["agents"])
    else:
        fail(f"unknown case {case}")
except Exception as e:  # noqa: BLE001
    fail(f"{type(e).__name__}: {e}")
