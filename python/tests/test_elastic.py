"""Elastic jobs: a fixed global batch at any width (the plan's arithmetic,
its errors, the same samples at every width), checkpoints resumed at
another WORLD_SIZE, and a unit resized twice (2 -> 1 -> 2) on the loss
curve of one never resized."""

from __future__ import annotations

import os
import random
import shutil
import signal
import sys
import tempfile
import unittest

import torch

import hadar_train
from hadar_train import checkpoint as ck
from hadar_train.elastic import BatchPlanError, batch_plan, parse_widths, rng_for_rank
from hadar_train.env import Env
from hadar_train.run import Run

from .helpers import ProcTest, free_port, losses, read_progress, unit_env

ELASTIC = ["-m", "hadar_train.examples.elastic"]

#: The largest difference of a step's loss (the global batch's mean,
#: float32) between a resized run and one never resized, without dropout.
#: Measured: 1.2e-7 over 60 steps resized 2 -> 1 -> 2 (docs/pytorch.md,
#: "Elastic jobs").
TOLERANCE = 1e-5


class Plan(unittest.TestCase):
    def test_split_and_accumulation(self) -> None:
        p = batch_plan(64, world_size=4, rank=3)
        self.assertEqual((p.per_worker, p.accumulation, p.micro_batch, p.micro_sizes), (16, 1, 16, [16]))
        self.assertEqual(p.loss_scale(0), 1.0)
        p = batch_plan(64, world_size=1, max_per_worker=24)
        self.assertEqual((p.per_worker, p.accumulation, p.micro_batch, p.micro_sizes), (64, 3, 22, [22, 21, 21]))
        self.assertAlmostEqual(sum(p.loss_scale(i) for i in range(p.accumulation)), 1.0)
        self.assertEqual([p.loss_scale(i) * 64 for i in range(3)], [22, 21, 21])
        p = batch_plan(64, world_size=2, max_per_worker=16)
        self.assertEqual((p.per_worker, p.accumulation, p.micro_sizes), (32, 2, [16, 16]))
        p = batch_plan(97, max_per_worker=32)  # a prime: uneven micro-batches, not 97 of one
        self.assertEqual((p.accumulation, p.micro_sizes), (4, [25, 24, 24, 24]))
        self.assertEqual(batch_plan(8, 2, 1, max_per_worker=100).accumulation, 1)

    def test_positions_are_the_global_batch_at_every_width(self) -> None:
        for step in (0, 1, 7):
            want = list(range(step * 48, (step + 1) * 48))
            for world in (1, 2, 3, 4, 6, 8):
                for cap in (None, 5, 7):
                    got = []
                    for r in range(world):
                        p = batch_plan(48, world, r, cap)
                        micro = p.micro_positions(step)
                        self.assertEqual([len(m) for m in micro], p.micro_sizes)
                        self.assertTrue(all(len(m) <= (cap or 48) for m in micro))
                        self.assertEqual([i for m in micro for i in m], list(p.positions(step)))
                        got += list(p.positions(step))
                    self.assertEqual(got, want, (step, world, cap))

    def test_indices_are_the_same_samples_at_every_width(self) -> None:
        """The samples of a step, rank by rank concatenated, are the same
        at every width; an epoch is a permutation of the dataset; a step
        may span two epochs; shuffle=False is in order."""
        n, g = 100, 24
        for step in (0, 3, 4, 8):
            ref = batch_plan(g).indices(step, n, seed=5)
            for world in (2, 3, 4, 8):
                cat = torch.cat([batch_plan(g, world, r, 5).indices(step, n, seed=5) for r in range(world)])
                self.assertTrue(torch.equal(cat, ref), (step, world))
                micro = torch.cat([i for r in range(world) for i in batch_plan(g, world, r, 5).micro_indices(step, n, seed=5)])
                self.assertTrue(torch.equal(micro, ref), (step, world))
        p = batch_plan(g)
        first = torch.cat([p.indices(s, n, seed=5) for s in range(5)])[:n]  # positions 0..99: epoch 0
        self.assertEqual(sorted(first.tolist()), list(range(n)))
        self.assertNotEqual(first.tolist(), list(range(n)))
        span = p.indices(4, n, seed=5)  # positions 96..119: 4 of epoch 0, 20 of epoch 1
        self.assertTrue(torch.equal(span[:4], first[96:]))
        second = torch.cat([p.indices(s, n, seed=5) for s in range(4, 9)])[4:104]
        self.assertEqual(sorted(second.tolist()), list(range(n)))
        self.assertNotEqual(second.tolist(), first.tolist())
        self.assertNotEqual(p.indices(0, n, seed=6).tolist(), p.indices(0, n, seed=5).tolist())
        self.assertEqual(p.indices(4, n, shuffle=False).tolist(), list(range(96, 100)) + list(range(20)))

    def test_errors_name_the_fix(self) -> None:
        cases = [
            (lambda: batch_plan(30, world_size=4), "global batch 30 does not divide among WORLD_SIZE=4 workers: make it a multiple of 4 "
                                                   r"\(e.g. 32\), or run at a width that divides it \(1, 2, 3, 5, 6, 10, 15, 30\)"),
            (lambda: batch_plan(24, 2, widths="2-8"), "global batch 24 does not divide among 5, 7 workers, widths the job may run at "
                                                      r"\('2-8'\): make the global batch a multiple of 840 \(the widths' least common "
                                                      r"multiple\), e.g. 840, or declare only widths that divide 24"),
            (lambda: batch_plan(24, 8, widths=[1, 2, 4]), r"WORLD_SIZE=8 is not among the widths the job declared \(\[1, 2, 4\]\)"),
            (lambda: batch_plan(0), "global batch 0: want an integer >= 1"),
            (lambda: batch_plan(8, 2, 2), "rank 2 of world size 2"),
            (lambda: batch_plan(8, max_per_worker=0), "max_per_worker 0: want an integer >= 1, or None for no cap"),
            (lambda: parse_widths("8-2"), "the range runs from 8 down to 2; write it low-high, 2-8"),
            (lambda: parse_widths("two"), r"want a range like \"2-8\" or a list like \"1,2,4\""),
            (lambda: parse_widths([0, 2]), "want one or more widths >= 1"),
            (lambda: batch_plan(8).indices(0, 0), "dataset of 0 samples"),
        ]
        for f, msg in cases:
            with self.assertRaisesRegex(BatchPlanError, msg):
                f()
        self.assertTrue(issubclass(BatchPlanError, ValueError))
        self.assertEqual(parse_widths("2-4"), [2, 3, 4])
        self.assertEqual(parse_widths("4, 1,2"), [1, 2, 4])
        self.assertEqual(parse_widths(3), [3])
        self.assertEqual(batch_plan(840, 7, 0, widths="2-8").per_worker, 120)
        self.assertIs(hadar_train.batch_plan, batch_plan)

    def test_which_random_state_a_rank_restores(self) -> None:
        states = [{"torch": torch.tensor([i], dtype=torch.uint8), "python": [3, [i], None]} for i in range(2)]
        self.assertEqual(rng_for_rank(None, 0, 4), (None, None))
        self.assertEqual(rng_for_rank(states, 1, 2), (states[1], None))  # same width: its own
        self.assertEqual(rng_for_rank(states, 0, 1), (states[0], None))  # narrower: ranks that stay keep theirs
        self.assertEqual(rng_for_rank(states, 1, 4), (states[1], None))  # wider: old ranks keep theirs...
        s2, s3 = rng_for_rank(states, 2, 4)[1], rng_for_rank(states, 3, 4)[1]
        self.assertIsNone(rng_for_rank(states, 2, 4)[0])  # ...new ones seed a stream of their own,
        self.assertNotEqual(s2, s3)
        self.assertEqual(s2, rng_for_rank(states, 2, 4)[1])  # the same on every resume from it
        other = [{"torch": torch.tensor([9], dtype=torch.uint8), "python": [3, [9], None]}] * 2
        self.assertNotEqual(s2, rng_for_rank(other, 2, 4)[1])


