"""The progress file (docs/training-contract.md, "Progress file"): JSON,
replaced atomically, at least every 5 s and at every checkpoint. The
sidecar reads it through Nomad's alloc filesystem at
``<task>/local/hadar-progress.json``; with the default
``HADAR_PROGRESS_FILE`` (``$NOMAD_TASK_DIR/hadar-progress.json``) that is
where it is, on every task driver."""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional

from .files import write_bytes_atomic

#: The contract version this library follows (contract.Version).
CONTRACT_VERSION = 2

# Progress states (contract/progress.go).
RENDEZVOUS = "rendezvous"
JOINING = "joining"
RUNNING = "running"
MERGING = "merging"
STOPPED = "stopped"
DONE = "done"
FAILED = "failed"

#: A progress file is at most this long; readers refuse longer ones.
MAX_PROGRESS_BYTES = 1 << 20


@dataclass
class Progress:
    """One progress report. The first six fields are required by readers;
    the rest say more about a distributed worker or a HadarE copy."""

    steps_done: int = 0
    total_steps: int = 0
    steps_per_sec: float = 0.0
    loss: float = 0.0
    checkpoint: str = ""
    updated: str = ""
    version: int = CONTRACT_VERSION
    state: str = RUNNING
    copy_index: int = 0
    copies: int = 1
    local_steps: int = 0
    merges: int = 0
    round: int = 0
    rank: int = 0
    world_size: int = 1
    unit: int = -1
    unit_steps_per_sec: float = 0.0
    nodes: int = 0

    def to_json(self) -> Dict[str, Any]:
        """The file's object, with the optional fields that are unset left
        out as the Go writer leaves them out."""
        d = asdict(self)
        for k in ("checkpoint", "state", "unit_steps_per_sec", "nodes", "version"):
            if not d[k]:
                del d[k]
        return d

    @classmethod
    def from_json(cls, data: bytes) -> "Progress":
        """Read a progress file's content; unknown fields are ignored, as
        the contract says."""
        if len(data) > MAX_PROGRESS_BYTES:
            raise ValueError(f"progress file: {len(data)} bytes, more than the {MAX_PROGRESS_BYTES} a progress file may have")
        obj = json.loads(data)
        known = {k: obj[k] for k in cls.__dataclass_fields__ if k in obj}
        p = cls(**known)
        if p.steps_done < 0 or p.total_steps < 0 or p.local_steps < 0 or p.steps_per_sec < 0:
            raise ValueError(f"progress file: negative counts in {obj}")
        return p


def now_rfc3339() -> str:
    """The current UTC time as the contract writes it (RFC 3339, ms)."""
    t = _dt.datetime.now(_dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def write_progress(path: Optional[str], p: Progress) -> None:
    """Replace the progress file atomically (nothing when ``path`` is None:
    outside hadar there is no one to read it)."""
    if not path:
        return
    p.updated = now_rfc3339()
    write_bytes_atomic(path, (json.dumps(p.to_json(), separators=(",", ":")) + "\n").encode())
