"""Checkpoint files: ``ckpt-<step>.pt`` in ``HADAR_CHECKPOINT_DIR``
(docs/training-contract.md, "Checkpoints"), written atomically by rank 0.

A checkpoint is read back with ``torch.load(weights_only=True)``, which
never runs code from the file: a checkpoint directory on storage other
jobs can reach must not let them plant one. The file therefore holds only
what that loader takes: a JSON document (strings are safe) for everything
but tensors, and the tensors in a list the document refers to."""

from __future__ import annotations

import inspect
import io
import json
import os
import re
from typing import Any, Dict, List, Optional, Tuple

import torch

from .files import write_atomic

#: The layout of what this library writes in a checkpoint.
FORMAT = "hadar_train/1"
EXT = "pt"

_NAME = re.compile(r"^ckpt-([0-9]+)\.([a-z0-9]+)$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not belong to this run."""


def checkpoint_name(step: int, ext: str = EXT) -> str:
    """The contract's file name of the checkpoint after ``step``."""
    return f"ckpt-{step}.{ext}"


def parse_checkpoint_name(name: str) -> Optional[Tuple[int, str]]:
    """``(step, ext)`` of a checkpoint's name, None for any other name."""
    m = _NAME.match(name)
    return (int(m.group(1)), m.group(2)) if m else None


def checkpoints(names: List[str], ext: Optional[str] = EXT) -> List[str]:
    """The checkpoints among ``names`` of format ``ext`` (every format if
    None), newest (highest step) first; equal steps by name."""
    found = []
    for n in names:
        p = parse_checkpoint_name(n)
        if p and (ext is None or p[1] == ext):
            found.append((-p[0], n))
    return [n for _, n in sorted(found)]


def list_checkpoints(directory: Optional[str]) -> List[str]:
    """Paths of this library's checkpoints in ``directory``, newest first."""
    if not directory or not os.path.isdir(directory):
        return []
    names = [e.name for e in os.scandir(directory) if e.is_file(follow_symlinks=False)]
    return [os.path.join(directory, n) for n in checkpoints(names)]


def _encode(obj: Any, tensors: List[torch.Tensor], where: str) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach().to("cpu"))
        return {"__tensor__": len(tensors) - 1}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (tuple, torch.Size)):
        return {"__tuple__": [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, tensors, f"{where}.{k}") for k, v in obj.items()}
        return {"__items__": [[_encode(k, tensors, where), _encode(v, tensors, f"{where}[{k!r}]")] for k, v in obj.items()]}
    raise CheckpointError(
        f"{where}: a {type(obj).__name__} cannot be checkpointed: a checkpoint holds tensors, numbers, strings, "
        "lists, tuples and dicts; keep other state out of what you track, or save it with the on_save/on_load hooks"
    )


def _decode(obj: Any, tensors: List[torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if set(obj) == {"__tensor__"}:
            return tensors[obj["__tensor__"]]
        if set(obj) == {"__tuple__"}:
            return tuple(_decode(v, tensors) for v in obj["__tuple__"])
        if set(obj) == {"__items__"}:
            return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["__items__"]}
        return {k: _decode(v, tensors) for k, v in obj.items()}
    return obj


def save(path: str, payload: Dict[str, Any]) -> None:
    """Write ``payload`` (tensors, numbers, strings, lists, tuples, dicts)
    to ``path`` atomically."""
    tensors: List[torch.Tensor] = []
    doc = json.dumps(_encode(payload, tensors, "checkpoint"), allow_nan=True)
    write_atomic(path, lambda f: torch.save({"format": FORMAT, "document": doc, "tensors": tensors}, f))


_WEIGHTS_ONLY = "weights_only" in inspect.signature(torch.load).parameters


def load(path: str, map_location: Any = "cpu") -> Dict[str, Any]:
    """Read a checkpoint this library wrote, never running code from it."""
    with open(path, "rb") as f:
        raw = f.read()
    kwargs: Dict[str, Any] = {"map_location": map_location}
    if _WEIGHTS_ONLY:
        kwargs["weights_only"] = True
    else:  # pragma: no cover - torch older than 1.13
        raise CheckpointError(f"{path}: torch {torch.__version__} cannot load without unpickling code; hadar_train needs torch >= 1.13")
    try:
        outer = torch.load(io.BytesIO(raw), **kwargs)
    except Exception as e:  # torch raises UnpicklingError, RuntimeError, EOFError...
        raise CheckpointError(f"{path}: not a checkpoint hadar_train can read ({e.__class__.__name__}: {str(e)[:200]})") from None
    if not isinstance(outer, dict) or outer.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {outer.get('format') if isinstance(outer, dict) else type(outer).__name__!r}, want {FORMAT!r}")
    try:
        doc = json.loads(outer["document"])
        payload = _decode(doc, list(outer["tensors"]))
    except (KeyError, ValueError, IndexError, TypeError) as e:
        raise CheckpointError(f"{path}: damaged ({e})") from None
    if not isinstance(payload, dict):
        raise CheckpointError(f"{path}: damaged (the document is a {type(payload).__name__})")
    return payload
