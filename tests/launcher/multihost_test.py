#!/usr/bin/python3
"""`troupe launch` across two "hosts" on one machine (ctest launcher.multihost).

    /usr/bin/python3 tests/launcher/multihost_test.py --troupe build/launcher/troupe

Needs root; exits 77 (ctest's skip) with the reason when not root or when
network namespaces cannot be made. Uses only the standard library.

The hosts: two network namespaces, HOST_A and HOST_B (10.213.0.1 and .2),
each with one veth link to a bridge (the switch) in a third namespace,
where the launcher runs (10.213.0.254, its --master-addr). Every address
lives inside namespaces this test made, so it collides with nothing, and
/etc/netns/NS/hosts lets every namespace resolve the others' names. The
agents start through `--rsh "netns_rsh.sh {host}"`, which also gives each
host its own hostname, IPC namespace and /dev/shm, so that nothing between
the hosts can bypass the link (netns_rsh.sh says why).

Run 1, tiny with --tp 2 --pp 2, 2 workers per host, checks:
  - placement: a TP group on one host, every pipeline hop across the link;
  - the losses, grad norms and learning rates equal the in-process run's
    (`troupe train`, same flags) exactly (tests/compare_metrics.py --rtol 0);
  - each worker's last log line (actors/runtime/worker.cc: UcxTransport::
    describe_lanes() and single_copy_bytes()): its hostname is its host's;
    every peer on the other host is reached by UCX's tcp over this host's
    veth only, with single copy off and 0 bytes by single copy;
  - the veths' byte counters grew by at least the pipeline's activations
    and their gradients: B*T*C*4 bytes per micro-batch per hop each way,
    tp hops (one per tensor shard) per micro-batch, m micro-batches a step.
Run 2, the same for many steps: once steps are being logged, host B's
switch port is set down (a cut: its packets are dropped, both ends' processes
stay alive and hear nothing). The launcher must exit non-zero within 8 s
(heartbeats: dead_after 5 s; the issue allows 10 s: see DETECT_LIMIT_S),
naming a rank of host B and the host, and then no process of the job may
remain: neither any pid of launch.json nor any process inside the
namespaces.

The namespaces (and with them the veths and the bridge), /etc/netns/NS and
the temporary directory are removed at the end, also when a check fails or
the test is interrupted; namespaces left by a run that was killed (whose
pid, in their name, is gone) are removed at the start.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
os.environ.setdefault("TROUPE_DEVICE", "cpu")  # the tests pin the device, as ctest does

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
SUBNET = "10.213.0"
LAUNCHER_ADDR = f"{SUBNET}.254"
# tiny (model/config.h): T = 64, C = 64. Checked against the launcher's banner.
T, C = 64, 64
TP, PP, B, GLOBAL_BATCH, STEPS = 2, 2, 4, 8, 4
# The limit for a cut link is 10 s; the heartbeats (1 s, dead_after
# 5 s) detect it 4-5 s after the cut, and stopping the rest takes well under
# a second (measured ~4.5 s in all). 8 s leaves 3 s for stopping and still
# catches the launcher waiting 5 s for the exit of ranks it had lost (>= 9 s).
DETECT_LIMIT_S = 8.0


class Failure(Exception):
    pass


def say(msg):
    print(f"multihost: {msg}", flush=True)


def sh(*cmd, timeout=30, check=True):
    """Runs cmd; returns its stdout; raises Failure (with its output) if it fails."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise Failure(f"`{' '.join(cmd)}` exited {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def pid_alive(pid):
    """Whether pid is a process that has not yet exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class Hosts:
    """The namespaces: `launcher` with the bridge, and hosts a and b."""

    PREFIX = "tmh"

    def __init__(self):
        tag = f"{self.PREFIX}{os.getpid()}"
        self.launcher, self.a, self.b = tag + "l", tag + "a", tag + "b"
        self.addr = {self.a: f"{SUBNET}.1", self.b: f"{SUBNET}.2", self.launcher: LAUNCHER_ADDR}
        self.made = []
        self.made_etc_netns = not os.path.isdir("/etc/netns")

    def link(self, host):
        return host + "-h"  # the host's end of its veth; "-b" is the bridge's

    @classmethod
    def remove_stale(cls):
        for line in sh("ip", "netns", "list").splitlines():
            m = re.match(rf"^({cls.PREFIX}(\d+)[lab])\b", line)
            if m and not pid_alive(int(m.group(2))):
                say(f"removing namespace {m.group(1)} of a run that is gone")
                kill_all_in(m.group(1))
                sh("ip", "netns", "del", m.group(1), check=False)
                shutil.rmtree(f"/etc/netns/{m.group(1)}", ignore_errors=True)

    def create(self):
        for ns in (self.launcher, self.a, self.b):
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write("127.0.0.1 localhost\n")
                for name, addr in self.addr.items():
                    f.write(f"{addr} {name}\n")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        L = self.launcher
        sh("ip", "-n", L, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", L, "addr", "add", f"{LAUNCHER_ADDR}/24", "dev", "br0")
        sh("ip", "-n", L, "link", "set", "br0", "up")
        for h in (self.a, self.b):
            sh("ip", "link", "add", self.link(h), "netns", h, "type", "veth", "peer", "name",
               h + "-b", "netns", L)
            sh("ip", "-n", L, "link", "set", h + "-b", "master", "br0")
            sh("ip", "-n", L, "link", "set", h + "-b", "up")
            sh("ip", "-n", h, "addr", "add", f"{self.addr[h]}/24", "dev", self.link(h))
            sh("ip", "-n", h, "link", "set", self.link(h), "up")
        for h in (self.a, self.b):
            for other in (self.a, self.b, self.launcher):
                got = sh("ip", "netns", "exec", h, "getent", "hosts", other).split()
                if not got or got[0] != self.addr[other]:
                    raise Failure(f"{h} resolves {other} as {got}, not {self.addr[other]}")

    def counters(self):
        """(tx_bytes, rx_bytes) of each host's veth, read inside its namespace."""
        out = {}
        for h in (self.a, self.b):
            stats = f"/sys/class/net/{self.link(h)}/statistics"
            tx, rx = sh("ip", "netns", "exec", h, "cat", f"{stats}/tx_bytes", f"{stats}/rx_bytes").split()
            out[h] = (int(tx), int(rx))
        return out

    def cut(self, host):
        """The switch's port of `host` goes down: both ends' packets are dropped."""
        sh("ip", "-n", self.launcher, "link", "set", host + "-b", "down")

    def remove(self):
        for ns in self.made:
            kill_all_in(ns)
            sh("ip", "netns", "del", ns, check=False)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        self.made = []
        if self.made_etc_netns:
            try:
                os.rmdir("/etc/netns")  # only if empty: another run may use it
            except OSError:
                pass


def netns_pids(ns):
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if pid_alive(int(p))]


