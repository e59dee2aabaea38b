"""Training processes as hadar starts them: the examples under the
contract's environment, stopped and resumed, alone and as a unit."""

from __future__ import annotations

import os
import signal
import textwrap

from .helpers import ProcTest, free_port, losses, read_progress, unit_env

SINGLE = ["-m", "hadar_train.examples.single"]
DDP = ["-m", "hadar_train.examples.ddp"]


class SingleProcess(ProcTest):
    def test_outside_hadar_it_writes_nothing(self) -> None:
        p = self.start(SINGLE + ["--steps", "50"], {}, "plain")
        self.assertEqual(p.wait(), 0, p.stderr())
        self.assertIn("final steps_done=50", p.stdout())
        self.assertEqual(sorted(os.listdir(self.tmp)), ["plain.err", "plain.out"])

    def test_stop_and_resume_follow_the_uninterrupted_run(self) -> None:
        """SIGTERM mid-run: a checkpoint, the progress file says stopped
        and names it, exit 0; the next run resumes at its step, and the
        losses of both runs together are the uninterrupted run's, digit
        for digit (model, optimizer, scheduler and random state all came
        back)."""
        args = SINGLE + ["--steps", "400", "--log-every", "1"]
        ref = self.start(args, {}, "reference")
        self.assertEqual(ref.wait(), 0, ref.stderr())
        ckpt, progress = os.path.join(self.tmp, "ckpt"), os.path.join(self.tmp, "progress.json")
        env = {"HADAR_CHECKPOINT_DIR": ckpt, "HADAR_PROGRESS_FILE": progress, "HADAR_JOB_ID": "single", "HADAR_STEPS_PER_SEC": "100"}
        first = self.start(args, env, "first")
        self.wait_for("100 steps", lambda: (read_progress(progress) or {}).get("steps_done", 0) >= 100, procs=[first])
        first.signal(signal.SIGTERM)
        self.assertEqual(first.wait(), 0, first.stderr())
        p = read_progress(progress)
        self.assertEqual(p["state"], "stopped")
        self.assertTrue(100 <= p["steps_done"] < 400, p)
        self.assertEqual(p["checkpoint"], os.path.join(ckpt, f"ckpt-{p['steps_done']}.pt"))
        self.assertEqual(len(losses(first.stdout())), p["steps_done"])
        env.pop("HADAR_STEPS_PER_SEC")
        second = self.start(args, env, "second")
        self.assertEqual(second.wait(), 0, second.stderr())
        self.assertIn(f"resumed from checkpoint {p['checkpoint']} at step {p['steps_done']}", second.stderr())
        self.assertEqual(losses(first.stdout()) + losses(second.stdout()), losses(ref.stdout()))
        self.assertEqual(second.stdout().splitlines()[-1], ref.stdout().splitlines()[-1])
        done = read_progress(progress)
        self.assertEqual((done["state"], done["steps_done"], done["version"]), ("done", 400, 2))
        # Placed again after the end (Nomad re-runs a finished batch
        # worker when its job is rewritten as it ends): it resumes at the
        # last step, trains nothing, and ends done with exit 0.
        again = self.start(args, env, "again")
        self.assertEqual(again.wait(), 0, again.stderr())
        self.assertEqual(losses(again.stdout()), [])
        done = read_progress(progress)
        self.assertEqual((done["state"], done["steps_done"]), ("done", 400))


