"""The bare chains of `scripts/bench hop`'s anchors (`hop_reference`): a
process a stage passing the bytes down and back over troupe's transport
alone (bench/comm_bench.cc `--mode chain`), OpenMPI or Gloo
(bench/comm_mpi.cc, comm_gloo.cc `chain`); bench/hop_bench.py runs them
at each pp and takes the slope."""
import json
import os
import signal
import subprocess
import sys
import tempfile

from report import free_port

CHAIN_STEPS = 2000
CHAIN_TIMEOUT_S = 120
# Gloo's unbound-buffer messages from 64 KiB stall in this pattern on
# loopback TCP (a step of 2 processes took 44 ms at 64 KiB and 308 ms at
# 256 KiB; 1 MiB did not end 100 steps in 20 s): its chain runs below that.
GLOO_CHAIN_LIMIT_BYTES = 64 << 10


def ranks_within(argvs, seconds, work):
    """Runs one process per argv (each in a session of its own: a timeout
    kills all it started); rank 0's stdout, or RuntimeError if one fails or
    they are not done within `seconds`."""
    errs = [tempfile.TemporaryFile(mode="w+", dir=work) for _ in argvs]
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE if k == 0 else subprocess.DEVNULL,
                              stderr=errs[k], text=True, start_new_session=True)
             for k, a in enumerate(argvs)]
    try:
        out, _ = procs[0].communicate(timeout=seconds)
        for p in procs[1:]:
            p.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        raise RuntimeError(f"not done within {seconds} s")
    for p, err in zip(procs, errs):
        if p.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"rank failed ({p.returncode}): {err.read()[-500:]}")
    return out


def chain_step_us(impl, binary, size, pp, work):
    """One run of a bare pipeline of pp processes (bench/comm_bench.cc
    `--mode chain`, bench/comm_mpi.cc and comm_gloo.cc `chain`): its median
    step, or None where it could not run (said on stderr)."""
    for attempt in (1, 2):  # (Gloo's TCP pairs now and then drop one at start-up)
        try:
            if impl == "troupe-ucx":
                port = str(free_port())
                argvs = [[binary, "--rank", str(k), "--size", str(pp), "--port", port, "--mode",
                          "chain", "--min-bytes", str(size), "--iters", str(CHAIN_STEPS)]
                         for k in range(pp)]
            elif impl == "openmpi":
                # (Unbound, as troupe's ranks: mpirun binds 2 ranks to cores by default.)
                argvs = [["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                          "-np", str(pp), binary, "chain", str(size), str(CHAIN_STEPS)]]
            else:
                store = tempfile.mkdtemp(dir=work)
                argvs = [[binary, str(k), str(pp), store, "chain", str(size), str(CHAIN_STEPS)]
                         for k in range(pp)]
            text = ranks_within(argvs, CHAIN_TIMEOUT_S, work)
            return next(json.loads(line) for line in text.splitlines()
                        if line.startswith("{"))["step_us"]
        except (RuntimeError, StopIteration, ValueError, KeyError) as e:
            print(f"hop_bench: {impl} chain, pp {pp}, attempt {attempt}: {e}", file=sys.stderr)
    return None
