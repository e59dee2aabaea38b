"""Checkpoint files: what they hold comes back, and loading one never
runs code from it."""

from __future__ import annotations

import os
import pickle
import random
import shutil
import tempfile
import unittest

import torch

from hadar_train import checkpoint as ck
from hadar_train.env import Env
from hadar_train.run import Run


class Planted:
    """What a hostile job would leave in another job's checkpoint
    directory: unpickling it runs a command."""

    def __reduce__(self):
        return (os.system, ("touch " + os.environ["HADAR_TEST_MARKER"],))


class CheckpointTest(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="hadar-ck-")
        self.addCleanup(shutil.rmtree, self.dir)

    def test_round_trip(self) -> None:
        m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
        opt = torch.optim.Adam(m.parameters(), lr=0.01)
        m(torch.randn(5, 3)).sum().backward()
        opt.step()
        sched = torch.optim.lr_scheduler.StepLR(opt, 3)
        payload = {"model": m.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(), "rng": torch.get_rng_state(),
                   "py": random.getstate(), "nested": {1: (2.5, "x", None, [True])}, "inf": float("inf")}
        path = os.path.join(self.dir, "ckpt-3.pt")
        ck.save(path, payload)
        back = ck.load(path)
        self.assertEqual(sorted(back), sorted(payload))
        self.assertEqual(back["nested"], {1: (2.5, "x", None, [True])})
        self.assertEqual(back["py"], payload["py"])
        self.assertEqual(back["inf"], float("inf"))
        self.assertTrue(torch.equal(back["rng"], payload["rng"]))
        opt2 = torch.optim.Adam(m.parameters(), lr=0.5)
        opt2.load_state_dict(back["opt"])  # integer keys and tuples (betas) survive
        self.assertEqual(opt2.state_dict()["param_groups"][0]["betas"], (0.9, 0.999))
        self.assertEqual(set(opt2.state_dict()["state"]), {0, 1, 2, 3})
        self.assertEqual(os.listdir(self.dir), ["ckpt-3.pt"])  # no temporary file left

    def test_refuses_what_it_cannot_hold(self) -> None:
        with self.assertRaisesRegex(ck.CheckpointError, "object cannot be checkpointed"):
            ck.save(os.path.join(self.dir, "ckpt-1.pt"), {"x": object()})
        self.assertEqual(os.listdir(self.dir), [])

    def test_never_runs_a_planted_pickle(self) -> None:
        marker = os.path.join(self.dir, "pwned")
        os.environ["HADAR_TEST_MARKER"] = marker
        self.addCleanup(os.environ.pop, "HADAR_TEST_MARKER")
        for name, write in (("ckpt-9.pt", lambda f: torch.save({"format": ck.FORMAT, "document": "{}", "tensors": [Planted()]}, f)),
                            ("ckpt-8.pt", lambda f: pickle.dump(Planted(), f))):
            with open(os.path.join(self.dir, name), "wb") as f:
                write(f)
            with self.assertRaises(ck.CheckpointError):
                ck.load(os.path.join(self.dir, name))
        self.assertFalse(os.path.exists(marker), "loading a checkpoint ran code from it")

    def test_another_jobs_checkpoint_is_refused(self) -> None:
        ck.save(os.path.join(self.dir, "ckpt-5.pt"), {"job_id": "other", "step": 5, "local_step": 5, "objects": {}})
        run = Run(Env.from_environ({"HADAR_JOB_ID": "mine", "HADAR_CHECKPOINT_DIR": self.dir}), total_steps=10, install_signals=False)
        with self.assertRaisesRegex(ck.CheckpointError, "job_id 'other'"):
            next(run.steps())

    def test_resume_skips_an_unreadable_checkpoint(self) -> None:
        m = torch.nn.Linear(2, 2)
        run = Run(Env.from_environ({"HADAR_JOB_ID": "j", "HADAR_CHECKPOINT_DIR": self.dir}), total_steps=4, install_signals=False)
        run.track(model=m)
        for _ in run.steps():
            pass
        with open(os.path.join(self.dir, "ckpt-9.pt"), "wb") as f:
            f.write(b"torn")
        again = Run(Env.from_environ({"HADAR_JOB_ID": "j", "HADAR_CHECKPOINT_DIR": self.dir}), total_steps=6, install_signals=False)
        again.track(model=torch.nn.Linear(2, 2))
        steps = list(again.steps())
        self.assertEqual(again.resumed_from, os.path.join(self.dir, "ckpt-4.pt"))
        self.assertEqual(steps, [4, 5])
        self.assertTrue(torch.equal(again._objects["model"].weight, m.weight))


if __name__ == "__main__":
    unittest.main()
