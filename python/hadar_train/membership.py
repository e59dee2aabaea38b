"""HadarE membership and merge (docs/training-contract.md, "HadarE
membership and merge"): the copies of a job share ``HADAR_MERGE_DIR``::

    members/copy-<i>.json    copy i's heartbeat, rewritten every second
    round-<r>/copy-<i>.json  copy i's model state and steps of round r
    round-<r>/merged.json    round r closed: merged state, the job's steps,
                             who took part, who takes part in round r+1

The Go trainer (trainer/run/merge.go) speaks the same protocol, so copies
of either merge with each other."""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch

from . import state as st
from .files import create_exclusive, write_bytes_atomic
from .progress import JOINING, MERGING, RUNNING, now_rfc3339

#: The merge directory's file version (contract.MergeVersion).
MERGE_VERSION = 3
LEAVING = "leaving"
DONE = "done"
POLL = 0.05

log = logging.getLogger("hadar_train")


class MergeError(RuntimeError):
    """The merge directory holds another job's or model's files, or cannot
    be used."""


def parse_time(s: str) -> float:
    """Seconds since the epoch of an RFC 3339 time as Go writes it
    (fractions of up to nine digits)."""
    s = s.strip()
    if s.endswith("Z"):
        s = s[:-1] + "+00:00"
    main, frac, tz = s, "", ""
    for sep in ("+", "-"):
        i = s.rfind(sep)
        if i > 10:
            main, tz = s[:i], s[i:]
            break
    if "." in main:
        main, frac = main.split(".", 1)
    t = _dt.datetime.fromisoformat(main + tz)
    return t.timestamp() + (float("0." + frac) if frac else 0.0)


def _strict(obj: Any, allowed: Tuple[str, ...], what: str) -> Dict[str, Any]:
    if not isinstance(obj, dict):
        raise MergeError(f"{what}: want a JSON object")
    extra = sorted(set(obj) - set(allowed))
    if extra:
        raise MergeError(f"{what}: unknown fields {extra}; all copies must follow the same contract")
    return obj


def _version(obj: Mapping[str, Any], what: str) -> None:
    if obj.get("version") != MERGE_VERSION:
        raise MergeError(f"{what}: version {obj.get('version')!r}, want {MERGE_VERSION}; all copies must follow the same contract")


def _contributions(v: Any, what: str) -> List[Dict[str, Any]]:
    if not isinstance(v, list):
        raise MergeError(f"{what}: want a list")
    out = []
    for c in v:
        c = _strict(c, ("copy", "steps", "leaving"), what)
        if not isinstance(c.get("copy"), int) or not isinstance(c.get("steps"), int) or c["copy"] < 0 or c["steps"] < 0:
            raise MergeError(f"{what}: copy {c.get('copy')!r} with {c.get('steps')!r} steps; want both >= 0")
        out.append({"copy": c["copy"], "steps": c["steps"], **({"leaving": True} if c.get("leaving") else {})})
    return out


@dataclass
class Merged:
    """A closed round (contract.Merged)."""

    job_id: str
    round: int
    total_steps: int
    steps_done: int
    members: List[Dict[str, Any]]
    targets: List[Dict[str, Any]]
    done: bool
    closed_by: int
    closed: str
    state: Dict[str, torch.Tensor] = field(repr=False)

    def target(self, copy: int) -> Optional[int]:
        """This copy's steps in the next round, None if not a member."""
        for t in self.targets:
            if t["copy"] == copy:
                return int(t["steps"])
        return None

    def to_json(self) -> bytes:
        return json.dumps({
            "version": MERGE_VERSION, "job_id": self.job_id, "round": self.round, "total_steps": self.total_steps,
            "steps_done": self.steps_done, "members": self.members, "targets": self.targets, "done": self.done,
            "closed_by": self.closed_by, "closed": self.closed, "state": st.encode_state(self.state),
        }, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, raw: bytes) -> "Merged":
        obj = _strict(json.loads(raw), ("version", "job_id", "round", "total_steps", "steps_done", "members", "targets",
                                        "done", "closed_by", "closed", "state"), "merged round")
        _version(obj, "merged round")
        r, total, done = obj.get("round"), obj.get("total_steps"), obj.get("steps_done")
        if not isinstance(r, int) or r < 0:
            raise MergeError(f"merged round: round {r!r}, want >= 0")
        if not isinstance(total, int) or not isinstance(done, int) or total < 1 or not 0 <= done <= total:
            raise MergeError(f"merged round: steps_done {done!r}, total_steps {total!r}; want 0 <= steps_done <= total_steps")
        try:
            state = st.decode_state(obj.get("state"))
        except st.StateError as e:
            raise MergeError(f"merged round: state: {e}") from None
        return cls(job_id=str(obj.get("job_id", "")), round=r, total_steps=total, steps_done=done,
                   members=_contributions(obj.get("members"), "members"), targets=_contributions(obj.get("targets"), "targets"),
                   done=bool(obj.get("done")), closed_by=int(obj.get("closed_by", 0)), closed=str(obj.get("closed", "")), state=state)


