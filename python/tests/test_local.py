"""Running a unit locally (``python -m hadar_train.local``), and what a
script reads off its Run (docs/pytorch.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unittest

from hadar_train.env import Env
from hadar_train.local import claim_port, free_port

from .helpers import ProcTest


class Local(ProcTest):
    def test_starts_a_unit_with_the_contracts_environment(self) -> None:
        """Two ranks of the DDP example under the local launcher: they meet
        (torchrun's variables as the sidecar writes them), train the
        HADAR_TOTAL_STEPS given, end with equal parameters and exit 0."""
        progress = os.path.join(self.tmp, "progress")
        p = self.start(["-m", "hadar_train.local", "-n", "2", "--steps", "40", "--progress-dir", progress,
                        "--checkpoint-dir", os.path.join(self.tmp, "ckpt"), "-m", "hadar_train.examples.ddp", "--steps", "9999"],
                       {}, "local")
        self.assertEqual(p.wait(timeout=180), 0, p.stderr())
        finals = sorted(line for line in p.stdout().splitlines() if line.startswith("final "))
        self.assertEqual(len(finals), 2, p.stdout())
        self.assertIn("final steps_done=40 rank=0 world_size=2", finals[0])
        self.assertIn("final steps_done=40 rank=1 world_size=2", finals[1])
        self.assertEqual(finals[0].split("params=")[1].split()[0], finals[1].split("params=")[1].split()[0])
        for r in range(2):
            with open(os.path.join(progress, f"progress-{r}.json")) as f:
                prog = json.load(f)
            self.assertEqual((prog["state"], prog["rank"], prog["world_size"], prog["steps_done"]), ("done", r, 2, 40))
        self.assertTrue(os.listdir(os.path.join(self.tmp, "ckpt")))

    def test_a_failed_rank_stops_the_unit(self) -> None:
        script = os.path.join(self.tmp, "fail.py")
        with open(script, "w") as f:
            f.write("import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(120)\n")
        p = self.start(["-m", "hadar_train.local", "-n", "2", script], {}, "fail")
        self.assertEqual(p.wait(timeout=60), 3, p.stderr())
        self.assertIn("rank 1 exited 3; stopping the others", p.stderr())


class RunAttributes(unittest.TestCase):
    def test_total_steps_and_world_size(self) -> None:
        """run.total_steps is the effective total (HADAR_TOTAL_STEPS wins
        over init's argument), run.world_size the unit's workers, and
        HADAR_CHECKPOINT_DIR wins over checkpoint_dir=."""
        from hadar_train.run import Run

        run = Run(Env.from_environ({"HADAR_TOTAL_STEPS": "123", "HADAR_CHECKPOINT_DIR": "/env/ckpt"}), total_steps=5,
                  checkpoint_dir="/arg/ckpt", install_signals=False)
        self.assertEqual((run.total_steps, run.world_size, run.rank, run.checkpoint_dir), (123, 1, 0, "/env/ckpt"))
        run.close()
        run = Run(Env.from_environ({}), total_steps=5, checkpoint_dir="/arg/ckpt", install_signals=False)
        self.assertEqual((run.total_steps, run.world_size, run.checkpoint_dir), (5, 1, "/arg/ckpt"))
        run.close()


@unittest.skipUnless(sys.platform.startswith("linux"), "ports are claimed by abstract Unix sockets, a Linux feature")
class FreePort(unittest.TestCase):
    """Two processes never get the same port from free_port: a port one
    claimed is refused to another (two test suites on one machine once got
    the same master port), and the claim ends with the process."""

    def child(self, code: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", "import sys; from hadar_train.local import claim_port, free_port; " + code],
                              capture_output=True, text=True, timeout=60)

    def test_a_claimed_port_is_refused_elsewhere_and_freed_on_exit(self) -> None:
        port = free_port()
        r = self.child(f"sys.exit(0 if not claim_port({port}) and free_port() != {port} else 3)")
        self.assertEqual(r.returncode, 0, f"another process claimed port {port}, claimed here: {r.stderr}")
        r = self.child("print(free_port())")
        self.assertEqual(r.returncode, 0, r.stderr)
        theirs = int(r.stdout)
        self.assertTrue(claim_port(theirs), f"port {theirs}, claimed by a process that has exited, is still claimed")
        self.assertFalse(claim_port(port), f"port {port} claimed twice by this process")