class DeclaredWidths(unittest.TestCase):
    """``run.batch_plan`` takes the widths from HADAR_WIDTHS, which the
    sidecar sets on an elastic job's workers, when the script gives none;
    widths given win; unset, nothing is checked beyond WORLD_SIZE."""

    def run_(self, world: int, rank: int = 0, **env: str) -> Run:
        run = Run(Env.from_environ(dict({"HADAR_JOB_ID": "j"}, **env)), total_steps=10, install_signals=False)
        run.rank, run.world_size = rank, world  # as a rank of a unit sees them, without its process group
        return run

    def test_the_sidecars_widths_are_checked(self) -> None:
        p = self.run_(2, 1, HADAR_WIDTHS="1,2,3,4").batch_plan(48, max_per_worker=16)
        self.assertEqual((p.world_size, p.rank, p.per_worker, p.accumulation, p.widths), (2, 1, 24, 2, (1, 2, 3, 4)))
        self.assertEqual(self.run_(4, HADAR_WIDTHS="1-4").batch_plan(12).per_worker, 3)  # parse_widths' forms

    def test_refused_naming_the_fix(self) -> None:
        for run, batch, want in [
            (self.run_(2, HADAR_WIDTHS="1,2,3,4"), 32,
             r"global batch 32 does not divide among 3 workers, widths the job may run at \('1,2,3,4'\): make the global batch a multiple of 12 "
             r"\(the widths' least common multiple\), e.g. 36, or declare only widths that divide 32 \(env HADAR_WIDTHS: the job's hadar.workers"),
            (self.run_(8, HADAR_WIDTHS="1,2,4"), 64, r"WORLD_SIZE=8 is not among the widths the job declared \('1,2,4'\) \(env HADAR_WIDTHS"),
            (self.run_(2, HADAR_WIDTHS="two"), 64, r"env HADAR_WIDTHS='two': widths 'two': want a range like \"2-8\" or a list like \"1,2,4\" "
                                                   r"\(the sidecar writes it from the job's hadar.workers; pass batch_plan\(widths=...\)"),
            (self.run_(2, HADAR_WIDTHS="0,2"), 64, r"env HADAR_WIDTHS='0,2': widths '0,2': want one or more widths >= 1"),
        ]:
            with self.subTest(want=want):
                with self.assertRaisesRegex(BatchPlanError, want):
                    run.batch_plan(batch)

    def test_widths_given_win(self) -> None:
        run = self.run_(2, HADAR_WIDTHS="1,2,3,4")
        self.assertEqual(run.batch_plan(32, widths="1,2,4").widths, (1, 2, 4))  # 3 does not divide 32: not checked
        with self.assertRaisesRegex(BatchPlanError, r"does not divide among 3 workers, widths the job may run at \('2,3'\): make"):
            self.run_(2, HADAR_WIDTHS="1,2,4").batch_plan(32, widths="2,3")

    def test_unset_as_before(self) -> None:
        self.assertEqual(self.run_(2).batch_plan(32).widths, ())  # no widths: only WORLD_SIZE is checked
        self.assertEqual(self.run_(2, HADAR_WIDTHS="").batch_plan(32).per_worker, 16)
        with self.assertRaisesRegex(BatchPlanError, "global batch 30 does not divide among WORLD_SIZE=4 workers"):
            self.run_(4).batch_plan(30)
        self.assertEqual(Env.from_environ({}).widths, "")


