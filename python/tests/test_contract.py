"""The library against the contract's fixtures (contract/testdata), the
ones the Go implementations are tested against."""

from __future__ import annotations

import json
import math
import unittest

import torch

from hadar_train import checkpoint as ck
from hadar_train import state as st
from hadar_train.env import Env
from hadar_train.membership import CopyFile, Merged, MergeError, close_round, parse_time
from hadar_train.progress import Progress

from .helpers import fixture, fixture_json


class ProgressFixtures(unittest.TestCase):
    def test_full_round_trip(self) -> None:
        raw = fixture("progress-full.json")
        p = Progress.from_json(raw)
        self.assertEqual((p.steps_done, p.total_steps, p.version, p.state, p.local_steps, p.nodes), (1200, 5000, 2, "running", 600, 2))
        # Written back, it is the fixture's object again, field for field.
        want = json.loads(raw)
        got = p.to_json()
        self.assertEqual(list(got), list(want))
        self.assertEqual(got, want)

    def test_minimal(self) -> None:
        p = Progress.from_json(fixture("progress-minimal.json"))
        self.assertEqual((p.steps_done, p.total_steps, p.checkpoint), (7, 10, ""))

    def test_refuses(self) -> None:
        with self.assertRaisesRegex(ValueError, "negative"):
            Progress.from_json(b'{"steps_done": -1}')
        with self.assertRaisesRegex(ValueError, "more than"):
            Progress.from_json(b" " * (1 << 20 + 1))


class MergeFixture(unittest.TestCase):
    """Round 3 of contract/testdata/merge-dir closed by this library is
    the fixture's merged.json: the same members, steps and targets, and
    the same merged tensors."""

    def test_close_round_3(self) -> None:
        base = Merged.parse(fixture("merge-dir", "round-2", "merged.json"))
        c0 = CopyFile.parse(fixture("merge-dir", "round-3", "copy-0.json"))
        c1 = CopyFile.parse(fixture("merge-dir", "round-3", "copy-1.json"))
        want_raw = fixture_json("merge-dir", "round-3", "merged.json")
        joiners = []
        for i in range(3):
            hb = fixture_json("merge-dir", "members", f"copy-{i}.json")
            if hb["state"] == "joining":
                joiners.append((hb["copy"], hb["merge_every"]))
        got = close_round(base, [c1, c0], joiners, closed_by=1, fallback=100, closed=want_raw["closed"])
        got_raw = json.loads(got.to_json())
        self.assertEqual(sorted(got_raw), sorted(want_raw))
        for k in want_raw:
            if k != "state":
                self.assertEqual(got_raw[k], want_raw[k], k)
        want = st.decode_state(want_raw["state"])
        self.assertEqual(sorted(got.state), sorted(want))
        for name, t in want.items():
            g = got.state[name]
            self.assertEqual(g.dtype, t.dtype, name)
            self.assertEqual(list(g.shape), list(t.shape), name)
            if t.dtype.is_floating_point:
                self.assertTrue(torch.allclose(g.double(), t.double(), rtol=1e-12, atol=0), name)
            else:
                self.assertTrue(torch.equal(g, t), name)

    def test_files_round_trip(self) -> None:
        # What this library writes is the fixture's JSON: the same fields
        # (the Go side refuses unknown ones) and the same tensors.
        for rel, cls in (("round-3/copy-0.json", CopyFile), ("round-3/copy-1.json", CopyFile), ("round-2/merged.json", Merged)):
            raw = fixture("merge-dir", *rel.split("/"))
            again = json.loads(cls.parse(raw).to_json())
            self.assertEqual(again, json.loads(raw), rel)

    def test_refuses_other_versions_and_fields(self) -> None:
        raw = fixture("merge-dir", "round-3", "copy-0.json").decode()
        for old, new, why in (('"version": 3', '"version": 2', "version"),
                              ('"version": 3', '"version": 3, "params": {}', "unknown fields"),
                              ('"round": 3', '"round": 0', "round >= 1"),
                              ('"dtype": "float32"', '"dtype": "complex64"', "dtype")):
            bad = raw.replace(old, new, 1)
            self.assertNotEqual(bad, raw)
            with self.assertRaisesRegex(MergeError, why):
                CopyFile.parse(bad.encode())

    def test_heartbeat_times(self) -> None:
        hb = fixture_json("merge-dir", "members", "copy-2.json")
        self.assertEqual(parse_time(hb["updated"]), 1795305540.0)
        self.assertAlmostEqual(parse_time("2026-11-21T23:59:00.123456789Z"), 1795305540.123456789, places=5)
        self.assertEqual(parse_time("2026-11-22T01:59:00+02:00"), 1795305540.0)