def kill_all_in(ns):
    """SIGKILL to what is left in namespace ns: only this test's processes run there."""
    for pid in netns_pids(ns):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def train_flags(steps):
    return ["--model", "tiny", "--tp", str(TP), "--pp", str(PP), "--global-batch-size",
            str(GLOBAL_BATCH), "--micro-batch-size", str(B), "--steps", str(steps)]


def launch_cmd(args, hosts, run_dir, metrics, steps):
    return ["ip", "netns", "exec", hosts.launcher, args.troupe, "launch", "--hosts",
            f"{hosts.a},{hosts.b}", "--nproc-per-node", "2", "--rsh", f"{args.rsh} {{host}}",
            "--master-addr", LAUNCHER_ADDR, "--run-dir", run_dir, "--metrics-jsonl", metrics,
            *train_flags(steps)]


def read_launch_json(run_dir):
    with open(os.path.join(run_dir, "launch.json")) as f:
        return json.load(f)


def check_placement(record, hosts):
    """Ranks 0, 1 (stage 0) on host a, 2, 3 (stage 1) on host b: Megatron's order."""
    ranks = {r["rank"]: r for r in record["ranks"]}
    want = {0: hosts.a, 1: hosts.a, 2: hosts.b, 3: hosts.b}
    got = {k: r["host"] for k, r in ranks.items()}
    if got != want:
        raise Failure(f"placement {got}, want {want}")
    for r in ranks.values():
        same_group = [o for o in ranks.values() if (o["d"], o["s"]) == (r["d"], r["s"])]
        if {o["host"] for o in same_group} != {r["host"]}:
            raise Failure(f"the TP group of rank {r['rank']} spans hosts")
        nxt = [o for o in ranks.values() if (o["d"], o["s"], o["t"]) == (r["d"], r["s"] + 1, r["t"])]
        if nxt and nxt[0]["host"] == r["host"]:
            raise Failure(f"the pipeline hop {r['rank']} -> {nxt[0]['rank']} stays on one host")
    return got


