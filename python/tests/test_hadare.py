"""HadarE copies of one job merging through a shared directory, as the
sidecar forks and unforks them."""

from __future__ import annotations

import json
import os
import re
import signal
from typing import List, Optional

import torch

from hadar_train import state as st
from hadar_train.membership import Merged, merged_path, merged_rounds

from .helpers import Proc, ProcTest, read_progress

HADARE = ["-m", "hadar_train.examples.hadare"]


class HadarE(ProcTest):
    def copy_args(self, i: int, total: int, merge_every: int = 50, extra: Optional[dict] = None, args: Optional[list] = None) -> tuple:
        env = {"HADAR_JOB_ID": "digits", "HADAR_MERGE_DIR": os.path.join(self.tmp, "merge"), "HADAR_UNIT": str(i),
               "HADAR_TOTAL_STEPS": str(total), "HADAR_MERGE_EVERY": str(merge_every),
               "HADAR_CHECKPOINT_DIR": os.path.join(self.tmp, f"ckpt-{i}"), "HADAR_PROGRESS_FILE": os.path.join(self.tmp, f"progress-{i}.json")}
        env.update(extra or {})
        return HADARE + (args or []), env, f"copy{i}"

    def copy(self, i: int, total: int, merge_every: int = 50, extra: Optional[dict] = None, args: Optional[list] = None) -> Proc:
        return self.start(*self.copy_args(i, total, merge_every, extra, args))

    def copies(self, n: int, total: int, extra: Optional[dict] = None) -> List[Proc]:
        """n copies started together (tests.gate), as the job's first
        copies: how long each takes to import torch on a loaded machine
        decides nothing. With ``HADAR_COPIES`` declared in extra, the
        first round waits for every declared copy, by the protocol."""
        return self.start_together([self.copy_args(i, total, extra=extra) for i in range(n)])

    def records(self) -> str:
        """What a failure message needs to tell a start race from a defect
        of the protocol: each copy's stderr, and every round's members,
        closer and closing time."""
        out = []
        for p in self.procs:
            out.append(f"--- {os.path.basename(p.err)}:\n{p.stderr()[-4000:]}")
        for m in self.rounds():
            out.append(f"round {m.round}: members {m.members} targets {m.targets} closed by {m.closed_by} at {m.closed}")
        return "\n".join(out)

    def rounds(self) -> list:
        d = os.path.join(self.tmp, "merge")
        out = []
        for r in merged_rounds(d):
            with open(merged_path(d, r), "rb") as f:
                out.append(Merged.parse(f.read()))
        return out

    def check_rounds(self, total: int) -> list:
        """Every round's steps add up; the last is done at the total."""
        rounds = self.rounds()
        prev = 0
        for i, m in enumerate(rounds):
            self.assertEqual(m.round, i)
            self.assertEqual(m.steps_done, prev + sum(c["steps"] for c in m.members), f"round {i}: {m.members}")
            prev = m.steps_done
        self.assertTrue(rounds[-1].done)
        self.assertEqual(rounds[-1].steps_done, total)
        return rounds

    def test_two_copies_merge_and_match_a_single_job(self) -> None:
        total = 1200
        # Two declared copies started together: round 1 waits for both
        # (a copy that started after its job was done would rightly find
        # nothing left to do, which a loaded machine's import times made
        # happen in this test before).
        copies = self.copies(2, total, extra={"HADAR_COPIES": "2"})
        finals = []
        for i, p in enumerate(copies):
            self.assertEqual(p.wait(), 0, self.records())
            finals.append(p.stdout().splitlines()[-1])
            prog = read_progress(os.path.join(self.tmp, f"progress-{i}.json"))
            self.assertEqual((prog["state"], prog["steps_done"], prog["copy_index"]), ("done", total, i))
        rounds = self.check_rounds(total)
        both = [m for m in rounds if len(m.members) == 2]
        self.assertGreaterEqual(len(both), 5, self.records())
        # Both copies end holding the last merged model.
        acc = [re.search(r"test_accuracy=(\S+)", f).group(1) for f in finals]
        self.assertEqual(acc[0], acc[1], finals)
        ev = self.start(HADARE + ["--evaluate", merged_path(os.path.join(self.tmp, "merge"), rounds[-1].round)], {}, "eval")
        self.assertEqual(ev.wait(), 0, ev.stderr())
        self.assertIn(f"test_accuracy={acc[0]}", ev.stdout())
        # The same steps as one job: within a point of its accuracy.
        single = self.start(["-m", "hadar_train.examples.single", "--steps", str(total)], {}, "single")
        self.assertEqual(single.wait(), 0, single.stderr())
        single_acc = float(re.search(r"test_accuracy=(\S+)", single.stdout()).group(1))
        self.assertLessEqual(single_acc - float(acc[0]), 0.01, f"copies {acc[0]}, single job {single_acc}")

    def test_a_stopped_copy_leaves_its_steps_and_a_late_one_joins(self) -> None:
        total = 4000
        # The first two start together (no HADAR_COPIES: the sidecar's
        # copies come and go), paced so that one alone would take 26 s.
        first, second = self.copies(2, total, extra={"HADAR_STEPS_PER_SEC": "150"})
        self.wait_for("three rounds with both copies", lambda: sum(len(m.members) == 2 for m in self.rounds()) >= 3)
        # A new copy (the sidecar forked again) starts from the newest
        # round, while copy 1 is taken away.
        third = self.copy(2, total)
        second.signal(signal.SIGTERM)
        self.assertEqual(second.wait(), 0, second.stderr())
        p1 = read_progress(os.path.join(self.tmp, "progress-1.json"))
        self.assertEqual(p1["state"], "stopped")
        for p in (first, third):
            self.assertEqual(p.wait(), 0, p.stderr())
        rounds = self.check_rounds(total)
        merged = {}
        for m in rounds:
            for c in m.members:
                merged[c["copy"]] = merged.get(c["copy"], 0) + c["steps"]
        # Every step copy 1 took is in a merged round, its last ones too.
        self.assertEqual(merged[1], p1["local_steps"], merged)
        self.assertIn("starting from the newest merged round round=", third.stderr())
        start = int(re.search(r"newest merged round round=(\d+)", third.stderr()).group(1))
        self.assertGreaterEqual(start, 3)
        self.assertTrue(any(c["copy"] == 2 for m in rounds for c in m.members))

    def test_the_merged_state_is_the_step_weighted_average(self) -> None:
        # Copies on a fast and a slow "GPU", with rounds sized by pace
        # (HADAR_MERGE_INTERVAL): the round's weights are their steps.
        total = 600
        fast, slow = self.start_together([
            self.copy_args(0, total, extra={"HADAR_STEPS_PER_SEC": "200", "HADAR_MERGE_INTERVAL": "500ms", "HADAR_COPIES": "2"}),
            self.copy_args(1, total, extra={"HADAR_STEPS_PER_SEC": "50", "HADAR_MERGE_INTERVAL": "500ms", "HADAR_COPIES": "2"})])
        for p in (fast, slow):
            self.assertEqual(p.wait(), 0, self.records())
        rounds = self.check_rounds(total)
        d = os.path.join(self.tmp, "merge")
        checked = 0
        for prev, m in zip(rounds, rounds[1:]):
            if len(m.members) != 2:
                continue
            files = []
            for c in m.members:
                path = os.path.join(d, f"round-{m.round}", f"copy-{c['copy']}.json")
                with open(path) as f:
                    files.append(json.load(f))
            want = st.merge_states([st.decode_state(f["state"]) for f in files], [f["steps"] for f in files])
            for name, t in want.items():
                self.assertTrue(torch.equal(t, m.state[name]), f"round {m.round} tensor {name}")
            self.assertEqual({f["steps"] for f in files}, {c["steps"] for c in m.members})
            checked += 1
        steps = [c["steps"] for m in rounds for c in m.members if len(m.members) == 2]
        self.assertGreaterEqual(checked, 2, self.records())
        self.assertGreater(max(steps), min(steps), "rounds sized by pace give the fast copy more steps")
