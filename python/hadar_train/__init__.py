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
reads, and merges a HadarE copy's model with its job's other copies."""

from .checkpoint import CheckpointError
from .env import Env, EnvError
from .membership import MergeError
from .progress import CONTRACT_VERSION, Progress
from .run import Run, Stopped, init

__all__ = ["init", "Run", "Stopped", "Env", "EnvError", "CheckpointError", "MergeError", "Progress", "CONTRACT_VERSION"]
__version__ = "0.2.0"
