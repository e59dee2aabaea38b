"""An elastic job: a fixed global batch at any width. Each step trains on
the same global batch of samples whether the unit has 1, 2 or 4 workers
(``run.batch_plan``: each rank its slice, in micro-batches of at most
``--max-per-worker`` with gradient accumulation), so a run stopped with a
checkpoint at one WORLD_SIZE and resumed at another follows the loss
curve of a run never resized. Prints the global batch's mean loss (the
same on every rank) from rank 0. The widths the job may run at, among
which the global batch must divide, are its ``hadar.workers``, which the
sidecar passes as ``HADAR_WIDTHS``; ``--widths`` overrides them."""

from __future__ import annotations

import hashlib

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hadar_train
from hadar_train.examples import digits


def main() -> None:
    p = digits.arguments(__doc__)
    p.add_argument("--global-batch", type=int, default=64, help="samples per step, split among the unit's workers")
    p.add_argument("--max-per-worker", type=int, default=None, help="most samples a worker puts through at once (more: gradient accumulation)")
    p.add_argument("--widths", default=None, help='the widths the job may run at ("1-4", "1,2,4"): the global batch must divide among each '
                   "(default: HADAR_WIDTHS, which the sidecar sets from the job's hadar.workers)")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout after the hidden layer (per-rank random streams: a resized run's losses are then close, not equal)")
    p.add_argument("--lr-decay-every", type=int, default=200, help="halve the learning rate every N steps")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    run = hadar_train.init(total_steps=args.steps, checkpoint_every=args.checkpoint_every,
                           checkpoint_dir=args.checkpoint_dir, stop_grace=args.stop_grace)
    plan = run.batch_plan(args.global_batch, max_per_worker=args.max_per_worker, widths=args.widths)
    xtr, ytr, xte, yte = digits.load()
    net = digits.model(args.seed)
    if args.dropout > 0:
        net = nn.Sequential(net[0], net[1], nn.Dropout(args.dropout), net[2])
    model = net.to(run.device)
    if run.distributed:
        model = DDP(model, device_ids=[run.device.index] if run.device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=args.lr_decay_every, gamma=0.5)
    run.track(model=model, optimizer=opt, scheduler=sched)
    if run.is_main:
        print(f"width {run.world_size}: global batch {plan.global_batch}, {plan.per_worker} per worker "
              f"in {plan.accumulation} micro-batch(es) of {plan.micro_sizes}, widths checked {','.join(map(str, plan.widths)) or 'none'}", flush=True)
    for step in run.steps():
        opt.zero_grad()
        mine = 0.0  # this rank's mean loss over its slice
        for i, idx in enumerate(plan.micro_indices(step, len(ytr), seed=args.seed)):
            with plan.sync(model, i):
                loss = nn.functional.cross_entropy(model(xtr[idx].to(run.device)), ytr[idx].to(run.device)) * plan.loss_scale(i)
                loss.backward()
            mine += loss.item()
        opt.step()
        sched.step()
        total = run.average(mine)  # the global batch's mean loss, at any width
        run.report(loss=total)
        if run.is_main and args.log_every and (step + 1) % args.log_every == 0:
            print(f"step {step + 1} loss {total!r}", flush=True)
    inner = model.module if run.distributed else model
    digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in inner.parameters())).hexdigest()[:16]
    test_loss, acc = digits.evaluate(inner.cpu(), xte, yte)
    print(f"final steps_done={run.step} rank={run.rank} world_size={run.world_size} resumed_world_size={run.resumed_world_size} "
          f"params={digest} test_loss={test_loss:.6f} test_accuracy={acc:.4f}", flush=True)
    run.close()


if __name__ == "__main__":
    main()
