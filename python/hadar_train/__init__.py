"""hadar_train: make a PyTorch training script follow hadar's training
contract (docs/training-contract.md) in a few lines::

    import hadar_train

    run = hadar_train.init(total_steps=5000)
    model = Net().to(run.device)
    if run.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.track(model=model, optimizer=opt)
    for step in run.steps():
        loss = train_one_step(step)
        run.report(loss=loss.item())

It reads hadar's environment (and does nothing harmful outside hadar),
initialises torch.distributed from it (env://), stops every rank of a
unit together on SIGTERM/SIGINT with a checkpoint written by rank 0,
resumes every rank from the newest checkpoint (model, optimizer,
scheduler, random states, step), writes the progress file the sidecar
reads, and merges a HadarE copy's model with its job's other copies.

An elastic job keeps a fixed global batch at any width with
``run.batch_plan(global_batch, max_per_worker=...)`` (``hadar_train.elastic``)
and resumes from its checkpoint at another ``WORLD_SIZE``.

Start the script with the launcher, ``python -m hadar_train.run
script.py [args]``: it owns SIGTERM and SIGINT from the process's first
instant (a stop while the script still imports torch exits 0) and ends
the process with the contract's status when the script is done."""

from typing import TYPE_CHECKING, Any

from .elastic import BatchPlan, BatchPlanError, batch_plan, parse_widths
from .env import Env, EnvError
from .launch import Stopped
from .progress import CONTRACT_VERSION, Progress

if TYPE_CHECKING:
    from .checkpoint import CheckpointError
    from .membership import MergeError
    from .run import Run, init

__all__ = ["init", "Run", "Stopped", "Env", "EnvError", "CheckpointError", "MergeError", "Progress", "CONTRACT_VERSION",
           "batch_plan", "BatchPlan", "BatchPlanError", "parse_widths"]
__version__ = "0.2.0"

# What imports torch is imported when first used: ``python -m
# hadar_train.run`` (the launcher) imports this package before it takes
# the stop signals, and must not wait for torch to do so.
_LAZY = {"init": "run", "Run": "run", "CheckpointError": "checkpoint", "MergeError": "membership"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