@dataclass
class CopyFile:
    """A copy's state and steps of a round (contract.MergeFile)."""

    job_id: str
    round: int
    copy_index: int
    copies: int
    steps: int
    merge_every: int
    leaving: bool
    state: Dict[str, torch.Tensor] = field(repr=False)

    def to_json(self) -> bytes:
        obj: Dict[str, Any] = {"version": MERGE_VERSION, "job_id": self.job_id, "round": self.round, "copy_index": self.copy_index,
                               "copies": self.copies, "steps": self.steps, "merge_every": self.merge_every}
        if self.leaving:
            obj["leaving"] = True
        obj["state"] = st.encode_state(self.state)
        return json.dumps(obj, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, raw: bytes) -> "CopyFile":
        obj = _strict(json.loads(raw), ("version", "job_id", "round", "copy_index", "copies", "steps", "merge_every", "leaving", "state"), "copy file")
        _version(obj, "copy file")
        ints = {k: obj.get(k) for k in ("round", "copy_index", "copies", "steps", "merge_every")}
        if not all(isinstance(v, int) for v in ints.values()):
            raise MergeError(f"copy file: {ints}: want integers")
        if ints["round"] < 1 or ints["copies"] < 1 or ints["copy_index"] < 0 or ints["steps"] < 0 or ints["merge_every"] < 0 \
                or (ints["copies"] > 1 and ints["copy_index"] >= ints["copies"]):
            raise MergeError(f"copy file: {ints}: want round >= 1, copies >= 1, 0 <= copy_index (< copies when copies > 1), steps and merge_every >= 0")
        try:
            state = st.decode_state(obj.get("state"))
        except st.StateError as e:
            raise MergeError(f"copy file: state: {e}") from None
        return cls(job_id=str(obj.get("job_id", "")), round=ints["round"], copy_index=ints["copy_index"], copies=ints["copies"],
                   steps=ints["steps"], merge_every=ints["merge_every"], leaving=bool(obj.get("leaving")), state=state)


def close_round(base: Merged, files: List[CopyFile], joiners: List[Tuple[int, int]], closed_by: int, fallback: int,
                closed: Optional[str] = None) -> Merged:
    """contract.Close: round ``base.round + 1`` closed with the copy files
    present; joiners are ``(copy, merge_every)`` of copies waiting to join."""
    r = base.round + 1
    files = sorted(files, key=lambda f: f.copy_index)
    cands: List[Tuple[int, int]] = []
    steps = 0
    for f in files:
        if f.round != r:
            raise MergeError(f"close round {r}: copy {f.copy_index}'s file is of round {f.round}")
        why = st.same_layout(base.state, f.state)
        if why:
            raise MergeError(f"close round {r}: copy {f.copy_index}: {why}; all copies must run the same model")
        steps += f.steps
        if not f.leaving:
            cands.append((f.copy_index, f.merge_every))
    state = st.merge_states([f.state for f in files], [float(f.steps) for f in files]) if files else base.state
    done = min(base.steps_done + steps, base.total_steps)
    members = [{"copy": f.copy_index, "steps": f.steps, **({"leaving": True} if f.leaving else {})} for f in files]
    mg = Merged(job_id=base.job_id, round=r, total_steps=base.total_steps, steps_done=done, members=members, targets=[],
                done=done >= base.total_steps, closed_by=closed_by, closed=closed or now_rfc3339(), state=state)
    if not mg.done:
        by_copy = dict(cands)
        for c, e in joiners:
            by_copy[c] = e
        mg.targets = st.next_targets(base.total_steps - done, sorted(by_copy.items()), fallback)
    return mg


