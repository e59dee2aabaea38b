"""Elastic jobs: a fixed global batch at whatever width (``WORLD_SIZE``)
the unit runs at, so a job stopped with a checkpoint at one width and
resumed at another trains on the same samples, step for step::

    plan = run.batch_plan(global_batch=256, max_per_worker=64)
    for step in run.steps():
        opt.zero_grad()
        for i, idx in enumerate(plan.micro_indices(step, len(dataset), seed=1)):
            with plan.sync(model, i):                     # DDP: all-reduce on the last only
                loss = loss_fn(model(x[idx]), y[idx]) * plan.loss_scale(i)
                loss.backward()
        opt.step()

A step ``k`` is the global batch of positions ``k*G .. (k+1)*G - 1`` of
one stream of samples (each epoch a permutation of the dataset seeded by
``seed`` and the epoch); rank ``r`` of ``W`` takes positions ``r*G/W ..
(r+1)*G/W - 1`` of it, cut into ``accumulation`` micro-batches when
``G/W`` exceeds ``max_per_worker``. With a per-sample mean loss scaled by
``loss_scale(i)`` and DDP's average of the ranks' gradients, the step's
gradient is the mean over the same ``G`` samples at every width.

docs/pytorch.md, "Elastic jobs", says what carries across a resize."""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


class BatchPlanError(ValueError):
    """A global batch that cannot be split as asked; the message names the fix."""


def parse_widths(widths: Union[str, int, Iterable[int]]) -> List[int]:
    """The widths a job may run at, sorted: ``"2-8"`` (every width from 2
    to 8), ``"1,2,4"``, ``4``, or a list of integers."""
    if isinstance(widths, int):
        out = [widths]
    elif isinstance(widths, str):
        m = _RANGE.match(widths)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo > hi:
                raise BatchPlanError(f"widths {widths!r}: the range runs from {lo} down to {hi}; write it low-high, {hi}-{lo}")
            out = list(range(lo, hi + 1))
        else:
            try:
                out = [int(w) for w in widths.replace(" ", "").split(",") if w]
            except ValueError:
                raise BatchPlanError(f"widths {widths!r}: want a range like \"2-8\" or a list like \"1,2,4\"") from None
    else:
        out = [int(w) for w in widths]
    if not out or any(w < 1 for w in out):
        raise BatchPlanError(f"widths {widths!r}: want one or more widths >= 1")
    return sorted(set(out))


def _divisible_by_all(global_batch: int, widths: Sequence[int]) -> Tuple[List[int], int]:
    bad = [w for w in widths if global_batch % w]
    lcm = 1
    for w in widths:
        lcm = lcm * w // math.gcd(lcm, w)
    return bad, lcm


