"""The examples' data and model: scikit-learn's digits (1,797 8x8
images, 10 classes), a fixed 1,500/297 train/test split, and an MLP
64-64-10 with tanh, the shape of hadar-trainer's ``mlp`` so the two can
merge with each other."""

from __future__ import annotations

import argparse
from typing import Tuple

import torch
from torch import nn

TRAIN = 1500


def load() -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train and test features (scaled to [0, 1]) and labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    return x[:TRAIN], y[:TRAIN], x[TRAIN:], y[TRAIN:]


def model(seed: int, hidden: int = 64) -> nn.Module:
    """The MLP, initialised from ``seed`` (every copy and rank alike)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.Tanh(), nn.Linear(hidden, 10))


def batch(n: int, size: int, seed: int, stream: int, step: int) -> torch.Tensor:
    """The indices of one step's minibatch: a function of the seed, the
    stream (a rank, or a HadarE copy) and the step alone, so a resumed run
    draws exactly what an uninterrupted one would."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + stream * 7_919 + step)
    return torch.randint(n, (size,), generator=g)


@torch.no_grad()
def evaluate(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Tuple[float, float]:
    """Mean cross-entropy and accuracy."""
    m.eval()
    out = m(x)
    loss = nn.functional.cross_entropy(out, y).item()
    acc = (out.argmax(1) == y).float().mean().item()
    m.train()
    return loss, acc


def arguments(description: str) -> argparse.ArgumentParser:
    """The flags every example takes."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=2000, help="steps when HADAR_TOTAL_STEPS is unset")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 keeps runs bit-for-bit repeatable)")
    p.add_argument("--log-every", type=int, default=0, help="print 'step N loss L' every N steps (0: never)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between periodic checkpoints (0: on stop and at the end)")
    p.add_argument("--checkpoint-dir", default=None, help="checkpoints outside hadar (hadar sets HADAR_CHECKPOINT_DIR)")
    p.add_argument("--stop-grace", type=float, default=10.0, help="seconds a rank whose unit stopped waits for its own stop signal")
    return p