class MergeRules(unittest.TestCase):
    """contract/merge_test.go's table, here."""

    def t(self, dtype: torch.dtype, *vs: float) -> dict:
        return {"w": torch.tensor(vs, dtype=dtype)}

    def test_table(self) -> None:
        f64, f32, f16, bf16 = torch.float64, torch.float32, torch.float16, torch.bfloat16
        for name, states, weights, want, dtype in (
            ("weighted", [self.t(f64, 1, 2), self.t(f64, 3, 6)], [3, 1], [1.5, 3], f64),
            ("all weights 0 average equally", [self.t(f32, 1), self.t(f32, 3)], [0, 0], [2], f32),
            ("a zero weight does not count", [self.t(f32, 1), self.t(f32, 3)], [0, 5], [3], f32),
            ("float16 and bfloat16 widen to float32", [self.t(f16, 1), self.t(bf16, 2)], [1, 1], [1.5], f32),
            ("one state", [self.t(bf16, 0.5)], [7], [0.5], bf16),
        ):
            got = st.merge_states(states, weights)["w"]
            self.assertEqual(got.dtype, dtype, name)
            self.assertEqual(got.tolist(), want, name)
        for states, weights, why in (([self.t(f32, 1)], [-1], "weight 0"),
                                     ([self.t(f32, 1), self.t(f32, 1, 2)], [1, 1], "shape"),
                                     ([self.t(f32, 1), {"v": torch.tensor([1.0])}], [1, 1], "missing")):
            with self.assertRaisesRegex(st.StateError, why):
                st.merge_states(states, weights)

    def test_integers_from_the_heaviest(self) -> None:
        a = {"n": torch.tensor(5), "w": torch.tensor([1.0])}
        b = {"n": torch.tensor(9), "w": torch.tensor([3.0])}
        self.assertEqual(int(st.merge_states([a, b], [1, 3])["n"]), 9)
        self.assertEqual(int(st.merge_states([a, b], [2, 2])["n"]), 5)

    def test_next_targets(self) -> None:
        self.assertEqual(st.next_targets(1000, [(0, 100), (3, 0)], 20), [{"copy": 0, "steps": 100}, {"copy": 3, "steps": 0}])
        self.assertEqual(st.next_targets(50, [(0, 100), (1, 50), (2, 80)], 20),
                         [{"copy": 0, "steps": 22}, {"copy": 1, "steps": 11}, {"copy": 2, "steps": 17}])
        self.assertEqual(st.next_targets(10, [(0, 0), (1, 20)], 20), [{"copy": 0, "steps": 5}, {"copy": 1, "steps": 5}])
        self.assertEqual(st.next_targets(1, [(0, 10), (1, 10)], 20), [{"copy": 0, "steps": 1}])
        self.assertEqual(st.next_targets(0, [(0, 10)], 20), [])

    def test_tensor_encoding(self) -> None:
        for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.uint8, torch.bool):
            t = (torch.arange(6) % 3).reshape(2, 3).to(dtype)
            enc = st.encode_tensor(t)
            back = st.decode_tensor(json.loads(json.dumps(enc)))
            self.assertTrue(torch.equal(back, t), dtype)
        self.assertEqual(st.decode_tensor(st.encode_tensor(torch.tensor(3.5))).shape, torch.Size([]))
        with self.assertRaisesRegex(st.StateError, "finite"):
            st.decode_tensor(st.encode_tensor(torch.tensor([math.nan])))
        with self.assertRaisesRegex(st.StateError, "bytes"):
            st.decode_tensor({"dtype": "float32", "shape": [2], "data": "AAAA"})


class CheckpointNames(unittest.TestCase):
    def test_fixture(self) -> None:
        fx = fixture_json("checkpoints.json")
        self.assertEqual(ck.checkpoints(fx["entries"], None), fx["newest_first"])
        self.assertEqual(ck.checkpoints(fx["entries"], "pt"), fx["newest_first_pt"])
        self.assertEqual(ck.checkpoints(fx["entries"], "json"), fx["newest_first_json"])
        self.assertEqual(ck.checkpoint_name(1200), "ckpt-1200.pt")


class WorkerEnvironment(unittest.TestCase):
    def test_fixture(self) -> None:
        fx = fixture_json("worker-env.json")
        env = dict(fx["env"], **fx["defaults"])
        e = Env.from_environ(env)
        w = fx["worker"]
        self.assertEqual((e.rank, e.world_size, e.local_rank, e.local_world_size), (w["rank"], w["world_size"], 0, 1))
        self.assertEqual((e.group_rank, e.group_world_size, e.node_rank), (w["rank"], w["world_size"], w["node_rank"]))
        self.assertEqual((e.master_addr, e.master_port, e.run_id), (w["master_addr"], w["master_port"], w["run_id"]))
        self.assertTrue(e.distributed)
        self.assertFalse(e.merging)


if __name__ == "__main__":
    unittest.main()
