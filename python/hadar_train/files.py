"""Atomic file writes, the contract's way: a temporary file in the same
directory (its name starts with a dot), then a rename, so readers see the
old or the new content, never a torn one."""

from __future__ import annotations

import os
import tempfile
from typing import Callable, BinaryIO


def write_atomic(path: str, write: Callable[[BinaryIO], None], mode: int = 0o644) -> None:
    """Write a file through ``write(f)`` into a temporary file beside
    ``path``, sync it, and rename it over ``path``."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise


def write_bytes_atomic(path: str, data: bytes) -> None:
    """``write_atomic`` of bytes."""
    write_atomic(path, lambda f: f.write(data))


def create_exclusive(path: str, data: bytes) -> bool:
    """Write ``data`` to ``path`` unless ``path`` exists, atomically: a
    temporary file hard-linked into place (link(2) fails on an existing
    name, on local filesystems and NFS alike). Returns False when another
    writer was first."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        _remove_quietly(tmp)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