@dataclass(frozen=True)
class BatchPlan:
    """How one rank takes its part of a fixed global batch.

    ``per_worker`` samples per rank per step (``global_batch /
    world_size``), in ``accumulation`` micro-batches of at most
    ``micro_batch`` samples (``micro_sizes``: sizes differ by one at most,
    the larger first); ``loss_scale(i)`` (micro-batch ``i``'s share of the
    rank's samples, ``1 / accumulation`` when they are equal) is what its
    mean loss is multiplied by before ``backward()``. ``widths`` are the
    widths the global batch was checked against, ascending (empty: none
    were declared)."""

    global_batch: int
    world_size: int
    rank: int
    per_worker: int
    micro_batch: int
    accumulation: int
    widths: Tuple[int, ...] = ()
    _perm: Dict[Tuple[int, int, int], Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def micro_sizes(self) -> List[int]:
        """The micro-batches' sizes, in order."""
        q, r = divmod(self.per_worker, self.accumulation)
        return [q + 1 if i < r else q for i in range(self.accumulation)]

    def loss_scale(self, micro: int = 0) -> float:
        """What micro-batch ``micro``'s mean loss is multiplied by before
        ``backward()``: its share of this rank's samples, so the micro-
        batches' gradients add up to the gradient of the rank's mean loss."""
        return self.micro_sizes[micro] / self.per_worker

    def positions(self, step: int) -> range:
        """This rank's positions in the stream of samples at ``step``: a
        slice of the step's global batch, the same global batch at any
        width."""
        start = step * self.global_batch + self.rank * self.per_worker
        return range(start, start + self.per_worker)

    def micro_positions(self, step: int) -> List[range]:
        """``positions(step)`` cut into the ``accumulation`` micro-batches."""
        out, start = [], self.positions(step).start
        for size in self.micro_sizes:
            out.append(range(start, start + size))
            start += size
        return out

    def _order(self, epoch: int, n: int, seed: int, shuffle: bool) -> Any:
        import torch

        if not shuffle:
            return None
        key = (epoch, n, seed)
        perm = self._perm.get(key)
        if perm is None:
            self._perm.clear()  # one epoch's permutation is kept
            g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            perm = torch.randperm(n, generator=g)
            self._perm[key] = perm
        return perm

    def _indices(self, pos: range, n: int, seed: int, shuffle: bool) -> Any:
        import torch

        if n < 1:
            raise BatchPlanError(f"dataset of {n} samples: want at least one")
        out = torch.empty(len(pos), dtype=torch.int64)
        i = 0
        p = pos.start
        while p < pos.stop:
            epoch, off = divmod(p, n)
            take = min(pos.stop - p, n - off)
            perm = self._order(epoch, n, seed, shuffle)
            out[i:i + take] = perm[off:off + take] if perm is not None else torch.arange(off, off + take)
            i += take
            p += take
        return out

    def indices(self, step: int, n: int, seed: int = 0, shuffle: bool = True) -> Any:
        """The dataset indices (an int64 tensor) of this rank's samples at
        ``step``, from a dataset of ``n``: each epoch is a permutation of
        ``range(n)`` drawn from ``seed`` and the epoch (``shuffle=False``:
        in order); the global batch of a step may span two epochs."""
        return self._indices(self.positions(step), n, seed, shuffle)

    def micro_indices(self, step: int, n: int, seed: int = 0, shuffle: bool = True) -> List[Any]:
        """``indices(step, ...)`` cut into the ``accumulation`` micro-batches."""
        return [self._indices(r, n, seed, shuffle) for r in self.micro_positions(step)]

    def sync(self, model: Any, micro: int) -> Any:
        """A context for micro-batch ``micro``'s forward and backward: DDP's
        ``no_sync()`` on all but the last (gradients are all-reduced once
        per step), nothing otherwise."""
        if micro < self.accumulation - 1 and hasattr(model, "no_sync"):
            return model.no_sync()
        return contextlib.nullcontext()


def batch_plan(global_batch: int, world_size: int = 1, rank: int = 0, max_per_worker: Optional[int] = None,
               widths: Optional[Union[str, int, Iterable[int]]] = None) -> BatchPlan:
    """Split ``global_batch`` samples per step among ``world_size`` ranks:
    ``global_batch / world_size`` each, in the fewest micro-batches of at
    most ``max_per_worker`` (gradient accumulation; sizes differ by one at
    most). ``widths`` (the
    widths the job may run at, as ``parse_widths`` reads them) checks that
    the global batch divides among every one of them, not only this one.
    It reads no environment (``Run.batch_plan`` takes ``world_size``,
    ``rank`` and, when not given, the widths from ``HADAR_WIDTHS``)."""
    if not isinstance(global_batch, int) or global_batch < 1:
        raise BatchPlanError(f"global batch {global_batch!r}: want an integer >= 1")
    if world_size < 1 or not 0 <= rank < world_size:
        raise BatchPlanError(f"rank {rank} of world size {world_size}: want 0 <= rank < world size >= 1")
    if max_per_worker is not None and max_per_worker < 1:
        raise BatchPlanError(f"max_per_worker {max_per_worker!r}: want an integer >= 1, or None for no cap")
    ws: List[int] = []
    if widths is not None:
        ws = parse_widths(widths)
        bad, lcm = _divisible_by_all(global_batch, ws)
        if bad:
            raise BatchPlanError(f"global batch {global_batch} does not divide among {', '.join(map(str, bad))} workers, widths the job may "
                                 f"run at ({widths!r}): make the global batch a multiple of {lcm} (the widths' least common multiple), "
                                 f"e.g. {_next_multiple(global_batch, lcm)}, or declare only widths that divide {global_batch}")
        if world_size not in ws:
            raise BatchPlanError(f"WORLD_SIZE={world_size} is not among the widths the job declared ({widths!r})")
    if global_batch % world_size:
        divisors = [w for w in range(1, min(global_batch, 64) + 1) if global_batch % w == 0]
        raise BatchPlanError(f"global batch {global_batch} does not divide among WORLD_SIZE={world_size} workers: make it a multiple of "
                             f"{world_size} (e.g. {_next_multiple(global_batch, world_size)}), or run at a width that divides it "
                             f"({', '.join(map(str, divisors))})")
    per = global_batch // world_size
    acc = 1 if max_per_worker is None else -(-per // max_per_worker)
    return BatchPlan(global_batch=global_batch, world_size=world_size, rank=rank, per_worker=per, micro_batch=-(-per // acc), accumulation=acc,
                     widths=tuple(ws))


def _next_multiple(n: int, m: int) -> int:
    return -(-n // m) * m


# Random states across a resize.


def rng_for_rank(states: Optional[Sequence[Any]], rank: int, world_size: int) -> Tuple[Optional[Any], Optional[int]]:
    """Which of a checkpoint's per-rank random states rank ``rank`` of a
    unit of ``world_size`` restores: ``(state, None)`` to restore a state,
    ``(None, seed)`` to seed its generators afresh instead, ``(None, None)``
    for neither.

    At the width that wrote it every rank gets its own state back (the
    run continues digit for digit). At another width a rank that existed
    (``rank < len(states)``) keeps its stream; a new rank seeds its
    generators from the checkpoint's states and its rank (a stream of its
    own, the same on every resume from this checkpoint)."""
    if not states:
        return None, None
    if rank < len(states) and states[rank] is not None:
        return states[rank], None
    h = hashlib.sha256(f"hadar_train/rank/{rank}/{world_size}".encode())
    for s in states:
        h.update(_digest(s).encode())
    return None, int.from_bytes(h.digest()[:8], "little") & ((1 << 63) - 1)


def _digest(s: Any) -> str:
    """A stable digest of a random state as a checkpoint holds it."""
    h = hashlib.sha256()
    if s is None:
        return "none"
    t = s.get("torch") if isinstance(s, dict) else None
    if t is not None and hasattr(t, "numpy"):
        h.update(t.numpy().tobytes())
    py = s.get("python") if isinstance(s, dict) else None
    if py is not None:
        h.update(repr(py).encode())
    return h.hexdigest()