class Resume(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="hadar-elastic-")
        self.addCleanup(shutil.rmtree, self.dir)

    def run_(self, steps: int) -> Run:
        return Run(Env.from_environ({"HADAR_JOB_ID": "j", "HADAR_CHECKPOINT_DIR": self.dir}), total_steps=steps, install_signals=False)

    def test_a_checkpoint_of_two_ranks_resumes_one(self) -> None:
        """A checkpoint written by a unit of 2 resumes a single process:
        the model, optimizer and step come back, with rank 0's random
        states; the global batch is recorded, another one is warned of."""
        m = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        m(torch.randn(4, 3)).sum().backward()
        opt.step()
        torch.manual_seed(11)
        random.seed(11)
        writer = self.run_(10)
        rank0 = writer._rng_state()
        torch.manual_seed(12)
        rank1 = writer._rng_state()
        writer.batch_plan(64)
        writer.step = writer.local_step = 6
        writer.world_size = 2  # as rank 0 of a unit of 2 writes it
        writer.track(model=m, optimizer=opt)
        path = writer._write_checkpoint([rank0, rank1])
        payload = ck.load(path)
        self.assertEqual((payload["world_size"], payload["elastic"], len(payload["rng"])), (2, {"global_batch": 64}, 2))

        torch.manual_seed(99)
        m2 = torch.nn.Linear(3, 2)
        opt2 = torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9)
        run = self.run_(8)
        run.track(model=m2, optimizer=opt2)
        run.batch_plan(32)
        with self.assertLogs("hadar_train", "INFO") as logs:
            steps = run.steps()
            self.assertEqual(next(steps), 6)
        text = "\n".join(logs.output)
        self.assertIn("was written by a unit of 2, this one has 1: resuming resized", text)
        self.assertIn("written with a global batch of 64, this run's is 32", text)
        self.assertEqual(run.resumed_world_size, 2)
        self.assertTrue(torch.equal(m2.weight, m.weight))
        self.assertTrue(torch.equal(opt2.state_dict()["state"][0]["momentum_buffer"], opt.state_dict()["state"][0]["momentum_buffer"]))
        self.assertTrue(torch.equal(torch.get_rng_state(), rank0["torch"]))
        steps.close()


