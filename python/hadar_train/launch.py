"""The launcher: ``python -m hadar_train.run SCRIPT [ARGS...]`` (or
``python -m hadar_train.run -m MODULE [ARGS...]``) runs a training script
as ``python SCRIPT`` would, with two differences the contract needs:

- It takes SIGTERM and SIGINT from the process's first instant, before
  anything imports torch (seconds, half a minute on a loaded node). Under
  Nomad's exec driver the task is PID 1 of its own PID namespace, where
  the kernel drops a signal the process has no handler for: without the
  launcher a stop that arrives while the script still imports is lost
  and the task trains on until ``kill_timeout`` ends it with SIGKILL. A
  stop before ``hadar_train.init()`` ends the script at once with exit 0
  (no step ran: there is nothing to save), also when the code it
  interrupted turned the launcher's exit into another exception (torch's
  import makes it a ``RuntimeError``); one that the script swallows is
  handed to ``init()``, which then stops the run the same way.
- It ends the process itself once the script is done (``os._exit`` with
  the script's status, after its ``atexit`` handlers and threads, each
  waited for a bounded time): interpreter shutdown after a DDP run over
  gloo can hang in torch's destructors, holding the allocation and GPU.

Standard library only: this module must be importable before torch."""

from __future__ import annotations

import atexit
import logging
import os
import runpy
import signal
import sys
import threading
import time
from types import FrameType
from typing import List, Optional

#: How long the launcher waits for the script's threads and ``atexit``
#: handlers after it ended, in seconds (HADAR_EXIT_WAIT overrides it).
EXIT_WAIT = 30.0

USAGE = "usage: python -m hadar_train.run SCRIPT [ARGS...]\n       python -m hadar_train.run -m MODULE [ARGS...]"


class Stopped(SystemExit):
    """Raised out of ``Run.steps()`` when the run ends before its total:
    the process was asked to stop (SIGTERM or SIGINT, here or on another
    rank of the unit) and rank 0 wrote a checkpoint. Its ``code`` is the
    exit status the contract wants: 0 when this process was itself asked
    to stop, 1 when the unit broke under it (a peer stopped or was lost
    and no stop signal came here within the grace period), so the
    scheduler plans the job anew. Uncaught, it exits with that status.
    Under the launcher, a stop before ``init()`` raises it too (code 0)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code)
        self.reason = reason


_installed = False
_pending: Optional[int] = None


def installed() -> bool:
    """The launcher owns this process (its handler and its exit)."""
    return _installed


def take_pending() -> Optional[int]:
    """The stop signal that arrived before ``init()``, if any (for the Run,
    which takes the signals over)."""
    return _pending


def early_handler(signum: int, frame: Optional[FrameType]) -> None:
    """SIGTERM/SIGINT while no Run holds the signals: before ``init()``,
    or after ``close()``. The first ends the script (``Stopped(0)``, raised
    where it runs) and is remembered for ``init()``; a second has the
    default effect."""
    global _pending
    if _pending is not None:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _pending = signum
    name = signal.Signals(signum).name
    print(f"hadar_train.run: got {name} before the run started (or after it closed); exiting 0", file=sys.stderr, flush=True)
    raise Stopped(0, f"{name} before the run started")


def install() -> None:
    """Take SIGTERM and SIGINT (the launcher calls it first thing)."""
    global _installed
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, early_handler)
    _installed = True


def exit_status(code: object) -> int:
    """The process status ``SystemExit(code)`` means, as the interpreter
    computes it (a message is printed to stderr and means 1)."""
    if code is None:
        return 0
    if isinstance(code, bool):
        return int(code)
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def end_process(code: int, wait: Optional[float] = None) -> None:
    """End the process with ``code`` whatever torch's threads and
    destructors do: wait (bounded) for the non-daemon threads and the
    ``atexit`` handlers, as interpreter shutdown would, flush stdio and
    ``os._exit``. A backstop that needs no Python (faulthandler's
    watchdog, exit 1) covers a handler that hangs holding the GIL."""
    if wait is None:
        try:
            wait = float(os.environ.get("HADAR_EXIT_WAIT", EXIT_WAIT))
        except ValueError:
            wait = EXIT_WAIT
    deadline = time.monotonic() + max(wait, 0.0)
    if threading.current_thread() is threading.main_thread():
        # Ending already: a stop now changes nothing (and must not raise
        # out of here into the interpreter's own shutdown).
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
    try:
        import faulthandler

        faulthandler.dump_traceback_later(max(wait, 0.0) + 10.0, exit=True)
    except (ImportError, RuntimeError, ValueError):
        pass
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and not t.daemon and t.is_alive():
            t.join(max(0.0, deadline - time.monotonic()))
    done = threading.Event()

    def exitfuncs() -> None:
        try:
            atexit._run_exitfuncs()
        finally:
            done.set()

    threading.Thread(target=exitfuncs, name="hadar_train-atexit", daemon=True).start()
    if not done.wait(max(0.0, deadline - time.monotonic())):
        print(f"hadar_train: the script's threads or atexit handlers did not end within {wait:g}s; exiting {code}",
              file=sys.stderr, flush=True)
    logging.shutdown()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _run(argv: List[str]) -> int:
    """Run the script or module of ``argv`` as ``__main__``; its status."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    try:
        if argv[0] == "-m":
            if len(argv) < 2:
                print(USAGE, file=sys.stderr)
                return 2
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = argv[0]
            sys.argv = list(argv)
            # As ``python SCRIPT`` does: the script's directory first on
            # the path (``-m`` put the working directory there).
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        return exit_status(e.code)
    except BaseException as e:
        if _pending is not None:
            # The stop before init() was raised where the script was, and
            # the code there made it another exception: importing torch,
            # its C extension's initialisation turns it into
            # "RuntimeError: Stopped: 0". The script ended because of the
            # stop, before it ran a step: exit 0, as Stopped(0) would.
            name = signal.Signals(_pending).name
            print(f"hadar_train.run: the script ended with {type(e).__name__}: {e} after {name} came before the run "
                  "started; exiting 0", file=sys.stderr, flush=True)
            return 0
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def main(argv: Optional[List[str]] = None) -> None:
    """The launcher: take the signals, run the script, end the process
    with its status. Never returns."""
    try:
        install()
        code = _run(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:
        # A stop that came between the launcher's first line and the
        # script's (or while it handled the script's own exit).
        code = exit_status(e.code)
    end_process(code)
