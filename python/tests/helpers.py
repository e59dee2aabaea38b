"""What the tests share: paths, the contract's fixtures, free ports, and
training processes started as hadar would start them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from typing import Callable, Dict, List, Mapping, Optional

from hadar_train.local import free_port as claimed_port

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYTHON_DIR)
FIXTURES = os.path.join(REPO, "contract", "testdata")
#: The interpreter running the tests (make test: Debian's, with torch).
PYTHON = sys.executable
#: A machine shared with other work starts Python with torch slowly.
SLOW = float(os.environ.get("HADAR_TEST_SLOW", "1"))


def fixture(*parts: str) -> bytes:
    with open(os.path.join(FIXTURES, *parts), "rb") as f:
        return f.read()


def fixture_json(*parts: str):
    return json.loads(fixture(*parts))


def free_port() -> int:
    """A free port of 127.0.0.1 no other test process on the machine
    claimed (hadar_train.local.free_port)."""
    return claimed_port()


def base_env(extra: Mapping[str, str]) -> Dict[str, str]:
    """The test process's environment without hadar's or torchrun's
    variables, plus ``extra``."""
    drop = ("HADAR_", "NOMAD_", "TORCHELASTIC_")
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "NODE_RANK",
             "MASTER_ADDR", "MASTER_PORT", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and k not in names}
    env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def unit_env(rank: int, world: int, port: int, node_rank: int = 0, job: str = "job") -> Dict[str, str]:
    """A worker's torchrun variables as the contract writes them
    (contract/testdata/worker-env.json has one)."""
    r, n = str(rank), str(world)
    return {"RANK": r, "WORLD_SIZE": n, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": r, "GROUP_WORLD_SIZE": n,
            "ROLE_RANK": r, "ROLE_WORLD_SIZE": n, "ROLE_NAME": "default", "NODE_RANK": str(node_rank),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": f"{job}-u0", "TORCHELASTIC_USE_AGENT_STORE": "False"}


class Proc:
    """A training process with its output in files."""

    def __init__(self, args: List[str], env: Mapping[str, str], workdir: str, name: str) -> None:
        self.out = os.path.join(workdir, name + ".out")
        self.err = os.path.join(workdir, name + ".err")
        with open(self.out, "wb") as o, open(self.err, "wb") as e:
            self.p = subprocess.Popen([PYTHON] + args, env=dict(env), stdout=o, stderr=e, cwd=workdir)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.p.send_signal(sig)

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.p.wait(timeout * SLOW)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            raise AssertionError(f"process did not end within {timeout * SLOW:.0f}s:\n{self.stderr()[-3000:]}")

    def stdout(self) -> str:
        with open(self.out, errors="replace") as f:
            return f.read()

    def stderr(self) -> str:
        with open(self.err, errors="replace") as f:
            return f.read()

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


class ProcTest(unittest.TestCase):
    """A test case whose processes and directories are cleaned up."""

    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="hadar-train-test-")
        self.procs: List[Proc] = []
        self.addCleanup(self._cleanup)

    def _cleanup(self) -> None:
        for p in self.procs:
            p.kill()
        subprocess.run(["rm", "-rf", self.tmp], check=False)

    def start(self, args: List[str], env: Mapping[str, str], name: str) -> Proc:
        p = Proc(args, base_env(env), self.tmp, name)
        self.procs.append(p)
        return p

    def start_together(self, starts: List[tuple]) -> List[Proc]:
        """Start processes (``(args, env, name)`` each, args beginning
        ``-m MODULE``) through tests.gate and let them run only once every
        one has imported torch: copies that must meet then start within a
        second of each other, however loaded the machine."""
        procs = []
        gate = os.path.join(self.tmp, "gate-" + "-".join(name for _, _, name in starts))
        for args, env, name in starts:
            if args[:1] != ["-m"]:
                raise ValueError(f"start_together: {args}: want -m MODULE ...")
            procs.append(self.start(["-m", "tests.gate", os.path.join(self.tmp, name + ".ready"), gate] + args[1:], env, name))
        self.wait_for("every process imported torch", lambda: all(os.path.exists(os.path.join(self.tmp, n + ".ready")) for _, _, n in starts),
                      timeout=300, procs=procs)
        with open(gate, "w"):
            pass
        return procs

    def wait_for(self, what: str, cond: Callable[[], bool], timeout: float = 90, procs: Optional[List[Proc]] = None) -> None:
        deadline = time.monotonic() + timeout * SLOW
        while time.monotonic() < deadline:
            if cond():
                return
            for p in procs or self.procs:
                if p.p.poll() is not None and not cond():
                    self.fail(f"{what}: a process ended first (exit {p.p.returncode}):\n{p.stderr()[-3000:]}")
            time.sleep(0.1)
        self.fail(f"{what}: not within {timeout * SLOW:.0f}s")


def read_progress(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def losses(text: str) -> List[str]:
    """The 'step N loss L' lines of an example's output, as written."""
    return [line for line in text.splitlines() if line.startswith("step ")]