def round_dir(d: str, r: int) -> str:
    return os.path.join(d, f"round-{r}")


def copy_path(d: str, r: int, c: int) -> str:
    return os.path.join(round_dir(d, r), f"copy-{c}.json")


def merged_path(d: str, r: int) -> str:
    return os.path.join(round_dir(d, r), "merged.json")


def member_path(d: str, c: int) -> str:
    return os.path.join(d, "members", f"copy-{c}.json")


def merged_rounds(d: str) -> List[int]:
    """Rounds of ``d`` that are closed, ascending."""
    out = []
    try:
        entries = list(os.scandir(d))
    except FileNotFoundError:
        return []
    for e in entries:
        num = e.name[len("round-"):] if e.name.startswith("round-") else ""
        if num.isdigit() and e.is_dir(follow_symlinks=False) and os.path.exists(merged_path(d, int(num))):
            out.append(int(num))
    return sorted(out)


class Heartbeat:
    """Keeps ``members/copy-<i>.json`` fresh while the copy lives."""

    def __init__(self, path: str, doc: Dict[str, Any], every: float) -> None:
        self.path, self.doc, self.every = path, dict(doc), every
        self._lock = threading.Lock()
        self._quit = threading.Event()
        self._stopped = False
        self.write()
        self._thread = threading.Thread(target=self._loop, name="hadar-heartbeat", daemon=True)
        self._thread.start()

    def write(self) -> None:
        with self._lock:
            self.doc["updated"] = now_rfc3339()
            raw = json.dumps(self.doc, separators=(",", ":")).encode()
        write_bytes_atomic(self.path, raw)

    def _loop(self) -> None:
        while not self._quit.wait(self.every):
            try:
                self.write()
            except OSError as e:
                log.warning("hadare: heartbeat not written: %s", e)

    def set(self, state: str, rnd: int) -> None:
        """Change what the heartbeat says, and write it at once."""
        with self._lock:
            self.doc["state"], self.doc["round"] = state, rnd
        try:
            self.write()
        except OSError as e:
            log.warning("hadare: heartbeat not written: %s", e)

    def stop(self, state: str) -> None:
        """Write the last heartbeat (leaving or done) and end the loop."""
        if self._stopped:
            return
        self._stopped = True
        self._quit.set()
        self._thread.join()
        with self._lock:
            self.doc["state"] = state
        try:
            self.write()
        except OSError as e:
            log.warning("hadare: last heartbeat not written: %s", e)


