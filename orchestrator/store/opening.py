"""Opening a database file: one writer per file per process, and what a failed open means
(another process holds the lock, or this one already has the file open) as one line."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import duckdb

from orchestrator.errors import StoreError, StoreLocked

__all__ = ["claim_path", "one_line", "release_path", "store_error", "translate_open_error"]


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def store_error(message: str, cause: BaseException) -> StoreError:
    err = StoreError(message)
    err.__cause__ = cause
    return err


_PID_RE = re.compile(r"PID (\d+)")


def translate_open_error(path: Path, exc: duckdb.Error) -> StoreError:
    text = one_line(exc)
    if "Could not set lock" in text or "Conflicting lock" in text:
        match = _PID_RE.search(text)
        pid = f" (PID {match.group(1)})" if match else ""
        return StoreLocked(
            f"database {path} is in use by another prime-agent process{pid}; "
            "wait for it to finish or stop it"
        )
    if "different configuration" in text:
        return StoreLocked(f"database {path} is already open in this process (PID {os.getpid()})")
    return StoreError(f"cannot open database {path}: {text}")


# One writer per database file per process: two Store objects on one file would share DuckDB's
# instance but keep separate sequence counters, and hand out duplicate seq numbers.
_open_paths: set[str] = set()
_open_paths_lock = threading.Lock()


def claim_path(path: Path) -> str:
    key = os.path.realpath(path)
    with _open_paths_lock:
        if key in _open_paths:
            raise StoreLocked(
                f"database {path} is already open in this process (PID {os.getpid()})"
            )
        _open_paths.add(key)
    return key


def release_path(key: str) -> None:
    with _open_paths_lock:
        _open_paths.discard(key)
