"""The launcher, ``python -m hadar_train.run SCRIPT``: a stop that comes
before ``init()`` (while the script still imports torch) ends the process
with exit 0 at once, and the process ends with the contract's status
even when interpreter shutdown would hang."""

from __future__ import annotations

import os
import signal
import textwrap
import time

from .helpers import ProcTest, read_progress

LAUNCHER = ["-m", "hadar_train.run"]

# A script whose start-up is slow (as importing torch is on a loaded
# node: seconds, half a minute): it says when it started, then sleeps
# before it imports hadar_train and calls init().
SLOW_START = """
import os, sys, time
open(os.environ["STARTED"], "w").close()
{sleep}
import hadar_train
run = hadar_train.init(total_steps=5)
print("init returned", flush=True)
for _ in run.steps():
    pass
run.close()
"""


class StopBeforeInit(ProcTest):
    def script(self, name: str, text: str) -> str:
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))
        return path

    def start_slow(self, args: list, sleep: str, name: str) -> tuple:
        script = self.script(name + ".py", SLOW_START.format(sleep=sleep))
        started = os.path.join(self.tmp, name + ".started")
        progress = os.path.join(self.tmp, name + "-progress.json")
        env = {"STARTED": started, "HADAR_PROGRESS_FILE": progress, "HADAR_JOB_ID": "early", "IN_TRY": started + ".in-try"}
        p = self.start(args + [script], env, name)
        # A snippet with a try block says when it is inside it (IN_TRY):
        # a stop sent between the start and the try, which a loaded machine
        # makes likely, would test the plain stop instead (seen in make
        # test: exit 0 but nothing swallowed).
        ready = env["IN_TRY"] if "IN_TRY" in sleep else started
        self.wait_for("the script starts", lambda: os.path.exists(ready), procs=[p])
        return p, progress

    def test_a_stop_while_the_script_starts_exits_0_at_once(self) -> None:
        """Under the launcher a SIGTERM while the script still starts (here
        a sleep of two minutes standing for the import of torch) ends it
        with exit 0 within seconds. Without the launcher the process has
        no handler yet: plain ``python`` dies of the signal (143), and as
        PID 1 of a PID namespace (Nomad's exec driver) the kernel drops it
        and the task runs on until kill_timeout's SIGKILL; docs/pytorch.md
        says to start scripts with the launcher."""
        p, _ = self.start_slow(LAUNCHER, "time.sleep(120)", "launched")
        t0 = time.monotonic()
        p.signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=30), 0, p.stderr())
        self.assertLess(time.monotonic() - t0, 15)
        self.assertNotIn("init returned", p.stdout())
        self.assertIn("got SIGTERM before the run started", p.stderr())

        plain, _ = self.start_slow([], "time.sleep(120)", "plain")
        plain.signal(signal.SIGTERM)
        self.assertEqual(plain.wait(timeout=30), -signal.SIGTERM, plain.stderr())

    def test_a_stop_the_script_swallowed_is_handed_to_init(self) -> None:
        """A script that catches the launcher's exit (a broad ``except
        BaseException``) and goes on: ``init()`` sees the stop, writes a
        stopped progress file and raises ``Stopped(0)``: exit 0, no step."""
        sleep = textwrap.dedent("""
            try:
                open(os.environ["IN_TRY"], "w").close()
                time.sleep(120)
            except BaseException as e:
                print("swallowed", type(e).__name__, flush=True)
        """)
        p, progress = self.start_slow(LAUNCHER, sleep, "swallow")
        p.signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=120), 0, p.stderr())
        self.assertIn("swallowed Stopped", p.stdout())
        self.assertNotIn("init returned", p.stdout())
        self.assertIn("came before init(); nothing ran", p.stderr())
        prog = read_progress(progress)
        self.assertEqual((prog["state"], prog["steps_done"]), ("stopped", 0), prog)

    def test_a_stop_turned_into_another_exception_exits_0(self) -> None:
        """The launcher's exit raised where the script was, inside code that
        turns it into another exception: importing torch, the signal runs
        the handler inside torch._C's initialisation, which re-raises
        ``RuntimeError: Stopped: 0`` (seen live on Nomad's exec driver:
        the stopped task ended with exit 1). The script ended because of
        the stop, before any step: exit 0."""
        sleep = textwrap.dedent("""
            try:
                open(os.environ["IN_TRY"], "w").close()
                time.sleep(120)
            except BaseException as e:
                raise RuntimeError(f"{type(e).__name__}: {e}")  # as pybind11 does
        """)
        p, _ = self.start_slow(LAUNCHER, sleep, "converted")
        p.signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=30), 0, p.stderr())
        self.assertNotIn("init returned", p.stdout())
        self.assertIn("ended with RuntimeError: Stopped: 0 after SIGTERM came before the run started; exiting 0", p.stderr())

        # Without a stop, an exception is the script's failure: exit 1.
        failing = self.script("failing.py", "raise RuntimeError('a bug')\n")
        f = self.start(LAUNCHER + [failing], {}, "failing")
        self.assertEqual(f.wait(timeout=60), 1, f.stderr())
        self.assertIn("RuntimeError: a bug", f.stderr())

    def test_runs_scripts_and_modules_as_python_does(self) -> None:
        """``SCRIPT ARGS`` and ``-m MODULE ARGS`` run as ``__main__`` with
        their argv and path, and the process ends with the script's status."""
        show = self.script("show.py", """
            import os, sys
            print(__name__, sys.argv[1:], sys.path[0] == os.path.dirname(os.path.abspath(__file__)), flush=True)
            sys.exit(int(sys.argv[1]))
        """)
        p = self.start(LAUNCHER + [show, "3", "x"], {}, "show")
        self.assertEqual(p.wait(), 3, p.stderr())
        self.assertEqual(p.stdout().strip(), "__main__ ['3', 'x'] True")
        boom = self.script("boom.py", "raise ValueError('boom')\n")
        p = self.start(LAUNCHER + [boom], {}, "boom")
        self.assertEqual(p.wait(), 1, p.stderr())
        self.assertIn("ValueError: boom", p.stderr())
        p = self.start(LAUNCHER + ["-m", "hadar_train.examples.single", "--steps", "20"], {}, "module")
        self.assertEqual(p.wait(), 0, p.stderr())
        self.assertIn("final steps_done=20", p.stdout())
        p = self.start(LAUNCHER, {}, "usage")
        self.assertEqual(p.wait(), 2, p.stderr())
        self.assertIn("usage: python -m hadar_train.run SCRIPT", p.stderr())