LANES_RE = re.compile(r"troupe worker: rank (\d+) on (\S+): single-copy bytes (\d+); lanes: (.*)")
PEER_RE = re.compile(r"rank (\d+): ([^(]*?)(?: \(single copy (on|off), (\d+) bytes\))?$")


def check_lanes(run_dir, placement, hosts):
    """Each worker's lanes line: peers on the other host only over tcp on this host's veth."""
    for rank, host in placement.items():
        with open(os.path.join(run_dir, f"rank-{rank:05d}.log")) as f:
            lines = [m for m in map(LANES_RE.search, f) if m]
        if len(lines) != 1:
            raise Failure(f"rank {rank}'s log has {len(lines)} lanes lines, want 1")
        m = lines[0]
        if int(m.group(1)) != rank or m.group(2) != host:
            raise Failure(f"rank {rank}'s lanes line says rank {m.group(1)} on {m.group(2)}, want {host}")
        peers = {}
        for entry in m.group(4).split("; "):
            p = PEER_RE.match(entry.strip())
            if not p:
                raise Failure(f"rank {rank}: cannot read the lanes entry '{entry}'")
            peers[int(p.group(1))] = (p.group(2).split(), p.group(3), int(p.group(4) or 0))
        if sorted(peers) != sorted(placement):
            raise Failure(f"rank {rank}: lanes to ranks {sorted(peers)}, want {sorted(placement)}")
        for peer, (lanes, copy, copied) in peers.items():
            if placement[peer] == host:
                continue
            if lanes != [f"tcp/{hosts.link(host)}"] or copy != "off" or copied != 0:
                raise Failure(f"rank {rank} on {host} reaches rank {peer} on {placement[peer]} by "
                              f"{lanes}, single copy {copy}, {copied} bytes; want tcp/"
                              f"{hosts.link(host)} alone, single copy off, 0 bytes")
        say(f"rank {rank} on {host}: {m.group(4)}")


def check_counters(before, after, hosts, steps):
    """The veths carried at least the activations forward and their gradients back."""
    m = GLOBAL_BATCH // B  # micro-batches per step (dp = 1)
    each_way = steps * m * TP * B * T * C * 4
    grew = {h: (after[h][0] - before[h][0], after[h][1] - before[h][1]) for h in after}
    say(f"veth bytes (tx, rx): {grew}; activations each way: {each_way}")
    # host a holds stage 0: it sends activations and receives their gradients.
    for h in (hosts.a, hosts.b):
        tx, rx = grew[h]
        if tx < each_way or rx < each_way:
            raise Failure(f"{hosts.link(h)} carried tx {tx}, rx {rx} bytes: less than the "
                          f"{each_way} bytes of activations (gradients) that cross each way")


