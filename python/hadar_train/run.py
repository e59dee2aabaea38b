"""``Run``: a PyTorch training loop under hadar's training contract.

::

    run = hadar_train.init(total_steps=5000)      # env, torch.distributed, signals
    model = DDP(Net().to(run.device)) if run.distributed else Net().to(run.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.track(model=model, optimizer=opt)         # what a checkpoint holds
    for step in run.steps():                      # resumes; stops, checkpoints, merges
        loss = train_one_step(step)
        run.report(loss=loss.item())

docs/training-contract.md is the contract this follows; docs/pytorch.md
shows it against a plain DDP script.

Run as a program, ``python -m hadar_train.run SCRIPT [ARGS...]`` (or ``-m
MODULE``), it is the launcher (``hadar_train.launch``): it takes SIGTERM
and SIGINT before anything imports torch and ends the process itself when
the script is done."""

from __future__ import annotations

if __name__ == "__main__":
    # The launcher, before this module's imports (torch): nothing here has
    # run but the standard library's start-up.
    from hadar_train.launch import main as _launch

    _launch()

# (The imports follow the launcher's branch on purpose: E402.)
import atexit
import datetime as _dt
import logging
import math
import os
import random
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional

import torch

from . import checkpoint as ck
from . import elastic
from . import launch
from .env import WIDTHS, Env
from .launch import Stopped
from .membership import LEAVING, Merged, MergeError, Membership
from .progress import (DONE, FAILED, JOINING, MERGING, RENDEZVOUS, RUNNING, STOPPED, Progress, write_progress)

log = logging.getLogger("hadar_train")


class _StopNow(Exception):
    """A stop signal arrived while a HadarE copy waited for the others."""


class _Pacer:
    """Holds the loop to an emulated pace (HADAR_STEPS_PER_SEC): step n of
    a window starts no earlier than n/rate seconds into it."""

    def __init__(self, rate: float) -> None:
        self.rate, self.n, self.start = rate, 0, 0.0

    def wait(self, tick: Callable[[], None]) -> None:
        if self.rate <= 0:
            return
        if self.n == 0:
            self.start = time.monotonic()
        due = self.start + self.n / self.rate
        self.n += 1
        while True:
            d = due - time.monotonic()
            if d <= 0:
                return
            time.sleep(min(d, 1.0))
            tick()

    def reset(self) -> None:
        self.n = 0


def _unwrap(model: Any) -> Any:
    """The module inside DistributedDataParallel (and DataParallel)."""
    return getattr(model, "module", model) if hasattr(model, "module") and isinstance(model, torch.nn.Module) else model


