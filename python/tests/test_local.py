"""Running a unit locally (``python -m hadar_train.local``), and what a
script reads off its Run (docs/pytorch.md)."""

from __future__ import annotations

import json
import os
import unittest

from hadar_train.env import Env

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
