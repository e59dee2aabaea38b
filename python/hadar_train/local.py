"""Run a unit on this machine as hadar would start it::

    python -m hadar_train.local -n 2 train.py [ARGS...]
    python -m hadar_train.local -n 2 -m mypkg.train [ARGS...]

starts N ranks, each under the launcher (``python -m hadar_train.run``),
with the environment the sidecar writes (docs/training-contract.md,
"Distributed workers"): torchrun's variables for one process per GPU
(``LOCAL_RANK`` 0, ``NODE_RANK`` the rank, rank 0 hosting the store at
``127.0.0.1`` on a free port) and, when asked, the contract's
``HADAR_TOTAL_STEPS``, ``HADAR_CHECKPOINT_DIR`` and a progress file per
rank. It stands in for ``torchrun``, which crashes in Debian's torch 1.13
on Python 3.11. SIGTERM or SIGINT here goes to every rank (they stop
together with a checkpoint); a rank that fails stops the others. The
status is the first failed rank's, else 0. Standard library only."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from types import FrameType
from typing import Dict, List, Optional


# The ports this process claimed (free_port), each held by an abstract
# Unix socket until the process exits.
_claims: List[socket.socket] = []


def claim_port(port: int) -> bool:
    """Claims ``port`` for this process against every other process on
    the machine that claims ports here; False when one already holds it.
    The claim is an abstract Unix socket named after the port (Linux),
    which the kernel drops when the process exits: nothing is left on
    disk. Elsewhere every claim succeeds."""
    if not sys.platform.startswith("linux"):
        return True
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind(f"\0hadar-train-port-{port}")
    except OSError:
        claim.close()
        return False
    _claims.append(claim)
    return True


def free_port() -> int:
    """A TCP port of 127.0.0.1 that is free now and claimed for this
    process (claim_port). The kernel may give the same free port to two
    processes that ask at the same moment: two test suites on one machine
    got the same master port, and a rank of one joined the other's unit."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if claim_port(port):
            return port
    raise RuntimeError("no free port on 127.0.0.1 that another process had not claimed, after 100 tries")


def rank_env(rank: int, world: int, port: int, job: str, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Rank ``rank``'s environment: ``base`` (this process's) with the
    variables the sidecar writes for a unit of ``world`` workers."""
    env = dict(os.environ if base is None else base)
    r, n = str(rank), str(world)
    env.update({"RANK": r, "WORLD_SIZE": n, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": r, "GROUP_WORLD_SIZE": n,
                "ROLE_RANK": r, "ROLE_WORLD_SIZE": n, "ROLE_NAME": "default", "NODE_RANK": r,
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": f"{job}-local",
                "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "False",
                "HADAR_JOB_ID": job})
    return env


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hadar_train.local", description=__doc__.split("\n\n")[0],
                                usage="%(prog)s [-n N] [options] SCRIPT [ARGS...] | -m MODULE [ARGS...]")
    p.add_argument("-n", "--nproc", type=int, default=2, help="ranks of the unit (default 2)")
    p.add_argument("--job-id", default="local", help="HADAR_JOB_ID (default local)")
    p.add_argument("--steps", type=int, default=0, help="HADAR_TOTAL_STEPS (default: unset, the script's own)")
    p.add_argument("--checkpoint-dir", default="", help="HADAR_CHECKPOINT_DIR (default: unset)")
    p.add_argument("--progress-dir", default="", help="a progress file per rank, progress-<rank>.json, here")
    p.add_argument("--gpus", default="", help="comma-separated GPU indices, one per rank (CUDA_VISIBLE_DEVICES); default: inherited")
    p.add_argument("--port", type=int, default=0, help="MASTER_PORT (default: a free one)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The options end where the script (or -m MODULE) begins.
    split = len(argv)
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-m" or not a.startswith("-"):
            split = i
            break
        i += 1 if "=" in a or a in ("-h", "--help") else 2
    args, target = _parser().parse_args(argv[:split]), argv[split:]
    if not target or target == ["-m"]:
        _parser().error("want SCRIPT [ARGS...] or -m MODULE [ARGS...]")
    if args.nproc < 1:
        _parser().error("-n: at least 1")
    gpus = [g for g in args.gpus.split(",") if g.strip()] if args.gpus else []
    if gpus and len(gpus) < args.nproc:
        _parser().error(f"--gpus {args.gpus}: {len(gpus)} for {args.nproc} ranks")
    port = args.port or free_port()
    procs: List[subprocess.Popen] = []
    for r in range(args.nproc):
        env = rank_env(r, args.nproc, port, args.job_id)
        if args.steps:
            env["HADAR_TOTAL_STEPS"] = str(args.steps)
        if args.checkpoint_dir:
            env["HADAR_CHECKPOINT_DIR"] = os.path.abspath(args.checkpoint_dir)
        if args.progress_dir:
            os.makedirs(args.progress_dir, exist_ok=True)
            env["HADAR_PROGRESS_FILE"] = os.path.join(os.path.abspath(args.progress_dir), f"progress-{r}.json")
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[r].strip()
        procs.append(subprocess.Popen([sys.executable, "-m", "hadar_train.run"] + target, env=env))

    def forward(signum: int, frame: Optional[FrameType]) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    status = 0
    while any(p.poll() is None for p in procs):
        for r, p in enumerate(procs):
            rc = p.poll()
            if rc is not None and rc != 0 and status == 0:
                status = rc if rc > 0 else 128 - rc
                print(f"hadar_train.local: rank {r} exited {rc}; stopping the others", file=sys.stderr, flush=True)
                forward(signal.SIGTERM, None)
        time.sleep(0.1)
    if status == 0:
        for p in procs:
            if p.returncode != 0:
                status = p.returncode if p.returncode > 0 else 128 - p.returncode
                break
    return status


if __name__ == "__main__":
    sys.exit(main())