class Resize(ProcTest):
    def start_unit(self, world: int, extra: dict, args: list, name: str) -> list:
        port = free_port()
        out = []
        for r in range(world):
            env = dict(unit_env(r, world, port, node_rank=r, job="elastic"), **extra)
            env["HADAR_PROGRESS_FILE"] = os.path.join(self.tmp, f"progress-{name}-{r}.json")
            out.append(self.start(args, env, f"{name}{r}"))
        return out

    def finish(self, procs: list) -> None:
        for p in procs:
            self.assertEqual(p.wait(), 0, p.stderr())

    def test_resized_twice_on_the_unresized_loss_curve(self) -> None:
        """A unit of 2 stopped by SIGTERM with a checkpoint, resumed as 1
        worker, then as 2 again: every step's loss (the global batch's
        mean) is the unresized run's within TOLERANCE, and the end is too;
        rank 1, new to the unit at the second resize, seeds its own random
        stream."""
        ckpt = os.path.join(self.tmp, "ckpt")
        args = ELASTIC + ["--log-every", "1", "--global-batch", "48", "--max-per-worker", "16", "--widths", "1-4"]
        extra = {"HADAR_JOB_ID": "elastic", "HADAR_CHECKPOINT_DIR": ckpt, "HADAR_STEPS_PER_SEC": "40"}
        first = self.start_unit(2, extra, args + ["--steps", "2000"], "first")
        progress = os.path.join(self.tmp, "progress-first-1.json")
        self.wait_for("the unit trains", lambda: (read_progress(progress) or {}).get("steps_done", 0) >= 12, procs=first)
        for p in reversed(first):
            p.signal(signal.SIGTERM)
        self.finish(first)
        stopped = read_progress(os.path.join(self.tmp, "progress-first-0.json"))
        self.assertEqual(stopped["state"], "stopped")
        s1 = stopped["steps_done"]
        extra.pop("HADAR_STEPS_PER_SEC")

        second = self.start(args + ["--steps", str(s1 + 12)], dict(extra, HADAR_PROGRESS_FILE=os.path.join(self.tmp, "progress-second.json")), "second")
        self.finish([second])
        self.assertIn(f"ckpt-{s1}.pt was written by a unit of 2, this one has 1: resuming resized", second.stderr())
        self.assertIn("width 1: global batch 48, 48 per worker in 3 micro-batch(es) of [16, 16, 16], widths checked 1,2,3,4", second.stdout())

        total = s1 + 24
        third = self.start_unit(2, extra, args + ["--steps", str(total)], "third")
        self.finish(third)
        for p in third:
            self.assertIn(f"ckpt-{s1 + 12}.pt was written by a unit of 1, this one has 2: resuming resized", p.stderr())
        self.assertIn("rank 1 is new to the unit", third[1].stderr())
        self.assertIn("width 2: global batch 48, 24 per worker in 2 micro-batch(es) of [12, 12], widths checked 1,2,3,4", third[0].stdout())

        ref = self.start_unit(2, {"HADAR_JOB_ID": "ref"}, args + ["--steps", str(total)], "ref")
        self.finish(ref)
        resized = losses(first[0].stdout()) + losses(second.stdout()) + losses(third[0].stdout())
        want = losses(ref[0].stdout())
        self.assertEqual(len(want), total)
        self.assertEqual([line.split()[1] for line in resized], [line.split()[1] for line in want])
        diffs = [abs(float(a.split()[3]) - float(b.split()[3])) for a, b in zip(resized, want)]
        self.assertEqual(max(diffs[:s1]), 0.0)  # before the first resize: the same run
        sys.stderr.write(f"\n  resized 2 -> 1 -> 2 at steps {s1} and {s1 + 12} of {total}: max |loss - unresized loss| per step {max(diffs):.3g} ")
        self.assertLess(max(diffs), TOLERANCE, f"max abs loss difference {max(diffs):.3g}")
        end = {line.split("test_loss=")[1].split()[0] for p in (third[0], ref[0]) for line in p.stdout().splitlines() if line.startswith("final")}
        self.assertLess(max(float(x) for x in end) - min(float(x) for x in end), 1e-4, end)
        params = {p.stdout().split("params=")[1].split()[0] for p in third}
        self.assertEqual(len(params), 1, "the ranks' replicas differ")


if __name__ == "__main__":
    unittest.main()
