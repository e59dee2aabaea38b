"""The environment hadar gives a training process (docs/training-contract.md,
"Environment"), read once into an ``Env``. Outside hadar every field has a
harmless default: one process, no progress file, no merging."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Mapping, Optional

# The contract's names (contract/contract.go declares them for Go).
PROGRESS_FILE = "HADAR_PROGRESS_FILE"
CHECKPOINT_DIR = "HADAR_CHECKPOINT_DIR"
TOTAL_STEPS = "HADAR_TOTAL_STEPS"
STEPS_PER_SEC = "HADAR_STEPS_PER_SEC"
SPREAD_STEPS_PER_SEC = "HADAR_SPREAD_STEPS_PER_SEC"
JOB_ID = "HADAR_JOB_ID"
COPY_INDEX = "HADAR_COPY_INDEX"
COPIES = "HADAR_COPIES"
MERGE_DIR = "HADAR_MERGE_DIR"
MERGE_EVERY = "HADAR_MERGE_EVERY"
MERGE_INTERVAL = "HADAR_MERGE_INTERVAL"
GPU_MODEL = "HADAR_GPU_MODEL"
GPU_TYPE = "HADAR_GPU_TYPE"
UNIT = "HADAR_UNIT"
TEMPLATE = "HADAR_TEMPLATE"
MANAGED_BY = "HADAR_MANAGED_BY"
WIDTHS = "HADAR_WIDTHS"

PROGRESS_FILE_NAME = "hadar-progress.json"

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class EnvError(ValueError):
    """A variable of the contract holds a value that cannot be used."""


def parse_duration(value: str) -> float:
    """Seconds in a Go duration ("2s", "1m30s", "500ms"), as hadar writes
    durations."""
    s = value.strip()
    if s == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(s):
        m = _DURATION.match(s, pos)
        if not m:
            raise EnvError(f"duration {value!r}: want a number with a unit, like 2s, 500ms or 1m30s")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos == 0:
        raise EnvError(f"duration {value!r}: empty")
    return total


@dataclass(frozen=True)
class Env:
    """What the contract's environment says, with defaults outside hadar."""

    # Where things are.
    progress_file: Optional[str] = None
    checkpoint_dir: Optional[str] = None
    # The job.
    job_id: str = ""
    total_steps: Optional[int] = None
    steps_per_sec: float = 0.0
    spread_steps_per_sec: float = 0.0
    gpu_model: str = ""
    gpu_type: str = ""
    # torchrun's, as the sidecar writes them: one process per GPU.
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    group_rank: int = 0
    group_world_size: int = 1
    node_rank: int = 0
    master_addr: str = ""
    master_port: int = 0
    run_id: str = ""
    # An elastic job's widths as the sidecar writes them ("1,2,4"), as
    # they are: Run.batch_plan reads them ("" when unset: a rigid job, or
    # outside hadar).
    widths: str = ""
    # HadarE.
    unit: int = -1
    copy_index: int = 0
    copies: int = 1
    merge_dir: Optional[str] = None
    merge_every: int = 100
    merge_interval: float = 0.0
    # True when any of hadar's or Nomad's variables is set.
    under_hadar: bool = False
    raw: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def distributed(self) -> bool:
        """Several workers train together (torch.distributed)."""
        return self.world_size > 1

    @property
    def merging(self) -> bool:
        """This process is a HadarE copy that merges with the job's others."""
        return self.merge_dir is not None

    @classmethod
    def from_environ(cls, environ: Optional[Mapping[str, str]] = None) -> "Env":
        """Read the contract's variables; a bad value raises ``EnvError``
        naming the variable and what it must be."""
        e = dict(os.environ if environ is None else environ)

        def get(name: str) -> str:
            return e.get(name, "").strip()

        def integer(name: str, default: int, least: int = 0) -> int:
            v = get(name)
            if v == "":
                return default
            try:
                n = int(v)
            except ValueError:
                raise EnvError(f"env {name}={v!r}: not an integer") from None
            if n < least:
                raise EnvError(f"env {name}={v!r}: want an integer >= {least}")
            return n

        def number(name: str) -> float:
            v = get(name)
            if v == "":
                return 0.0
            try:
                x = float(v)
            except ValueError:
                raise EnvError(f"env {name}={v!r}: not a number") from None
            if not x >= 0 or x == float("inf"):
                raise EnvError(f"env {name}={v!r}: want a finite number >= 0")
            return x

        def path(name: str, default_dir: str, *rest: str) -> Optional[str]:
            v = get(name)
            if "${" in v:
                # Nomad leaves an interpolation it cannot resolve as it is.
                raise EnvError(f"env {name}={v!r}: an interpolation Nomad did not resolve; set the node meta it names (docs/training-contract.md)")
            if v:
                return os.path.abspath(v)
            base = get(default_dir)
            return os.path.abspath(os.path.join(base, *rest)) if base else None

        under = any(k.startswith("HADAR_") or k == "NOMAD_ALLOC_ID" for k in e)
        world = integer("WORLD_SIZE", 1, least=1)
        rank = integer("RANK", 0)
        if rank >= world:
            raise EnvError(f"env RANK={rank}: want 0..{world - 1} for WORLD_SIZE={world}")
        if world > 1 and (not get("MASTER_ADDR") or integer("MASTER_PORT", 0) < 1):
            raise EnvError(f"env MASTER_ADDR/MASTER_PORT: a unit of WORLD_SIZE={world} needs rank 0's address and port")
        unit = integer(UNIT, -1, least=-1)
        merge_dir = path(MERGE_DIR, "")
        copy_index = integer(COPY_INDEX, unit if unit >= 0 and merge_dir else 0)
        copies = integer(COPIES, 1, least=1)
        if copies > 1 and copy_index >= copies:
            raise EnvError(f"env {COPY_INDEX}={copy_index}: want 0..{copies - 1} for {COPIES}={copies}")
        total = get(TOTAL_STEPS)
        interval = get(MERGE_INTERVAL)
        return cls(
            progress_file=path(PROGRESS_FILE, "NOMAD_TASK_DIR", PROGRESS_FILE_NAME),
            checkpoint_dir=path(CHECKPOINT_DIR, "NOMAD_ALLOC_DIR", "data", "checkpoints"),
            job_id=get(JOB_ID) or get("NOMAD_JOB_ID"),
            total_steps=integer(TOTAL_STEPS, 0, least=1) if total else None,
            steps_per_sec=number(STEPS_PER_SEC),
            spread_steps_per_sec=number(SPREAD_STEPS_PER_SEC),
            gpu_model=get(GPU_MODEL),
            gpu_type=get(GPU_TYPE),
            rank=rank,
            world_size=world,
            local_rank=integer("LOCAL_RANK", 0),
            local_world_size=integer("LOCAL_WORLD_SIZE", 1, least=1),
            group_rank=integer("GROUP_RANK", rank),
            group_world_size=integer("GROUP_WORLD_SIZE", world, least=1),
            node_rank=integer("NODE_RANK", integer("GROUP_RANK", 0)),
            master_addr=get("MASTER_ADDR"),
            master_port=integer("MASTER_PORT", 0),
            run_id=get("TORCHELASTIC_RUN_ID"),
            widths=get(WIDTHS),
            unit=unit,
            copy_index=copy_index,
            copies=copies,
            merge_dir=merge_dir,
            merge_every=integer(MERGE_EVERY, 100, least=1),
            merge_interval=parse_duration(interval) if interval else 0.0,
            under_hadar=under,
            raw=e,
        )