class Unit(ProcTest):
    def start_unit(self, world: int, extra: dict, args: list, name: str = "rank") -> list:
        port = free_port()
        out = []
        for r in range(world):
            env = dict(unit_env(r, world, port, node_rank=r, job="ddp"), **extra)
            env["HADAR_PROGRESS_FILE"] = os.path.join(self.tmp, f"progress-{r}.json")
            out.append(self.start(args, env, f"{name}{r}"))
        return out

    def progress(self, r: int) -> dict:
        return read_progress(os.path.join(self.tmp, f"progress-{r}.json")) or {}

    def test_torch_env_init_with_hadars_environment(self) -> None:
        """A plain script that knows nothing of hadar: torch's own env://
        rendezvous from the variables the contract writes, and each
        process's device index (LOCAL_RANK) is 0."""
        script = os.path.join(self.tmp, "plain.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent("""
                import os, torch, torch.distributed as dist
                dist.init_process_group("gloo", init_method="env://")
                t = torch.tensor([float(dist.get_rank() + 1)])
                dist.all_reduce(t)
                print(f"rank={dist.get_rank()} world={dist.get_world_size()} sum={t.item()} local_rank={os.environ['LOCAL_RANK']} "
                      f"group={os.environ['GROUP_RANK']}/{os.environ['GROUP_WORLD_SIZE']} role={os.environ['ROLE_NAME']}")
                dist.destroy_process_group()
            """))
        procs = self.start_unit(3, {}, [script])
        for r, p in enumerate(procs):
            self.assertEqual(p.wait(), 0, p.stderr())
            self.assertEqual(p.stdout().strip(), f"rank={r} world=3 sum=6.0 local_rank=0 group={r}/3 role=default")

    def test_ddp_completes_with_equal_replicas(self) -> None:
        procs = self.start_unit(2, {"HADAR_JOB_ID": "ddp"}, DDP + ["--steps", "150"])
        finals = []
        for r, p in enumerate(procs):
            self.assertEqual(p.wait(), 0, p.stderr())
            finals.append(p.stdout().splitlines()[-1])
            self.assertEqual(self.progress(r)["state"], "done")
            self.assertEqual((self.progress(r)["rank"], self.progress(r)["world_size"], self.progress(r)["nodes"]), (r, 2, 2))
        self.assertIn("final steps_done=150 rank=0", finals[0])
        self.assertEqual(finals[0].split("params=")[1], finals[1].split("params=")[1])

    def test_ranks_stop_together_and_resume(self) -> None:
        """SIGTERM to both ranks at slightly different steps: they agree on
        one step, rank 0 checkpoints, both exit 0 naming the checkpoint;
        the unit started again resumes every rank there."""
        ckpt = os.path.join(self.tmp, "ckpt")
        extra = {"HADAR_JOB_ID": "ddp", "HADAR_CHECKPOINT_DIR": ckpt, "HADAR_STEPS_PER_SEC": "50"}
        procs = self.start_unit(2, extra, DDP + ["--steps", "2000"])
        self.wait_for("the unit trains", lambda: self.progress(1).get("steps_done", 0) >= 30)
        procs[1].signal(signal.SIGTERM)
        procs[0].signal(signal.SIGTERM)
        for p in procs:
            self.assertEqual(p.wait(), 0, p.stderr())
        p0, p1 = self.progress(0), self.progress(1)
        self.assertEqual((p0["state"], p1["state"]), ("stopped", "stopped"))
        self.assertEqual(p0["steps_done"], p1["steps_done"])
        self.assertEqual(p0["checkpoint"], os.path.join(ckpt, f"ckpt-{p0['steps_done']}.pt"))
        self.assertEqual(p1["checkpoint"], p0["checkpoint"])
        step = p0["steps_done"]
        extra.pop("HADAR_STEPS_PER_SEC")
        again = self.start_unit(2, extra, DDP + ["--steps", str(step + 40)], name="again")
        for p in again:
            self.assertEqual(p.wait(), 0, p.stderr())
            self.assertIn(f"resumed from checkpoint {p0['checkpoint']} at step {step}", p.stderr())
        self.assertEqual(again[0].stdout().split("params=")[1].split()[0], again[1].stdout().split("params=")[1].split()[0])

    def test_a_peer_stopped_alone_fails_the_unit(self) -> None:
        """Only rank 1 is stopped (its node drained): the unit stops at one
        step with rank 0's checkpoint; rank 1 exits 0; rank 0, never asked
        to stop, exits 1 after its grace so the scheduler plans anew."""
        ckpt = os.path.join(self.tmp, "ckpt")
        procs = self.start_unit(2, {"HADAR_JOB_ID": "ddp", "HADAR_CHECKPOINT_DIR": ckpt, "HADAR_STEPS_PER_SEC": "50"},
                                DDP + ["--steps", "2000", "--stop-grace", "1"])
        self.wait_for("the unit trains", lambda: self.progress(0).get("steps_done", 0) >= 20)
        procs[1].signal(signal.SIGTERM)
        self.assertEqual(procs[1].wait(), 0, procs[1].stderr())
        self.assertEqual(procs[0].wait(), 1, procs[0].stderr())
        self.assertEqual((self.progress(0)["state"], self.progress(1)["state"]), ("failed", "stopped"))
        self.assertTrue(os.path.exists(self.progress(0)["checkpoint"]))
        self.assertIn("exiting 1 so the scheduler plans the job anew", procs[0].stderr())

    def test_a_lost_peer_breaks_the_unit_without_hanging(self) -> None:
        """Rank 1 is killed outright: rank 0's next collective fails at
        once (no hang until a timeout), it saves what it holds, and exits 1."""
        ckpt = os.path.join(self.tmp, "ckpt")
        procs = self.start_unit(2, {"HADAR_JOB_ID": "ddp", "HADAR_CHECKPOINT_DIR": ckpt, "HADAR_STEPS_PER_SEC": "50"},
                                DDP + ["--steps", "2000", "--stop-grace", "1"])
        self.wait_for("the unit trains", lambda: self.progress(0).get("steps_done", 0) >= 20)
        procs[1].signal(signal.SIGKILL)
        self.assertEqual(procs[0].wait(timeout=60), 1, procs[0].stderr())
        p0 = self.progress(0)
        self.assertEqual(p0["state"], "failed")
        self.assertTrue(os.path.exists(p0["checkpoint"]), p0)

    def test_a_stop_while_gathering_exits_at_once(self) -> None:
        """Rank 0 waits for a peer that never comes; a stop signal ends it
        at once with exit 0 (no step ran: nothing to save)."""
        procs = self.start_unit(2, {"HADAR_JOB_ID": "ddp"}, DDP + ["--steps", "10"])
        procs[1].kill()
        self.wait_for("rank 0 waits for its unit", lambda: "joining the unit" in procs[0].stderr(), procs=procs[:1])
        procs[0].signal(signal.SIGTERM)
        self.assertEqual(procs[0].wait(timeout=30), 0, procs[0].stderr())
        self.assertEqual(self.progress(0)["state"], "stopped")
