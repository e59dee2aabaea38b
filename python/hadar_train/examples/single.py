"""One GPU: a plain training loop plus hadar_train's few calls."""

from __future__ import annotations

import torch
from torch import nn

import hadar_train
from hadar_train.examples import digits


def main() -> None:
    args = digits.arguments(__doc__).parse_args()
    torch.set_num_threads(args.threads)
    run = hadar_train.init(total_steps=args.steps, checkpoint_every=args.checkpoint_every,
                           checkpoint_dir=args.checkpoint_dir, stop_grace=args.stop_grace)
    xtr, ytr, xte, yte = digits.load()
    model = digits.model(args.seed).to(run.device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=max(1, run.total_steps // 2), gamma=0.5)
    run.track(model=model, optimizer=opt, scheduler=sched)
    for step in run.steps():
        idx = digits.batch(len(ytr), args.batch, args.seed, 0, step)
        loss = nn.functional.cross_entropy(model(xtr[idx].to(run.device)), ytr[idx].to(run.device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        run.report(loss=loss.item())
        if args.log_every and (step + 1) % args.log_every == 0:
            print(f"step {step + 1} loss {loss.item()!r}", flush=True)
    test_loss, acc = digits.evaluate(model.cpu(), xte, yte)
    print(f"final steps_done={run.step} local_steps={run.local_step} test_loss={test_loss:.6f} test_accuracy={acc:.4f}", flush=True)
    run.close()


if __name__ == "__main__":
    main()