def run_equal(args, hosts, tmp):
    """Run 1: the job across the hosts equals the in-process run."""
    ref, got = os.path.join(tmp, "train.jsonl"), os.path.join(tmp, "launch.jsonl")
    run_dir = os.path.join(tmp, "run1")
    sh(args.troupe, "train", *train_flags(STEPS), "--metrics-jsonl", ref, timeout=120)
    before = hosts.counters()
    t0 = time.monotonic()
    p = subprocess.run(launch_cmd(args, hosts, run_dir, got, STEPS), capture_output=True,
                       text=True, timeout=180)
    say(f"run 1: troupe launch took {time.monotonic() - t0:.1f} s, exit {p.returncode}")
    if p.returncode != 0:
        raise Failure(f"troupe launch exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    after = hosts.counters()
    if f"T={T}" not in p.stdout or f"C={C}" not in p.stdout:
        raise Failure(f"the banner does not say T={T} C={C} (tiny changed?):\n{p.stdout}")
    placement = check_placement(read_launch_json(run_dir), hosts)
    cmp = subprocess.run([sys.executable, os.path.join(HERE, "..", "compare_metrics.py"), ref, got,
                          "--rtol", "0", "--keys", "loss,grad_norm,lr", "--steps", str(STEPS)],
                         capture_output=True, text=True)
    print(cmp.stdout, end="")
    if cmp.returncode != 0:
        raise Failure(f"the metrics differ from troupe train's:\n{cmp.stdout}{cmp.stderr}")
    check_lanes(run_dir, placement, hosts)
    check_counters(before, after, hosts, STEPS)


def wait_for_steps(path, count, proc, timeout):
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if proc.poll() is not None:
            raise Failure(f"troupe launch exited {proc.returncode} before the cut")
        try:
            with open(path) as f:
                if sum(1 for _ in f) >= count:
                    return
        except FileNotFoundError:
            pass
        time.sleep(0.1)
    raise Failure(f"fewer than {count} steps logged within {timeout} s")


def job_pids(run_dir):
    pids = [r["pid"] for r in read_launch_json(run_dir)["ranks"]]
    if any(not isinstance(p, int) or p <= 0 for p in pids):
        raise Failure(f"launch.json lacks pids: {pids}")
    return pids


def check_nothing_left(pids, hosts, grace_s=2.0):
    """No pid of the job and no process in the namespaces, within grace_s."""
    t0 = time.monotonic()
    while True:
        left = [p for p in pids if pid_alive(p)]
        in_ns = {ns: netns_pids(ns) for ns in (hosts.a, hosts.b, hosts.launcher)}
        if not left and not any(in_ns.values()):
            return time.monotonic() - t0
        if time.monotonic() - t0 > grace_s:
            raise Failure(f"after the launcher's exit, job pids {left} and namespace processes "
                          f"{in_ns} still run")
        time.sleep(0.05)


def run_cut(args, hosts, tmp):
    """Run 2: host b's link cut mid-run is detected, and the job stops cleanly."""
    run_dir = os.path.join(tmp, "run2")
    out_path, err_path = os.path.join(tmp, "cut.out"), os.path.join(tmp, "cut.err")
    metrics = os.path.join(tmp, "cut.jsonl")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(launch_cmd(args, hosts, run_dir, metrics, 1000000), stdout=out,
                                stderr=err, start_new_session=True)
    try:
        wait_for_steps(metrics, 20, proc, timeout=120)
        pids = job_pids(run_dir)
        t_cut = time.monotonic()
        hosts.cut(hosts.b)
        try:
            rc = proc.wait(timeout=DETECT_LIMIT_S + 20)
        except subprocess.TimeoutExpired:
            raise Failure(f"troupe launch still runs {DETECT_LIMIT_S + 20:.0f} s after the cut")
        detect = time.monotonic() - t_cut
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with open(err_path) as f:
        err = f.read()
    say(f"run 2: the cut of {hosts.b}'s link: launcher exit {rc} after {detect:.2f} s")
    print(err, end="")
    if rc == 0:
        raise Failure("troupe launch exited 0 after the cut")
    if detect > DETECT_LIMIT_S:
        raise Failure(f"the cut took {detect:.2f} s to end the job (limit {DETECT_LIMIT_S} s)")
    lost = rf"rank [23] \(d=0 s=1 t=[01]\) on host {hosts.b}\b"
    if not re.search(lost, err) or "lost contact" not in err:
        raise Failure(f"the launcher's message names no lost rank of {hosts.b} ({lost})")
    left_after = check_nothing_left(pids, hosts)
    say(f"run 2: no process of the job left ({left_after:.2f} s after the launcher's exit)")
    return detect


def usable(hosts):
    """None if this machine can run the test, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth links)"
    for tool in ("ip", "unshare", "mount", "hostname", "getent"):
        if shutil.which(tool) is None:
            return f"needs `{tool}`, which is not on PATH"
    probe = hosts.launcher
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if p.returncode != 0:
        return f"`ip netns add` does not work here: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--troupe", required=True, help="the troupe binary")
    ap.add_argument("--rsh", default=os.path.join(HERE, "netns_rsh.sh"),
                    help="the wrapper that runs a command on a host (its namespace)")
    args = ap.parse_args()
    args.troupe = os.path.abspath(args.troupe)
    hosts = Hosts()
    why = usable(hosts)
    if why:
        print(f"SKIP: launcher.multihost {why}")
        return SKIP
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("multihost: terminated"))
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="troupe-multihost-")
    try:
        Hosts.remove_stale()
        hosts.create()
        run_equal(args, hosts, tmp)
        detect = run_cut(args, hosts, tmp)
    except (Failure, subprocess.TimeoutExpired) as e:
        print(f"multihost: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        hosts.remove()
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"passed in {time.monotonic() - t0:.1f} s; the cut link was detected in {detect:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
