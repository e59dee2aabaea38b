"""The launcher, ``python -m hadar_train.run SCRIPT``: a stop that comes
before ``init()`` (while the script still imports torch) ends the process
with exit 0 at once."""

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
        p = self.start(args + [script], {"STARTED": started, "HADAR_PROGRESS_FILE": progress, "HADAR_JOB_ID": "early"}, name)
        self.wait_for("the script starts", lambda: os.path.exists(started), procs=[p])
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