class Run:
    """One training process under the contract; make it with ``init``."""

    def __init__(self, env: Env, *, total_steps: Optional[int] = None, backend: Optional[str] = None,
                 checkpoint_dir: Optional[str] = None, checkpoint_every: int = 0, checkpoint_interval: float = 0.0,
                 keep_checkpoints: int = 2, progress_interval: float = 1.0, stop_grace: float = 10.0,
                 timeout: float = 600.0, merge_timeout: float = 120.0, member_ttl: float = 15.0,
                 install_signals: bool = True) -> None:
        total = env.total_steps if env.total_steps is not None else total_steps
        if total is None or total < 1:
            raise ValueError("total steps: HADAR_TOTAL_STEPS is unset and init(total_steps=...) was not given a number >= 1")
        if not 0 < progress_interval <= 5:
            raise ValueError(f"progress_interval {progress_interval}: the contract wants a progress report at least every 5 s")
        if keep_checkpoints < 1 or checkpoint_every < 0 or checkpoint_interval < 0 or stop_grace < 0:
            raise ValueError("keep_checkpoints >= 1, checkpoint_every, checkpoint_interval and stop_grace >= 0")
        self.env = env
        self.total_steps = int(total)
        self.rank, self.world_size = env.rank, env.world_size
        self.distributed = env.distributed
        self.checkpoint_dir = env.checkpoint_dir or checkpoint_dir
        self.checkpoint_every, self.checkpoint_interval = checkpoint_every, checkpoint_interval
        self.keep_checkpoints, self.progress_interval = keep_checkpoints, progress_interval
        self.stop_grace, self.timeout = stop_grace, timeout
        self.merge_timeout, self.member_ttl = merge_timeout, member_ttl

        #: The job's steps: done so far (a HadarE copy: the merged total as
        #: it last adopted it).
        self.step = 0
        #: Steps this process (its unit) took, restored ones included; what
        #: ``steps()`` yields, for seeding data order.
        self.local_step = 0
        self.loss = 0.0
        self.checkpoint: str = ""  # the newest checkpoint written or resumed
        self.resumed_from: str = ""
        #: The width of the unit that wrote the checkpoint resumed from (0:
        #: none resumed); differs from ``world_size`` after a resize.
        self.resumed_world_size = 0
        self._global_batch: Optional[int] = None
        self.state = RENDEZVOUS if self.distributed else RUNNING

        self._objects: Dict[str, Any] = {}
        self._save_hooks: List[Callable[[Dict[str, Any]], None]] = []
        self._load_hooks: List[Callable[[Dict[str, Any]], None]] = []
        self._signal: Optional[int] = None
        self._old_handlers: Dict[int, Any] = {}
        self._started = False
        self._closed = False
        self._exit_code = 0  # the contract's status once closed
        self._old_excepthook = sys.excepthook
        self._last_ckpt_time = time.monotonic()
        self._progress_at, self._progress_steps, self._rate = time.monotonic(), 0, 0.0

        # HadarE.
        self.merging = env.merging
        self.copy_index, self.copies = env.copy_index, env.copies
        self.merges, self.round, self.since_merge, self.round_target = 0, 0, 0, -1
        self._members: Optional[Membership] = None
        self._latest: Optional[Merged] = None
        self._ckpt_round: Optional[int] = None

        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        # A stop that reached the launcher before init() (and that the
        # script swallowed): the run stops before it starts.
        self._signal = launch.take_pending()
        self.nodes, self.unit_pace = 1, 0.0
        if self._signal is not None:
            self.state = STOPPED
            self._write_progress()
            log.info("hadar_train: %s came before init(); nothing ran, nothing to save", signal.Signals(self._signal).name)
            self.close()
            raise Stopped(0, "stopped before the run started")
        if self.distributed and not launch.installed():
            # Without the launcher: after close() or Stopped, the process
            # ends at exit with the contract's status before interpreter
            # shutdown, which can hang in the process group's destructors.
            _exit_guard.register()

        self.device = self._pick_device()
        self.nodes, self.unit_pace, pace = 1, env.steps_per_sec, env.steps_per_sec
        if self.distributed:
            sys.excepthook = self._excepthook
            self._init_distributed(backend)
            # The unit's shape: nodes it spans (NODE_RANK), and its pace,
            # the slowest worker's (emulation).
            nodes = self._reduce([env.node_rank], "max")[0] + 1
            self.nodes = int(nodes)
            if self.nodes > 1 and env.spread_steps_per_sec > 0:
                pace = env.spread_steps_per_sec
            slowest = -self._reduce([-pace if pace > 0 else -math.inf], "max")[0]
            self.unit_pace = 0.0 if math.isinf(slowest) else float(slowest)
            self.state = RUNNING
        self._pacer = _Pacer(pace)
        log.info("hadar_train: rank %d/%d (local rank %d, node %d of %d), device %s, job %r, %d steps%s%s",
                 self.rank, self.world_size, env.local_rank, env.node_rank, self.nodes, self.device, env.job_id, self.total_steps,
                 f", HadarE copy {self.copy_index} merging in {env.merge_dir}" if self.merging else "",
                 f", emulated pace {pace:g} steps/s" if pace > 0 else "")

    # Setting up.

    def _pick_device(self) -> torch.device:
        if not torch.cuda.is_available():
            return torch.device("cpu")
        n = torch.cuda.device_count()
        idx = self.env.local_rank
        if idx >= n:
            # An older sidecar numbered co-located workers 0, 1, ... while
            # each sees one GPU: the device is the one it sees.
            log.warning("hadar_train: LOCAL_RANK=%d but this process sees %d GPU(s) (CUDA_VISIBLE_DEVICES=%r); using device 0",
                        idx, n, os.environ.get("CUDA_VISIBLE_DEVICES"))
            idx = 0
        torch.cuda.set_device(idx)
        return torch.device("cuda", idx)

    def _init_distributed(self, backend: Optional[str]) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            return
        backend = backend or ("nccl" if self.device.type == "cuda" else "gloo")
        e = self.env
        log.info("hadar_train: joining the unit at %s:%d (backend %s)", e.master_addr, e.master_port, backend)
        # What torch's env:// does with hadar's variables (rank 0 hosts
        # the store at MASTER_ADDR:MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE
        # being False), with the wait for the unit's workers in Python: in
        # torch's C++ wait a stop signal could not be acted on.
        store = self._gather()
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size,
                                timeout=_dt.timedelta(seconds=self.timeout))

    def _gather(self) -> Any:
        """Wait until every worker of the unit reached rank 0's store; a
        stop signal meanwhile ends the process (exit 0: nothing ran, there
        is nothing to save)."""
        from torch.distributed import TCPStore

        e = self.env
        deadline = time.monotonic() + self.timeout
        timeout = _dt.timedelta(seconds=self.timeout)

        def check() -> None:
            if self._signal is not None:
                self.state = STOPPED
                self._write_progress()
                log.info("hadar_train: stopped while the unit gathered; nothing to save")
                raise Stopped(0, "stopped while the unit gathered")
            if time.monotonic() > deadline:
                raise RuntimeError(f"rendezvous: the unit's {self.world_size} workers did not all reach {e.master_addr}:{e.master_port} "
                                   f"(MASTER_ADDR:MASTER_PORT) within {self.timeout:g}s; check that they run and reach it")

        if self.is_main:
            store = TCPStore(e.master_addr, e.master_port, self.world_size, True, timeout, wait_for_workers=False)
        else:
            while True:
                check()
                try:
                    socket.create_connection((e.master_addr, e.master_port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.2)
            store = TCPStore(e.master_addr, e.master_port, self.world_size, False, timeout)
        key = "hadar_train/gathered"
        store.add(key, 1)
        while store.add(key, 0) < self.world_size:
            check()
            time.sleep(0.05)
        return store

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._signal is not None:
            # A second signal: the default action (a person pressing
            # Ctrl-C twice means it).
            old = self._old_handlers.get(signum, signal.SIG_DFL)
            signal.signal(signum, signal.SIG_DFL if old in (None, launch.early_handler) else old)
            os.kill(os.getpid(), signum)
            return
        self._signal = signum
        log.info("hadar_train: got %s; the unit stops after this step and rank 0 checkpoints", signal.Signals(signum).name)

    def _excepthook(self, exc_type: Any, exc: BaseException, tb: Any) -> None:
        """A collective in the user's own step (DDP's gradient all-reduce)
        failed because a peer is gone, and nothing caught it: the exception
        is outside ``steps()``, which cannot see it. Rank 0 saves what it
        holds (the state after the last whole step; the failed step never
        reached ``optimizer.step()``) and the progress file says failed,
        as when ``steps()`` itself sees the peer go."""
        self._old_excepthook(exc_type, exc, tb)
        if not (isinstance(exc, RuntimeError) and _peer_error(exc) and self._started and not self._closed):
            return
        try:
            self._broken(exc)
        except Stopped as s:
            if s.code == 0:
                # It was itself asked to stop: the contract's exit 0.
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)

    @property
    def is_main(self) -> bool:
        """Rank 0 of the unit: the one that writes checkpoints."""
        return self.rank == 0

    @property
    def signalled(self) -> bool:
        """This process got SIGTERM or SIGINT."""
        return self._signal is not None

    def track(self, **objects: Any) -> "Run":
        """Name what a checkpoint holds: anything with ``state_dict()`` and
        ``load_state_dict()`` (the model, optimizer, LR scheduler, a
        sampler, a GradScaler...). HadarE merges the one named ``model``."""
        for name, obj in objects.items():
            if obj is None:
                continue
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(f"track({name}=...): a {type(obj).__name__} has no state_dict/load_state_dict; use on_save/on_load for it")
            self._objects[name] = obj
        return self

    def on_save(self, hook: Callable[[Dict[str, Any]], None]) -> None:
        """``hook(extra)`` fills a dict of the user's own that goes into
        every checkpoint (tensors, numbers, strings, lists, dicts)."""
        self._save_hooks.append(hook)

    def on_load(self, hook: Callable[[Dict[str, Any]], None]) -> None:
        """``hook(extra)`` gets that dict back when the run resumes."""
        self._load_hooks.append(hook)

    def report(self, loss: Optional[float] = None) -> None:
        """Report the step's loss (a float, or a 0-dim tensor) for the
        progress file."""
        if loss is not None:
            self.loss = float(loss)

    def batch_plan(self, global_batch: int, max_per_worker: Optional[int] = None,
                   widths: Any = None) -> "elastic.BatchPlan":
        """This rank's part of a fixed global batch (an elastic job): see
        ``hadar_train.elastic``. ``global_batch / world_size`` samples per
        step, in micro-batches of at most ``max_per_worker``; ``widths``
        (``"2-8"``, ``[1, 2, 4]``) checks that the global batch divides
        among every width the job may run at, and that this run's
        ``world_size`` is one of them. Without ``widths`` they are
        ``HADAR_WIDTHS``, which the sidecar sets on an elastic job's
        workers from its ``hadar.workers`` ("1,2,3,4" for "1-4"); a
        ``widths`` given wins over it, and with neither nothing is
        checked. Checkpoints record the global batch; resuming with
        another one is logged as a warning."""
        if widths is None and self.env.widths:
            raw = self.env.widths
            try:
                elastic.parse_widths(raw)
            except elastic.BatchPlanError as e:
                raise elastic.BatchPlanError(f"env {WIDTHS}={raw!r}: {e} (the sidecar writes it from the job's hadar.workers; "
                                             f"pass batch_plan(widths=...) to declare them otherwise)") from None
            try:
                plan = elastic.batch_plan(global_batch, self.world_size, self.rank, max_per_worker, raw)
            except elastic.BatchPlanError as e:
                raise elastic.BatchPlanError(f"{e} (env {WIDTHS}: the job's hadar.workers, which the sidecar passes to its workers)") from None
        else:
            plan = elastic.batch_plan(global_batch, self.world_size, self.rank, max_per_worker, widths)
        self._global_batch = plan.global_batch
        return plan

    def average(self, value: Any) -> float:
        """The mean of ``value`` (a float, or a 0-dim tensor) over the
        unit's ranks: every rank calls it at the same point. A step's mean
        loss over the global batch is ``run.average(loss)`` of the ranks'
        per-sample means, whatever the width."""
        v = float(value)
        if not self.distributed:
            return v
        import torch.distributed as dist

        t = torch.tensor([v], dtype=torch.float64, device=self.device if self.device.type == "cuda" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return float(t.item()) / self.world_size

    # Collectives.

    def _reduce(self, values: List[float], op: str) -> List[float]:
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device if self.device.type == "cuda" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN)
        return [float(x) for x in t.tolist()]

    def _broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        import torch.distributed as dist

        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    # The loop.

    def steps(self) -> Iterator[int]:
        """Yield once per training step until the job's total is reached,
        yielding ``local_step`` (this unit's step count, restored ones
        included: seed the step's data with it). Before the first step it
        resumes every rank from the newest checkpoint (and a HadarE copy
        from the newest merged round); after each it reports progress,
        checkpoints when due, and merges when the round's steps are done.
        When the unit must stop it checkpoints and raises ``Stopped``."""
        if self._started:
            raise RuntimeError("steps() runs once per Run")
        self._started = True
        self._resume()
        if self.merging:
            self._join()
        self._write_progress()
        while True:
            if self.merging and self.round_target < 0:
                assert self._latest is not None
                if self._latest.done:
                    self.step = self._latest.steps_done
                    break
                self._guarded(self._next_round)
                continue
            if not self.merging and self.step >= self.total_steps:
                break
            stop, due = self._poll()
            if stop:
                self._stop("a stop signal")
            if due:
                self._guarded(self.save_checkpoint)
            self._pacer.wait(self._tick)
            yield self.local_step
            self.local_step += 1
            if self.merging:
                self.since_merge += 1
            else:
                self.step += 1
            if self.checkpoint_every and self.local_step % self.checkpoint_every == 0:
                self._guarded(self.save_checkpoint)
            self._tick()
            if self.merging and self.since_merge >= self.round_target:
                self._guarded(self._merge)
                self._pacer.reset()
        self._finish()

    def _guarded(self, f: Callable[[], None]) -> None:
        """Run a part of the loop that waits for others: a stop signal
        during a HadarE wait stops the run; a lost peer breaks the unit."""
        try:
            f()
        except _StopNow:
            self._stop("a stop signal")
        except RuntimeError as e:
            if self.distributed and _peer_error(e):
                self._broken(e)
            raise

    def _poll(self) -> List[bool]:
        """Whether to stop, and whether a timed checkpoint is due, agreed
        by every rank of the unit (one tiny all-reduce per step, so no rank
        is left waiting in a collective its peers will never join)."""
        stop = 1.0 if self._signal is not None else 0.0
        due = 0.0
        if self.checkpoint_interval and self.is_main and time.monotonic() - self._last_ckpt_time >= self.checkpoint_interval:
            due = 1.0
        if self.distributed:
            try:
                stop, due = self._reduce([stop, due], "max")
            except RuntimeError as e:
                self._broken(e)
        return [stop > 0, due > 0]

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._progress_at >= self.progress_interval:
            self._rate = (self.local_step - self._progress_steps) / (now - self._progress_at)
            self._progress_at, self._progress_steps = now, self.local_step
            self._write_progress()
        if self.merging and not self.distributed and self._signal is not None and self.state in (JOINING, MERGING):
            # (A copy of several workers stops after the wait: its other
            # ranks are in a broadcast until rank 0 is back.)
            raise _StopNow()

    def _write_progress(self) -> None:
        p = Progress(steps_done=min(self.step, self.total_steps), total_steps=self.total_steps, steps_per_sec=self._rate,
                     loss=self.loss if math.isfinite(self.loss) else 0.0, checkpoint=self.checkpoint, state=self.state,
                     copy_index=self.copy_index, copies=self.copies, local_steps=self.local_step, merges=self.merges,
                     round=self.round, rank=self.rank, world_size=self.world_size, unit=self.env.unit,
                     unit_steps_per_sec=self.unit_pace if self.distributed else 0.0, nodes=self.nodes if self.distributed else 0)
        try:
            write_progress(self.env.progress_file, p)
        except OSError as e:
            log.warning("hadar_train: progress file not written: %s", e)

    # Checkpoints.

    def _rng_state(self) -> Dict[str, Any]:
        s: Dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            s["cuda"] = torch.cuda.get_rng_state_all()
        np = sys.modules.get("numpy")
        if np is not None:
            kind, keys, pos, has_gauss, gauss = np.random.get_state()
            s["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, gauss]
        return s

    def _seed_rng(self, seed: int) -> None:
        """A rank new to the unit after a resize: a stream of its own."""
        torch.manual_seed(seed)  # every CUDA device too
        random.seed(seed)
        np = sys.modules.get("numpy")
        if np is not None:
            np.random.seed(seed % (1 << 32))

    def _set_rng_state(self, s: Mapping[str, Any]) -> None:
        torch.set_rng_state(s["torch"])
        py = s["python"]
        random.setstate((py[0], tuple(py[1]), py[2]))
        if "cuda" in s and torch.cuda.is_available() and len(s["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(s["cuda"])
        np = sys.modules.get("numpy")
        if np is not None and "numpy" in s:
            kind, keys, pos, has_gauss, gauss = s["numpy"]
            np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, gauss))

    def save_checkpoint(self, gather: bool = True) -> str:
        """Write a checkpoint now (rank 0 writes; in a unit every rank must
        call it, at the same step, as ``steps()`` does). Returns its path
        on rank 0, the empty string elsewhere or without a checkpoint
        directory."""
        rng: List[Any] = [self._rng_state()]
        if self.distributed and gather:
            import torch.distributed as dist

            rng = [None] * self.world_size
            dist.all_gather_object(rng, self._rng_state())
        self._last_ckpt_time = time.monotonic()
        path = self._write_checkpoint(rng) if self.is_main and self.checkpoint_dir else ""
        if self.distributed and gather:
            # Every rank's progress names the unit's checkpoint.
            path = self._broadcast(path)
        if path:
            self.checkpoint = path
        self._write_progress()  # the contract: progress at every checkpoint
        return path if self.is_main else ""

    def _write_checkpoint(self, rng: List[Any]) -> str:
        extra: Dict[str, Any] = {}
        for hook in self._save_hooks:
            hook(extra)
        payload = {
            "job_id": self.env.job_id, "total_steps": self.total_steps, "step": self.step, "local_step": self.local_step,
            "world_size": self.world_size, "copy_index": self.copy_index, "copies": self.copies, "loss": self.loss,
            "hadare": {"round": self.round, "since_merge": self.since_merge, "round_target": self.round_target, "merges": self.merges},
            "objects": {name: (_unwrap(obj) if name == "model" else obj).state_dict() for name, obj in self._objects.items()},
            "rng": rng if len(rng) == self.world_size else None, "extra": extra,
            "elastic": {"global_batch": self._global_batch},
        }
        assert self.checkpoint_dir is not None
        path = os.path.join(self.checkpoint_dir, ck.checkpoint_name(self.local_step))
        ck.save(path, payload)
        for old in ck.list_checkpoints(self.checkpoint_dir)[self.keep_checkpoints:]:
            if old != path:
                try:
                    os.remove(old)
                except OSError as e:
                    log.warning("hadar_train: old checkpoint %s not removed: %s", old, e)
        return path

    def _find_checkpoint(self) -> Optional[Dict[str, Any]]:
        """Rank 0: the newest checkpoint it can read, checked against this run."""
        for path in ck.list_checkpoints(self.checkpoint_dir):
            try:
                payload = ck.load(path)
            except (ck.CheckpointError, OSError) as e:
                log.warning("hadar_train: skipping unreadable checkpoint: %s", e)
                continue
            job = payload.get("job_id", "")
            if job and self.env.job_id and job != self.env.job_id:
                raise ck.CheckpointError(f"{path}: field job_id {job!r}, this process runs job {self.env.job_id!r}; "
                                         "give every job its own checkpoint directory, or remove this one to start over")
            if payload.get("copy_index", 0) != self.copy_index and self.merging:
                raise ck.CheckpointError(f"{path}: field copy_index {payload.get('copy_index')!r}, this process is copy {self.copy_index}; "
                                         "each HadarE copy needs its own checkpoint directory")
            payload["path"] = path
            return payload
        return None

    def _resume(self) -> None:
        """Every rank resumes from rank 0's newest checkpoint: it reads the
        file if it can reach it (shared storage), else rank 0 sends it."""
        payload = self._find_checkpoint() if self.is_main else None
        path = self._broadcast(payload["path"] if payload else "")
        if not path:
            return
        if self.distributed:
            if not self.is_main:
                try:
                    payload = ck.load(path)
                    payload["path"] = path
                except (ck.CheckpointError, OSError):
                    payload = None
            missing = self._reduce([0.0 if payload is not None else 1.0], "max")[0]
            if missing:
                sent = self._broadcast(payload if self.is_main else None)
                if payload is None:
                    payload = sent
        assert payload is not None
        for name, obj in self._objects.items():
            if name not in payload["objects"]:
                raise ck.CheckpointError(f"{path}: holds {sorted(payload['objects'])}, not {name!r}: track the same objects as the run that wrote it")
            (_unwrap(obj) if name == "model" else obj).load_state_dict(payload["objects"][name])
        for hook in self._load_hooks:
            hook(dict(payload.get("extra") or {}))
        wrote = int(payload.get("world_size") or 1)
        self.resumed_world_size = wrote
        if wrote != self.world_size:
            log.info("hadar_train: %s was written by a unit of %d, this one has %d: resuming resized", path, wrote, self.world_size)
        g = (payload.get("elastic") or {}).get("global_batch")
        if g and self._global_batch and g != self._global_batch:
            log.warning("hadar_train: %s was written with a global batch of %d, this run's is %d: the steps after it see other samples "
                        "than an unresized run's; keep the global batch across a resize", path, g, self._global_batch)
        state, seed = elastic.rng_for_rank(payload.get("rng"), self.rank, self.world_size)
        if state is not None:
            self._set_rng_state(state)
        elif seed is not None:
            self._seed_rng(seed)
            log.info("hadar_train: rank %d is new to the unit (the checkpoint has %d ranks' random states): seeded a stream of its own",
                     self.rank, wrote)
        self.step, self.local_step = int(payload["step"]), int(payload["local_step"])
        self.loss = float(payload.get("loss") or 0.0)
        h = payload.get("hadare") or {}
        self.round, self.since_merge = int(h.get("round", 0)), int(h.get("since_merge", 0))
        self.round_target, self.merges = int(h.get("round_target", -1)), int(h.get("merges", 0))
        self._ckpt_round = self.round
        if not self.merging and self.since_merge > 0:
            # Merging was switched off: the unmerged steps count as the job's.
            self.step += self.since_merge
            self.since_merge, self.round_target = 0, -1
        self.checkpoint = self.resumed_from = path
        self._progress_steps = self.local_step
        log.info("hadar_train: resumed from checkpoint %s at step %d (local step %d)", path, self.step, self.local_step)

    # HadarE.

    def _model_state(self) -> Dict[str, torch.Tensor]:
        model = self._objects.get("model")
        if model is None:
            raise ValueError("HadarE merges the model: name it with run.track(model=...) before steps()")
        return dict(_unwrap(model).state_dict())

    def _load_model_state(self, state: Mapping[str, torch.Tensor]) -> None:
        _unwrap(self._objects["model"]).load_state_dict(dict(state))

    def _pace(self) -> float:
        return self._pacer.rate if self._pacer.rate > 0 else self._rate

    def _merge_every(self) -> int:
        """This copy's steps per round: its pace times HADAR_MERGE_INTERVAL
        when both are known, so copies on fast and slow GPUs end a round
        together; else HADAR_MERGE_EVERY."""
        pace = self.unit_pace if self.distributed and self.unit_pace > 0 else self._pace()
        if self.env.merge_interval > 0 and pace > 0:
            return max(1, round(pace * self.env.merge_interval))
        return self.env.merge_every

    def _join(self) -> None:
        if self.is_main:
            assert self.env.merge_dir is not None
            self._members = Membership(self.env.merge_dir, self.env.job_id, self.copy_index, self.copies, self.total_steps,
                                       self._merge_every(), self._model_state(), self.merge_timeout, self.member_ttl)
            latest = self._members.join()
            try:
                self._adopt_start(latest)
            except BaseException:
                if self._members.hb is not None:
                    self._members.hb.stop(LEAVING)
                raise
        self._sync_hadare()

    def _sync_hadare(self) -> None:
        """Rank 0's HadarE state (and the model it adopted) on every rank."""
        if not self.distributed:
            return
        snap = self._broadcast({"step": self.step, "round": self.round, "since_merge": self.since_merge, "round_target": self.round_target,
                                "merges": self.merges, "copies": self.copies, "latest": self._latest,
                                "model": self._model_state() if self.is_main else None} if self.is_main else None)
        if not self.is_main:
            self.step, self.round, self.since_merge = snap["step"], snap["round"], snap["since_merge"]
            self.round_target, self.merges, self.copies, self._latest = snap["round_target"], snap["merges"], snap["copies"], snap["latest"]
            self._load_model_state(snap["model"])

    def _adopt_start(self, latest: Merged) -> None:
        if self.resumed_from and self._ckpt_round == latest.round:
            self._latest = latest
            self.copies = max(len(latest.members), self.env.copies)
            log.info("hadar_train: hadare: continuing round %d from the checkpoint (%d steps in)", self.round + 1, self.since_merge)
            return
        if self.resumed_from and self._ckpt_round is not None and self._ckpt_round > latest.round:
            raise MergeError(f"hadare: checkpoint {self.resumed_from} is at merge round {self._ckpt_round} but {self.env.merge_dir} has rounds "
                             f"up to {latest.round} only: it was replaced; restore it, or remove the checkpoint directory to start from it")
        log.info("hadar_train: hadare: starting from the newest merged round round=%d steps_done=%d members=%d",
                 latest.round, latest.steps_done, len(latest.members))
        self._adopt(latest, -1)

    def _adopt(self, mg: Merged, mine: int) -> None:
        self._load_model_state(mg.state)
        if mine >= 0:
            if mg.round == mine and any(c["copy"] == self.copy_index for c in mg.members):
                self.merges += 1
            else:
                log.warning("hadar_train: hadare: round %d closed without this copy's %d steps; they are not counted", mine, self.since_merge)
        self._latest, self.round, self.step = mg, mg.round, mg.steps_done
        self.since_merge, self.round_target = 0, -1
        self.copies = max(len(mg.targets), self.env.copies) if mg.round == 0 else len(mg.members)
        self.state = RUNNING

    def _next_round(self) -> None:
        if self.is_main:
            assert self._latest is not None and self._members is not None
            t = self._latest.target(self.copy_index)
            me = self._merge_every()
            self._members.merge_every = me
            if t is not None:
                if t == 0 or t > me:
                    t = me
                t = min(t, self.total_steps - self.step)
                if t > 0:
                    self.round_target = t
                    self._members.running(self.round + 1)
            if self.round_target < 0:
                self.state = JOINING
                self._write_progress()
                self._adopt(self._members.wait_join(self._latest, self._tick), -1)
        self._sync_hadare()

    def _merge(self) -> None:
        if self.is_main:
            assert self._latest is not None and self._members is not None
            r = self.round + 1
            self.state = MERGING
            self._write_progress()
            self._members.contribute(r, self.since_merge, self._model_state(), False)
            self._adopt(self._members.wait_round(r, self._latest, self._tick), r)
            self._write_progress()
        self._sync_hadare()

    # Ending.

    def _leave(self) -> None:
        """A stopped copy's goodbye to its job's others, with its last steps."""
        if not (self.merging and self.is_main and self._members is not None and self._latest is not None):
            return
        r = self.round + 1
        member = self._latest.target(self.copy_index) is not None and self.state != JOINING
        try:
            mg = self._members.leave(r, self._latest, self.since_merge, self._model_state(), member)
            if mg is not None:
                self._adopt(mg, r)
        except (OSError, ValueError) as e:
            log.warning("hadar_train: hadare: leaving: %s", e)

    def _stop(self, why: str) -> None:
        """The unit agreed to stop: leave (HadarE), checkpoint, report, exit."""
        self._leave()
        self.state = STOPPED
        try:
            self.save_checkpoint()
        except RuntimeError as e:
            if self.distributed and _peer_error(e):
                self._broken(e)
            raise
        self._write_progress()
        log.info("hadar_train: stopped at step %d (%s); checkpoint %s", self.step, why, self.checkpoint or ("written by rank 0" if self.checkpoint_dir else "none (no checkpoint directory)"))
        self._exit_stopped(f"stopped by {why}")

    def _exit_stopped(self, reason: str) -> None:
        own = self._wait_own_signal()
        if not own:
            self._exit_code = 1
        self.close()
        if own:
            raise Stopped(0, reason)
        self.state = FAILED
        self._write_progress()
        why = f"{reason} elsewhere in the unit, and no stop signal here within {self.stop_grace:g}s: exiting 1 so the scheduler plans the job anew"
        log.warning("hadar_train: %s", why)
        raise Stopped(1, why)

    def _wait_own_signal(self) -> bool:
        deadline = time.monotonic() + self.stop_grace
        while self._signal is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return self._signal is not None

    def _broken(self, err: BaseException) -> None:
        """A peer was lost: rank 0 saves what it holds (the state after the
        last whole step) without the others, and the run ends."""
        log.warning("hadar_train: the unit broke at step %d: %s", self.step, err)
        self.state = FAILED
        if self.is_main and self.checkpoint_dir:
            try:
                self.save_checkpoint(gather=False)
            except (OSError, RuntimeError, ck.CheckpointError) as e:
                log.warning("hadar_train: no checkpoint after the unit broke: %s", e)
        self._write_progress()
        self._exit_stopped(f"a lost peer ({err})")

    def _finish(self) -> None:
        self.state = DONE
        if self._members is not None:
            self._members.finish()
        self.save_checkpoint()
        self._write_progress()
        log.info("hadar_train: done at step %d; checkpoint %s", self.step, self.checkpoint or ("written by rank 0" if self.checkpoint_dir else "none (no checkpoint directory)"))

    def close(self) -> None:
        """Leave the process group and give back the signal handlers. The
        process then ends with the contract's status whatever the process
        group does at interpreter shutdown (it can hang after DDP over
        gloo): under the launcher the launcher ends it; without, a unit's
        process ends at exit, after its ``atexit`` handlers, with 0 (done,
        or stopped here), or 1 (``Stopped(1)``, or an uncaught exception),
        and skips interpreter shutdown."""
        if self._closed:
            return
        self._closed = True
        if self.distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                try:
                    dist.destroy_process_group()
                except RuntimeError as e:
                    log.debug("hadar_train: destroy_process_group: %s", e)
            # gloo's worker threads drop the tensors of finished collectives
            # after the caller saw them finish, taking the GIL when Python
            # let go of them first. torch (1.13) destroys a gloo process
            # group holding the GIL when its last owner goes (DDP's reducer,
            # when the script lets go of the model) and waits for those
            # threads: one starved of CPU until then deadlocks the process
            # (pytorch/pytorch#56297; seen once on a loaded machine, after
            # "done"). Let them have the GIL now.
            time.sleep(0.1)
        for sig, old in self._old_handlers.items():
            if threading.current_thread() is threading.main_thread():
                signal.signal(sig, old if old is not None else signal.SIG_DFL)
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._old_excepthook
        _exit_guard.arm(self._exit_code)

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if exc is not None and not isinstance(exc, Stopped) and isinstance(exc, RuntimeError) and self.distributed and _peer_error(exc):
            # A collective of the user's own step failed: a peer is gone.
            self._broken(exc)
        if exc is None or isinstance(exc, Stopped):
            self.close()
        return False


class _ExitGuard:
    """Without the launcher: ends a unit's process at exit, once the Run
    is closed, with the contract's status (``os._exit``), skipping
    interpreter shutdown, where the process group's destructors can hang.
    Registered with ``atexit`` at ``init()`` (handlers registered later run
    first), armed by ``close()``. An uncaught exception means 1 (as the
    interpreter's own status); a ``sys.exit(n)`` of the script after
    ``close()`` is not seen (the launcher passes it on)."""

    def __init__(self) -> None:
        self.registered = False
        self.code: Optional[int] = None
        self.uncaught = False
        self._excepthook: Any = None

    def register(self) -> None:
        if not self.registered:
            self.registered = True
            atexit.register(self._at_exit)

    def arm(self, code: int) -> None:
        if not self.registered:
            return
        self.code = code
        if self._excepthook is None:
            self._excepthook = sys.excepthook
            sys.excepthook = self._seen

    def _seen(self, exc_type: Any, exc: BaseException, tb: Any) -> None:
        self.uncaught = True
        self._excepthook(exc_type, exc, tb)

    def _at_exit(self) -> None:
        if self.code is None:
            return
        code = 1 if self.uncaught else self.code
        logging.shutdown()
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


_exit_guard = _ExitGuard()


def _peer_error(e: BaseException) -> bool:
    """Whether a RuntimeError is a collective failing on a lost peer (gloo
    and NCCL word it in several ways)."""
    s = str(e).lower()
    return any(w in s for w in ("connection closed", "connection reset", "broken pipe", "timed out", "timeout", "nccl error",
                                "by peer", "connection refused", "socket closed"))


def init(total_steps: Optional[int] = None, *, environ: Optional[Mapping[str, str]] = None, **options: Any) -> Run:
    """Start a run under the contract: read hadar's environment, join the
    unit through torch.distributed (env://) when there are several
    workers, and take over SIGTERM and SIGINT so the unit stops together
    with a checkpoint. ``total_steps`` is the default when
    HADAR_TOTAL_STEPS is unset. Outside hadar it writes no progress file
    and checkpoints only into ``checkpoint_dir=`` if given.

    Options: backend, checkpoint_dir, checkpoint_every (steps),
    checkpoint_interval (seconds), keep_checkpoints, progress_interval,
    stop_grace, timeout (collectives and rendezvous, seconds),
    merge_timeout, member_ttl, install_signals."""
    if not logging.getLogger().handlers and not log.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(h)
        log.setLevel(logging.INFO)
    return Run(Env.from_environ(environ), total_steps=total_steps, **options)
