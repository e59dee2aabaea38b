"""A HadarE copy: the same loop as one GPU's. hadar_train merges the
model with the job's other copies every round (HADAR_MERGE_DIR,
HADAR_MERGE_EVERY or HADAR_MERGE_INTERVAL), weighted by steps; the copy
draws its data by its own stream (its copy index) so copies see
different minibatches. ``--evaluate round.json`` scores a merged round."""

from __future__ import annotations

import json
import sys

import torch
from torch import nn

import hadar_train
from hadar_train import state
from hadar_train.examples import digits


def main() -> None:
    p = digits.arguments(__doc__)
    p.add_argument("--evaluate", metavar="MERGED_JSON", help="print the test loss and accuracy of a merged round's model, and exit")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    xtr, ytr, xte, yte = digits.load()
    model = digits.model(args.seed)
    if args.evaluate:
        with open(args.evaluate, "rb") as f:
            model.load_state_dict(state.decode_state(json.load(f)["state"]))
        test_loss, acc = digits.evaluate(model, xte, yte)
        print(f"test_loss={test_loss:.6f} test_accuracy={acc:.4f}")
        sys.exit(0)
    run = hadar_train.init(total_steps=args.steps, checkpoint_every=args.checkpoint_every,
                           checkpoint_dir=args.checkpoint_dir, stop_grace=args.stop_grace)
    model.to(run.device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    run.track(model=model, optimizer=opt)
    for step in run.steps():
        idx = digits.batch(len(ytr), args.batch, args.seed, run.copy_index, step)
        loss = nn.functional.cross_entropy(model(xtr[idx].to(run.device)), ytr[idx].to(run.device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.report(loss=loss.item())
    test_loss, acc = digits.evaluate(model.cpu(), xte, yte)
    print(f"final steps_done={run.step} local_steps={run.local_step} merges={run.merges} copy={run.copy_index} "
          f"test_loss={test_loss:.6f} test_accuracy={acc:.4f}", flush=True)
    run.close()


if __name__ == "__main__":
    main()
