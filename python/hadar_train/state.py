"""A model's state in the contract's merge files: named tensors (a
state_dict), each ``{"dtype", "shape", "data"}`` with its elements
row-major as little-endian bytes in base64. The merge rule and the sizing
of a round are the contract's (contract/tensor.go, contract/merge.go);
this is their Python side, held to the same fixtures."""

from __future__ import annotations

import base64
import math
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

# dtype names of the contract and torch's.
_DTYPES: Dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}
FLOATS = ("float64", "float32", "float16", "bfloat16")

#: A tensor has at most this many elements (contract.MaxTensorElements).
MAX_TENSOR_ELEMENTS = 1 << 31

Tensor = Dict[str, Any]
State = Dict[str, Tensor]


class StateError(ValueError):
    """A state that is not the contract's, or does not fit the model."""


def encode_tensor(t: torch.Tensor) -> Tensor:
    """A tensor in the contract's form."""
    name = _NAMES.get(t.dtype)
    if name is None:
        raise StateError(f"dtype {t.dtype}: the contract has {', '.join(_DTYPES)}")
    c = t.detach().to("cpu").contiguous()
    if name == "bfloat16":
        raw = c.view(torch.int16).numpy().tobytes()  # numpy has no bfloat16
    else:
        raw = c.numpy().tobytes()
    if sys.byteorder != "little":
        raise StateError("big-endian hosts are not supported: the contract's tensors are little-endian")
    return {"dtype": name, "shape": list(c.shape), "data": base64.b64encode(raw).decode("ascii")}


def decode_tensor(obj: Mapping[str, Any]) -> torch.Tensor:
    """A tensor from the contract's form, checked as contract.Tensor.Validate
    checks it."""
    try:
        name, shape, data = obj["dtype"], obj["shape"], obj["data"]
    except (KeyError, TypeError):
        raise StateError(f"tensor {obj!r:.80}: want an object with dtype, shape and data") from None
    dtype = _DTYPES.get(name)
    if dtype is None:
        raise StateError(f"dtype {name!r}: want one of {', '.join(_DTYPES)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise StateError(f"shape {shape!r}: want a list of dimensions >= 0")
    n = 1
    for d in shape:
        n *= d
    if n > MAX_TENSOR_ELEMENTS:
        raise StateError(f"shape {shape}: more than {MAX_TENSOR_ELEMENTS} elements")
    raw = base64.b64decode(data, validate=True)
    size = torch.tensor([], dtype=dtype).element_size()
    if len(raw) != n * size:
        raise StateError(f"data: {len(raw)} bytes, want {n * size} ({n} {name} elements of shape {shape})")
    if n == 0:
        return torch.zeros(shape, dtype=dtype)
    if dtype == torch.bfloat16:
        t = torch.frombuffer(bytearray(raw), dtype=torch.int16).view(torch.bfloat16)
    else:
        t = torch.frombuffer(bytearray(raw), dtype=dtype)
    t = t.reshape(shape).clone()
    if name in FLOATS and not bool(torch.isfinite(t).all()):
        raise StateError(f"tensor of dtype {name}: want finite values")
    return t


def encode_state(sd: Mapping[str, torch.Tensor]) -> State:
    """A state_dict in the contract's form (tensors only)."""
    out: State = {}
    for k, v in sd.items():
        if not isinstance(v, torch.Tensor):
            raise StateError(f"state_dict entry {k!r} is a {type(v).__name__}, not a tensor: the merge files hold tensors only")
        out[k] = encode_tensor(v)
    return out


def decode_state(obj: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    """A state_dict from the contract's form."""
    if not isinstance(obj, Mapping) or not obj:
        raise StateError("state: want an object of tensors by name, at least one")
    out = {}
    for k in sorted(obj):
        try:
            out[k] = decode_tensor(obj[k])
        except StateError as e:
            raise StateError(f"tensor {k!r}: {e}") from None
    return out


def same_layout(want: Mapping[str, torch.Tensor], got: Mapping[str, torch.Tensor]) -> Optional[str]:
    """Why ``got`` cannot merge with ``want`` (None if it can): the same
    names, shapes, and kinds (floating or not; floating types may differ)."""
    if len(want) != len(got):
        return f"{len(got)} tensors, want {len(want)} ({sorted(want)})"
    for k in sorted(want):
        if k not in got:
            return f"tensor {k!r} is missing"
        a, b = want[k], got[k]
        if list(a.shape) != list(b.shape):
            return f"tensor {k!r}: shape {list(b.shape)}, want {list(a.shape)}"
        af, bf = a.dtype.is_floating_point, b.dtype.is_floating_point
        if af != bf or (not af and a.dtype != b.dtype):
            return f"tensor {k!r}: dtype {_NAMES.get(b.dtype)}, want {_NAMES.get(a.dtype)}"
    return None


def _widest(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    if a == b:
        return a
    if torch.float64 in (a, b):
        return torch.float64
    return torch.float32


def merge_states(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> Dict[str, torch.Tensor]:
    """The contract's merge: floating tensors averaged weighted by
    ``weights`` (steps), in float64 in the order given, written in the
    widest floating type among them; other tensors from the heaviest state
    (the first of equal weights); all weights 0 average equally."""
    if not states or len(states) != len(weights):
        raise StateError(f"merge: {len(states)} states, {len(weights)} weights; want one weight per state, at least one")
    for i, w in enumerate(weights):
        if not (w >= 0) or math.isinf(w):
            raise StateError(f"merge: weight {i} is {w}; want a finite value >= 0 (steps done)")
        why = same_layout(states[0], states[i])
        if why:
            raise StateError(f"merge: state {i}: {why}")
    total = float(sum(weights))
    heaviest = max(range(len(weights)), key=lambda i: (weights[i], -i))
    out: Dict[str, torch.Tensor] = {}
    for name in sorted(states[0]):
        first = states[0][name]
        if not first.dtype.is_floating_point:
            out[name] = states[heaviest][name].detach().to("cpu").clone()
            continue
        dtype = first.dtype
        acc = torch.zeros(first.shape, dtype=torch.float64)
        for i, s in enumerate(states):
            dtype = _widest(dtype, s[name].dtype)
            f = weights[i] / total if total > 0 else 1.0 / len(states)
            if f == 0:
                continue
            # A product then a sum, as the Go side computes it.
            acc += s[name].detach().to("cpu", torch.float64) * f
        out[name] = acc.to(dtype)
    return out


def next_targets(remaining: int, cands: Sequence[Tuple[int, int]], fallback: int) -> List[Dict[str, int]]:
    """contract.NextTargets: the next round's members and steps from
    candidates ``(copy, merge_every)`` in copy order."""
    if remaining <= 0 or not cands:
        return []
    est = [float(e if e > 0 else max(fallback, 1)) for _, e in cands]
    if sum(int(e) for e in est) <= remaining:
        return [{"copy": c, "steps": e} for c, e in cands]
    total = sum(est)
    shares, rem = [], []
    for e in est:
        exact = float(remaining) * e / total
        shares.append(math.floor(exact))
        rem.append(exact - shares[-1])
    given = sum(shares)
    while given < remaining:
        best = 0
        for i in range(len(rem)):
            if rem[i] > rem[best]:
                best = i
        shares[best] += 1
        rem[best] = -1.0
        given += 1
    return [{"copy": c, "steps": s} for (c, _), s in zip(cands, shares) if s > 0]