class Membership:
    """One copy's (its unit's rank 0's) view of its job's copies."""

    def __init__(self, merge_dir: str, job_id: str, copy: int, copies: int, total_steps: int, merge_every: int,
                 init_state: Mapping[str, torch.Tensor], merge_timeout: float = 120.0, member_ttl: float = 15.0,
                 heartbeat_every: float = 1.0) -> None:
        self.dir, self.job_id, self.self = merge_dir, job_id, copy
        self.copies, self.total, self.merge_every = copies, total_steps, merge_every
        self.init_state = {k: v.detach().to("cpu").clone() for k, v in init_state.items()}
        self.merge_timeout, self.member_ttl, self.heartbeat_every = merge_timeout, member_ttl, heartbeat_every
        self.hb: Optional[Heartbeat] = None
        self._files: Dict[str, Tuple[Tuple[int, int, int], CopyFile]] = {}

    # Joining.

    def join(self) -> Merged:
        """Announce this copy and return the newest closed round (writing
        round 0 if there is none)."""
        self.hb = Heartbeat(member_path(self.dir, self.self), {
            "version": MERGE_VERSION, "job_id": self.job_id, "copy": self.self, "state": JOINING, "round": 0,
            "merge_every": self.merge_every, "host": socket.gethostname(), "pid": os.getpid(), "updated": ""}, self.heartbeat_every)
        try:
            latest = self.latest()
            if latest is None:
                latest = self.genesis()
            return latest
        except BaseException:
            self.hb.stop(LEAVING)
            raise

    def latest(self) -> Optional[Merged]:
        """The newest closed round, None if there is none."""
        for r in reversed(merged_rounds(self.dir)):
            path = merged_path(self.dir, r)
            try:
                with open(path, "rb") as f:
                    mg = Merged.parse(f.read())
            except (OSError, ValueError) as e:
                log.warning("hadare: skipping an unreadable closed round %s: %s", path, e)
                continue
            self.compatible(mg, path)
            return mg
        return None

    def compatible(self, mg: Merged, path: str) -> None:
        if mg.job_id != self.job_id:
            raise MergeError(f"hadare: {path}: job_id {mg.job_id!r}, this copy runs {self.job_id!r}; give every job its own merge directory")
        if mg.total_steps != self.total:
            raise MergeError(f"hadare: {path}: total_steps {mg.total_steps}, this copy runs {self.total}; all copies must be given the same HADAR_TOTAL_STEPS")
        why = st.same_layout(self.init_state, mg.state)
        if why:
            raise MergeError(f"hadare: {path}: state: {why}; all copies must run the same model")

    def genesis(self) -> Merged:
        """Round 0: this copy's initial state, and as members of round 1
        the declared copies and those announced so far."""
        cands = {c: 0 for c in range(self.copies)} if self.copies > 1 else {}
        for c, e in self.joiners():
            cands[c] = e
        mg = Merged(job_id=self.job_id, round=0, total_steps=self.total, steps_done=0, members=[],
                    targets=st.next_targets(self.total, sorted(cands.items()), self.merge_every), done=False,
                    closed_by=self.self, closed=now_rfc3339(), state=self.init_state)
        return self.publish(mg)

    def joiners(self) -> List[Tuple[int, int]]:
        """Copies whose fresh heartbeats say they wait to join."""
        out = []
        try:
            entries = list(os.scandir(os.path.join(self.dir, "members")))
        except FileNotFoundError:
            return out
        for e in entries:
            num = e.name[len("copy-"):-len(".json")] if e.name.startswith("copy-") and e.name.endswith(".json") else ""
            if not num.isdigit():
                continue
            hb = self.read_member(int(num))
            if hb and hb.get("job_id") == self.job_id and hb.get("state") == JOINING and not self.stale(hb):
                out.append((int(num), int(hb.get("merge_every") or 0)))
        return out

    def read_member(self, c: int) -> Optional[Dict[str, Any]]:
        """A heartbeat, None if missing; {} if unreadable (torn)."""
        try:
            with open(member_path(self.dir, c), "rb") as f:
                obj = json.loads(f.read())
            return obj if isinstance(obj, dict) else {}
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}

    def stale(self, hb: Mapping[str, Any]) -> bool:
        try:
            return time.time() - parse_time(str(hb.get("updated", ""))) > self.member_ttl
        except ValueError:
            return True

    def publish(self, mg: Merged) -> Merged:
        """Write a closed round unless one exists; return the one there."""
        path = merged_path(self.dir, mg.round)
        if create_exclusive(path, mg.to_json()):
            return mg
        with open(path, "rb") as f:
            return Merged.parse(f.read())

    # A round.

    def contribute(self, r: int, steps: int, state: Mapping[str, torch.Tensor], leaving: bool) -> None:
        f = CopyFile(job_id=self.job_id, round=r, copy_index=self.self, copies=max(self.copies, 1), steps=steps,
                     merge_every=self.merge_every, leaving=leaving, state=dict(state))
        write_bytes_atomic(copy_path(self.dir, r, self.self), f.to_json())

    def _read_copy(self, path: str) -> CopyFile:
        s = os.stat(path)
        key = (s.st_ino, s.st_mtime_ns, s.st_size)
        hit = self._files.get(path)
        if hit and hit[0] == key:
            return hit[1]
        with open(path, "rb") as fh:
            f = CopyFile.parse(fh.read())
        self._files[path] = (key, f)
        return f

    def round_state(self, r: int, base: Merged) -> Tuple[Dict[int, CopyFile], List[int]]:
        """Round r's files of base's targets present, and the targets still
        expected (alive, not left, no file yet)."""
        files: Dict[int, CopyFile] = {}
        waiting: List[int] = []
        for t in base.targets:
            c = t["copy"]
            path = copy_path(self.dir, r, c)
            try:
                f = self._read_copy(path)
            except FileNotFoundError:
                hb = self.read_member(c)
                if hb is None or hb == {} or not (hb.get("state") in (LEAVING, DONE) or self.stale(hb)):
                    waiting.append(c)  # declared and not started, torn, or alive
                continue
            except (OSError, ValueError) as e:
                log.warning("hadare: skipping an unreadable copy file %s: %s", path, e)
                continue
            why = None
            if f.job_id != self.job_id:
                why = f"job_id {f.job_id!r}, this copy runs {self.job_id!r}"
            elif f.round != r or f.copy_index != c:
                why = f"round {f.round}, copy_index {f.copy_index} do not match the file's path (round {r}, copy {c})"
            else:
                why = st.same_layout(base.state, f.state)
            if why:
                log.warning("hadare: skipping an invalid copy file %s: %s", path, why)
                continue
            files[c] = f
        return files, waiting

    def close(self, r: int, base: Merged, files: Dict[int, CopyFile]) -> Merged:
        mg = close_round(base, list(files.values()), self.joiners(), self.self, self.merge_every)
        return self.publish(mg)

    def closed_from(self, r: int) -> Optional[Merged]:
        """The newest closed round if round r (or a later one) is closed."""
        if not os.path.exists(merged_path(self.dir, r)):
            return None
        return self.latest()

    def wait_round(self, r: int, base: Merged, tick: Callable[[], None]) -> Merged:
        """A member's wait at the end of round r for the other members'
        files, up to the merge timeout; then it closes the round itself
        unless another copy did."""
        assert self.hb is not None
        self.hb.set(MERGING, r)
        deadline = time.monotonic() + self.merge_timeout
        while True:
            mg = self.closed_from(r)
            if mg is not None:
                return mg
            files, waiting = self.round_state(r, base)
            if not waiting:
                return self.close(r, base, files)
            if time.monotonic() >= deadline:
                log.warning("hadare: copies %s missing after %.0fs; merging round %d without them", waiting, self.merge_timeout, r)
                return self.close(r, base, files)
            tick()
            time.sleep(min(POLL, max(0.0, deadline - time.monotonic())))

    def wait_join(self, base: Merged, tick: Callable[[], None]) -> Merged:
        """A copy's wait for the round under way to close when it is not one
        of its members; if every member left without closing it, this copy
        closes it (nobody else would)."""
        assert self.hb is not None
        self.hb.set(JOINING, base.round + 1)
        while True:
            mg = self.latest()
            if mg is not None and mg.round > base.round:
                return mg
            files, waiting = self.round_state(base.round + 1, base)
            if not waiting:
                return self.close(base.round + 1, base, files)
            tick()
            time.sleep(POLL)

    def running(self, rnd: int) -> None:
        assert self.hb is not None
        self.hb.set(RUNNING, rnd)

    def leave(self, r: int, base: Merged, steps: int, state: Mapping[str, torch.Tensor], member: bool) -> Optional[Merged]:
        """A stopped copy's goodbye: its steps of the round so far, marked
        leaving, if it is a member of it; its heartbeat marked leaving; the
        round closed if no other member is still expected. Returns the
        round closed, if it closed one."""
        assert self.hb is not None
        if not member:
            self.hb.stop(LEAVING)
            return None
        mg = self.closed_from(r)
        if mg is not None:
            self.hb.stop(LEAVING)
            return mg
        try:
            self.contribute(r, steps, state, True)
        finally:
            self.hb.stop(LEAVING)
        mg = self.closed_from(r)
        if mg is not None:
            return mg
        files, waiting = self.round_state(r, base)
        if waiting:
            log.info("hadare: left round %d with %d steps; the other copies %s merge them", r, steps, waiting)
            return None
        return self.close(r, base, files)

    def finish(self) -> None:
        if self.hb is not None:
            self.hb.stop(DONE)