# A DDP script whose interpreter shutdown hangs, as torch 1.13's can after
# gloo (3 of 18 exits locally): an object that sleeps in its destructor
# once the interpreter finalizes.
HANGS_AT_EXIT = """
import sys, time, types
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
import hadar_train


class HangsAtShutdown:
    def __del__(self, time=time, sys=sys):
        if sys.is_finalizing():
            time.sleep(3600)


# In a module of its own: the interpreter clears it (and runs the
# destructor) when it finalizes, after the atexit handlers.
hang = types.ModuleType("hadar_test_hang")
hang.obj = HangsAtShutdown()
sys.modules[hang.__name__] = hang
del hang
torch.manual_seed(0)
run = hadar_train.init(total_steps=int(sys.argv[1]), stop_grace=float(sys.argv[2]))
model = torch.nn.Linear(4, 1)
if run.distributed:
    model = DDP(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run.track(model=model, optimizer=opt)
for step in run.steps():
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    run.report(loss=loss.item())
print("DONE", flush=True)
run.close()
"""


class ExitUnderDDP(ProcTest):
    """Two ranks over gloo whose interpreter shutdown hangs: the process
    still ends, within a bound, with the contract's status: after
    ``close()`` (done: 0), after ``Stopped`` (stopped here: 0; a peer
    stopped alone: 1), with the launcher and without."""

    def start_unit(self, launcher: list, steps: int, grace: float, name: str, pace: str = "") -> list:
        from .helpers import free_port, unit_env

        script = os.path.join(self.tmp, "hangs.py")
        with open(script, "w") as f:
            f.write(HANGS_AT_EXIT)
        port = free_port()
        procs = []
        for r in range(2):
            env = dict(unit_env(r, 2, port, job=name), HADAR_JOB_ID=name, HADAR_CHECKPOINT_DIR=os.path.join(self.tmp, name + "-ckpt"),
                       HADAR_PROGRESS_FILE=os.path.join(self.tmp, f"{name}-progress-{r}.json"), HADAR_EXIT_WAIT="5")
            if pace:
                env["HADAR_STEPS_PER_SEC"] = pace
            procs.append(self.start(launcher + [script, str(steps), str(grace)], env, f"{name}{r}"))
        return procs

    def progress(self, name: str, r: int) -> dict:
        return read_progress(os.path.join(self.tmp, f"{name}-progress-{r}.json")) or {}

    def test_done_ends_the_process_with_0(self) -> None:
        for launcher, name in (([], "plain"), (LAUNCHER, "launched")):
            with self.subTest(name):
                procs = self.start_unit(launcher, 30, 10, name)
                for p in procs:
                    self.assertEqual(p.wait(timeout=120), 0, p.stderr())
                    self.assertIn("DONE", p.stdout())
                self.assertEqual(self.progress(name, 0)["state"], "done")

    def test_stopped_ends_the_process_with_its_code(self) -> None:
        for launcher, name in (([], "plain"), (LAUNCHER, "launched")):
            with self.subTest(name):
                procs = self.start_unit(launcher, 100000, 10, name, pace="50")
                self.wait_for("the unit trains", lambda: self.progress(name, 1).get("steps_done", 0) >= 10, procs=procs)
                for p in procs:
                    p.signal(signal.SIGTERM)
                for p in procs:
                    self.assertEqual(p.wait(timeout=60), 0, p.stderr())
                self.assertEqual(self.progress(name, 0)["state"], "stopped")
        # Rank 1 stopped alone: rank 0, never asked to stop, exits 1.
        procs = self.start_unit([], 100000, 1, "alone", pace="50")
        self.wait_for("the unit trains", lambda: self.progress("alone", 0).get("steps_done", 0) >= 10, procs=procs)
        procs[1].signal(signal.SIGTERM)
        self.assertEqual(procs[1].wait(timeout=60), 0, procs[1].stderr())
        self.assertEqual(procs[0].wait(timeout=60), 1, procs[0].stderr())
        self.assertEqual(self.progress("alone", 0)["state"], "failed")
