"""DistributedDataParallel, one process per GPU: each rank draws its own
minibatch (its rank is its data stream), DDP averages the gradients."""

from __future__ import annotations

import hashlib

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hadar_train
from hadar_train.examples import digits


def main() -> None:
    args = digits.arguments(__doc__).parse_args()
    torch.set_num_threads(args.threads)
    run = hadar_train.init(total_steps=args.steps, checkpoint_every=args.checkpoint_every,
                           checkpoint_dir=args.checkpoint_dir, stop_grace=args.stop_grace)
    xtr, ytr, xte, yte = digits.load()
    model = digits.model(args.seed).to(run.device)
    if run.distributed:
        model = DDP(model, device_ids=[run.device.index] if run.device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    run.track(model=model, optimizer=opt)
    for step in run.steps():
        idx = digits.batch(len(ytr), args.batch, args.seed, run.rank, step)
        loss = nn.functional.cross_entropy(model(xtr[idx].to(run.device)), ytr[idx].to(run.device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.report(loss=loss.item())
        if args.log_every and (step + 1) % args.log_every == 0:
            print(f"step {step + 1} loss {loss.item()!r}", flush=True)
    inner = model.module if run.distributed else model
    digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in inner.parameters())).hexdigest()[:16]
    test_loss, acc = digits.evaluate(inner.cpu(), xte, yte)
    print(f"final steps_done={run.step} rank={run.rank} world_size={run.world_size} params={digest} "
          f"test_loss={test_loss:.6f} test_accuracy={acc:.4f}", flush=True)
    run.close()


if __name__ == "__main__":
    main()
