"""Start a module as ``python -m`` would, once a gate opens.

``python -m tests.gate READY GO MODULE [ARGS...]`` imports torch,
scikit-learn, hadar_train and MODULE's package (which under load takes tens
of seconds, and more for one process than another), creates READY, waits
until GO exists, then runs MODULE as ``__main__`` with ARGS. Tests that
start several processes which must meet (HadarE copies) open the gate once
every process is ready, so how long each took to import is not a race the
test can lose."""

from __future__ import annotations

import importlib
import os
import runpy
import sys
import time


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit("usage: python -m tests.gate READY GO MODULE [ARGS...]")
    ready, go, module, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    import torch  # noqa: F401  (the slow imports, before the gate)
    import sklearn.datasets  # noqa: F401

    import hadar_train  # noqa: F401

    if "." in module:
        # The package, not the module: runpy runs a module it finds
        # imported already with a warning that it may misbehave.
        importlib.import_module(module.rpartition(".")[0])
    with open(ready, "w"):
        pass
    deadline = time.monotonic() + float(os.environ.get("HADAR_TEST_GATE_TIMEOUT", "600"))
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit(f"tests.gate: {go} did not appear: the test never opened the gate")
        time.sleep(0.02)
    sys.argv = [module] + args
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
