"""Reading hadar's environment, and being harmless without it."""

from __future__ import annotations

import os
import unittest

from hadar_train.env import Env, EnvError, parse_duration


class EnvTest(unittest.TestCase):
    def test_outside_hadar(self) -> None:
        e = Env.from_environ({"HOME": "/root", "PATH": "/usr/bin"})
        self.assertFalse(e.under_hadar)
        self.assertIsNone(e.progress_file)  # nobody reads one: none is written
        self.assertIsNone(e.checkpoint_dir)
        self.assertEqual((e.rank, e.world_size, e.distributed, e.merging, e.total_steps), (0, 1, False, False, None))

    def test_defaults_under_nomad(self) -> None:
        e = Env.from_environ({"NOMAD_ALLOC_ID": "a1", "NOMAD_TASK_DIR": "/local", "NOMAD_ALLOC_DIR": "/alloc", "NOMAD_JOB_ID": "j"})
        self.assertTrue(e.under_hadar)
        self.assertEqual(e.progress_file, "/local/hadar-progress.json")
        self.assertEqual(e.checkpoint_dir, "/alloc/data/checkpoints")
        self.assertEqual(e.job_id, "j")

    def test_hadare_copy_of_the_sidecar(self) -> None:
        # A unit the sidecar placed for a forkable job on a Nomad driver:
        # HADAR_COPY_INDEX is given; hadar-train derives it from HADAR_UNIT.
        e = Env.from_environ({"HADAR_MERGE_DIR": "/m/default/j", "HADAR_UNIT": "4", "HADAR_MERGE_INTERVAL": "1m30s", "HADAR_TOTAL_STEPS": "900"})
        self.assertEqual((e.copy_index, e.copies, e.merging, e.merge_interval, e.total_steps), (4, 1, True, 90.0, 900))
        e = Env.from_environ({"HADAR_MERGE_DIR": "/m", "HADAR_UNIT": "4", "HADAR_COPY_INDEX": "2"})
        self.assertEqual(e.copy_index, 2)
        # Without merging, the unit is not a copy.
        self.assertEqual(Env.from_environ({"HADAR_UNIT": "4"}).copy_index, 0)

    def test_refuses(self) -> None:
        for env, why in (({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK=2"),
                         ({"WORLD_SIZE": "2"}, "MASTER_ADDR"),
                         ({"WORLD_SIZE": "zero"}, "WORLD_SIZE"),
                         ({"HADAR_TOTAL_STEPS": "0"}, "HADAR_TOTAL_STEPS"),
                         ({"HADAR_STEPS_PER_SEC": "-3"}, "HADAR_STEPS_PER_SEC"),
                         ({"HADAR_COPIES": "2", "HADAR_COPY_INDEX": "2", "HADAR_MERGE_DIR": "/m"}, "HADAR_COPY_INDEX"),
                         ({"HADAR_CHECKPOINT_DIR": "${meta.hadar.checkpoint_root}/default/j"}, "node meta"),
                         ({"HADAR_MERGE_DIR": "/m", "HADAR_MERGE_INTERVAL": "soon"}, "duration")):
            with self.assertRaisesRegex(EnvError, why, msg=str(env)):
                Env.from_environ(env)

    def test_durations(self) -> None:
        for s, want in (("2s", 2.0), ("500ms", 0.5), ("1m30s", 90.0), ("1h", 3600.0), ("0", 0.0), ("1.5s", 1.5)):
            self.assertEqual(parse_duration(s), want, s)

    def test_reads_os_environ_by_default(self) -> None:
        os.environ["HADAR_JOB_ID"] = "from-os"
        self.addCleanup(os.environ.pop, "HADAR_JOB_ID")
        self.assertEqual(Env.from_environ().job_id, "from-os")


if __name__ == "__main__":
    unittest.main()
