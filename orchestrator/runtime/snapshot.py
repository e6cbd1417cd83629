"""Namespace snapshots, INSIDE the kernel: save the user namespace per variable, load it back.

The host runs ``save`` after executions (debounced) and ``restore`` in every new kernel of the
session, both as silent executions (no history, no output, not a model cell); each returns a
JSON report the host reads through ``last_report`` (docs/snapshots.md). Only the stdlib and
dill are used here (dill is imported on first use, never at kernel start).

Layout of a snapshot directory (written by the kernel, kept by the host)::

    CURRENT                 name of the committed generation ("gen-...")
    gen-.../manifest.json   what was saved, re-imported and skipped (and why)
    gen-.../v00000.pkl      one dill pickle per saved variable

A snapshot is written into ``.tmp-<generation>/``, renamed to ``gen-<...>/`` and committed by
atomically replacing ``CURRENT``; only then are older generations removed. A kernel that dies
(or is interrupted) part-way leaves the previous snapshot untouched.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pickle
import re
import secrets
import shutil
import time
import types
from collections.abc import Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import IO, Any

from orchestrator.runtime import RUNTIME_NAMES

__all__ = [
    "CURRENT_FILE",
    "MANIFEST_FILE",
    "NOT_PREPARED",
    "SNAPSHOT_FORMAT",
    "adopt",
    "last_report",
    "read_manifest",
    "restore",
    "restore_namespace",
    "save",
    "save_namespace",
]

SNAPSHOT_FORMAT = 1
CURRENT_FILE = "CURRENT"
MANIFEST_FILE = "manifest.json"
GENERATION_PREFIX = "gen-"
TMP_PREFIX = ".tmp-"
VARIABLE_FILE = "v{index:05d}.pkl"
GENERATION_TOKEN_BYTES = 4
# An error message kept in a report (the first line, this long at most).
DETAIL_MAX_CHARS = 200
# What a report sent back to the host lists at most per kind (the manifest lists everything).
REPORT_MAX_NAMES = 200
# IPython's own history and output-cache names (_, __, _i, _ii, _i3, _3, _ih, _oh, _dh) and
# dunders: skipped without being listed.
_IPYTHON_PRIVATE = re.compile(r"^(_+|_i{1,3}|_i?\d+|_ih|_oh|_dh|__\w+__)$")

_last_report = "{}"
# True once this kernel holds the session's namespace: it was revived (``restore``, also when
# there was nothing to revive) or adopted as it is (``adopt``). ``save`` refuses before that, so
# a kernel that was restarted behind the host's back never overwrites a good snapshot with its
# empty namespace.
_prepared = False
NOT_PREPARED = "not_prepared"


class _OverCap(Exception):
    """The pickle being written passed its byte limit."""


class _CappedWriter:
    """File wrapper that refuses to grow past ``cap`` bytes: a huge object is abandoned after
    ``cap`` bytes of pickle, never fully serialized in memory or on disk."""

    def __init__(self, raw: IO[bytes], cap: int):
        self.raw = raw
        self.cap = cap
        self.written = 0

    def write(self, data: bytes) -> int:
        self.written += len(data)
        if self.written > self.cap:
            raise _OverCap(self.written)
        return self.raw.write(data)


def _detail(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:DETAIL_MAX_CHARS]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _candidates(
    namespace: Mapping[str, Any], hidden: Mapping[str, Any]
) -> Iterator[tuple[str, Any, str | None]]:
    """(name, value, why not saved or None) for every name a snapshot considers; names the
    shell itself owns (``In``, ``Out``, ``_3``...) are not even listed."""
    unset = object()
    for name, value in list(namespace.items()):
        if not isinstance(name, str) or _IPYTHON_PRIVATE.match(name):
            continue
        if hidden.get(name, unset) is value:  # the shell's or the runtime's own object
            continue
        if name in RUNTIME_NAMES and _is_runtime_object(value):
            # The runtime's helper itself (rebuilt by the next kernel), not a user's own
            # variable that happens to share its name (``history = model.fit(...)``).
            yield name, value, "runtime"
        elif name.startswith("_"):
            yield name, value, "private"
        else:
            yield name, value, None


def _is_runtime_object(value: Any) -> bool:
    module = getattr(type(value), "__module__", "") or ""
    return module == "orchestrator.runtime" or module.startswith("orchestrator.runtime.")


def save_namespace(
    namespace: Mapping[str, Any],
    directory: str | os.PathLike[str],
    *,
    hidden: Mapping[str, Any] | None = None,
    var_cap_bytes: int,
    total_cap_bytes: int,
    time_budget_s: float,
) -> dict[str, Any]:
    """Write a new snapshot of ``namespace`` into ``directory``; return the manifest.

    Modules are recorded by name (re-imported at restore); everything else public is pickled
    with dill, each variable on its own, each bounded by ``var_cap_bytes`` and all together by
    ``total_cap_bytes``. A variable that cannot be pickled is skipped with the reason. An
    ``OSError`` (disk full...) or an interrupt abandons the new snapshot and keeps the old one.
    """
    import dill

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    generation = (
        f"{GENERATION_PREFIX}{time.time_ns():x}-{secrets.token_hex(GENERATION_TOKEN_BYTES)}"
    )
    tmp = root / f"{TMP_PREFIX}{generation}"
    final = root / generation
    saved: list[dict[str, Any]] = []
    modules: list[dict[str, str]] = []
    skipped: list[dict[str, str]] = []
    total = 0
    tmp.mkdir()
    try:
        for name, value, why in _candidates(namespace, hidden or {}):
            if why is not None:
                skipped.append({"name": name, "reason": why})
                continue
            if isinstance(value, types.ModuleType):
                modules.append({"name": name, "module": value.__name__})
                continue
            if time.monotonic() - started > time_budget_s:
                skipped.append({"name": name, "reason": "time_budget"})
                continue
            remaining = total_cap_bytes - total
            cap = min(var_cap_bytes, remaining)
            file_name = VARIABLE_FILE.format(index=len(saved))
            path = tmp / file_name
            try:
                with open(path, "wb") as fh:
                    writer = _CappedWriter(fh, cap)
                    dill.dump(value, writer, protocol=pickle.HIGHEST_PROTOCOL)
                    fh.flush()
                    os.fsync(fh.fileno())
            except _OverCap:
                path.unlink(missing_ok=True)
                reason = "too_large" if cap == var_cap_bytes else "total_cap"
                skipped.append({"name": name, "reason": reason})
                continue
            except OSError:
                raise
            except Exception as exc:  # unpicklable: generators, sockets, locks, frames...
                path.unlink(missing_ok=True)
                skipped.append({"name": name, "reason": "unpicklable", "detail": _detail(exc)})
                continue
            size = writer.written
            total += size
            saved.append(
                {"name": name, "file": file_name, "bytes": size, "type": type(value).__name__}
            )
        manifest = {
            "format": SNAPSHOT_FORMAT,
            "generation": generation,
            "created_at": time.time(),
            "saved": saved,
            "modules": modules,
            "skipped": skipped,
            "bytes": total,
            "var_cap_bytes": var_cap_bytes,
            "total_cap_bytes": total_cap_bytes,
            "seconds": round(time.monotonic() - started, 3),
        }
        _write_file(tmp / MANIFEST_FILE, json.dumps(manifest).encode())
        _fsync_dir(tmp)
        os.rename(tmp, final)
        pointer = root / f"{TMP_PREFIX}{CURRENT_FILE}-{generation}"
        _write_file(pointer, generation.encode())
        os.replace(pointer, root / CURRENT_FILE)  # the commit point
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if _current_generation(root) != generation:
            shutil.rmtree(final, ignore_errors=True)
        raise
    _remove_stale(root, keep=generation)
    return manifest


def _current_generation(root: Path) -> str | None:
    try:
        name = (root / CURRENT_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not name.startswith(GENERATION_PREFIX) or "/" in name or name in (".", ".."):
        return None
    return name


def _remove_stale(root: Path, *, keep: str) -> None:
    for entry in root.iterdir():
        if entry.name == keep or entry.name == CURRENT_FILE:
            continue
        if entry.name.startswith((GENERATION_PREFIX, TMP_PREFIX)):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The committed snapshot's manifest, or None when there is none (or it is unreadable)."""
    root = Path(directory)
    generation = _current_generation(root)
    if generation is None:
        return None
    try:
        manifest = json.loads((root / generation / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != SNAPSHOT_FORMAT:
        return None
    return manifest


def restore_namespace(
    namespace: MutableMapping[str, Any], directory: str | os.PathLike[str]
) -> dict[str, Any]:
    """Load the committed snapshot into ``namespace``, one variable at a time.

    Returns ``{found, generation, created_at, restored, modules, failed, skipped}``; a variable
    that fails to load is listed in ``failed`` with the reason and the others still load.
    """
    manifest = read_manifest(directory)
    if manifest is None:
        return {"found": False, "restored": [], "modules": [], "failed": [], "skipped": []}
    import dill

    gen_dir = Path(directory) / str(manifest["generation"])
    restored: list[str] = []
    reimported: list[str] = []
    failed: list[dict[str, str]] = []
    for entry in manifest.get("modules", []):
        try:
            namespace[entry["name"]] = importlib.import_module(entry["module"])
            reimported.append(entry["name"])
        except Exception as exc:
            failed.append({"name": entry["name"], "reason": "import", "detail": _detail(exc)})
    for entry in manifest.get("saved", []):
        name = entry["name"]
        try:
            with open(gen_dir / Path(entry["file"]).name, "rb") as fh:
                namespace[name] = dill.load(fh)
            restored.append(name)
        except Exception as exc:
            failed.append({"name": name, "reason": "load", "detail": _detail(exc)})
    return {
        "found": True,
        "generation": manifest["generation"],
        "created_at": manifest.get("created_at"),
        "restored": restored,
        "modules": reimported,
        "failed": failed,
        "skipped": manifest.get("skipped", []),
    }


def _bounded(report: dict[str, Any]) -> str:
    """The report as JSON for the host, each list cut to ``REPORT_MAX_NAMES`` (+ a count)."""
    out = dict(report)
    for key in ("saved", "restored", "modules", "failed", "skipped"):
        items = out.get(key)
        if isinstance(items, list) and len(items) > REPORT_MAX_NAMES:
            out[key] = items[:REPORT_MAX_NAMES]
            out[f"{key}_more"] = len(items) - REPORT_MAX_NAMES
    return json.dumps(out)


def _shell() -> Any:
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        raise RuntimeError("no IPython shell is running")
    return shell


def save(directory: str, var_cap_bytes: int, total_cap_bytes: int, time_budget_s: float) -> None:
    """Host entry point: snapshot the shell's user namespace; the report is ``last_report()``."""
    global _last_report
    if not _prepared:
        _last_report = json.dumps({"ok": False, "error": NOT_PREPARED})
        return
    _last_report = json.dumps({"ok": False, "error": "the snapshot did not finish"})
    shell = _shell()
    try:
        manifest = save_namespace(
            shell.user_ns,
            directory,
            hidden=shell.user_ns_hidden,
            var_cap_bytes=var_cap_bytes,
            total_cap_bytes=total_cap_bytes,
            time_budget_s=time_budget_s,
        )
    except Exception as exc:
        _last_report = json.dumps({"ok": False, "error": _detail(exc)})
        return
    manifest["saved"] = [entry["name"] for entry in manifest["saved"]]
    manifest["modules"] = [entry["name"] for entry in manifest["modules"]]
    _last_report = _bounded({"ok": True, **manifest})


def restore(directory: str) -> None:
    """Host entry point: load the snapshot into the shell's user namespace (``last_report``)."""
    global _last_report, _prepared
    _last_report = json.dumps({"ok": False, "error": "the restore did not finish"})
    try:
        report = restore_namespace(_shell().user_ns, directory)
    except Exception as exc:
        _last_report = json.dumps({"ok": False, "error": _detail(exc)})
        return
    finally:
        _prepared = True  # whatever came back is the namespace from now on
    _last_report = _bounded({"ok": True, **report})


def adopt() -> None:
    """Host entry point: this kernel's namespace is the session's as it is (an adopted
    sandbox, whose kernel outlived its orchestrator): later snapshots may replace the last."""
    global _last_report, _prepared
    _prepared = True
    _last_report = json.dumps({"ok": True})


def last_report() -> str:
    """JSON of the last ``save`` / ``restore`` (what the host reads back)."""
    return _last_report
