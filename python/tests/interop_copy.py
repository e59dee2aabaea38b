"""A HadarE copy of a PyTorch model shaped like hadar-trainer's ``mlp``
(trainer/run/interop_test.go runs it beside a Go copy of the same job):
it trains on data of its own and merges with the Go copy through the
contract's merge directory."""

from __future__ import annotations

import argparse

import torch
from torch import nn

import hadar_train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--classes", type=int, default=4)
    args = p.parse_args()
    torch.set_num_threads(1)
    run = hadar_train.init(stop_grace=1)
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(args.dim, args.hidden), nn.Tanh(), nn.Linear(args.hidden, args.classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    centers = torch.randn(args.classes, args.dim, generator=torch.Generator().manual_seed(3)) * 2
    run.track(model=model, optimizer=opt)
    for step in run.steps():
        g = torch.Generator().manual_seed(1000 * run.copy_index + step)
        y = torch.randint(args.classes, (32,), generator=g)
        x = centers[y] + torch.randn(32, args.dim, generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.report(loss=loss.item())
    print(f"final steps_done={run.step} local_steps={run.local_step} merges={run.merges}", flush=True)
    run.close()


if __name__ == "__main__":
    main()
