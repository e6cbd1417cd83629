"""Namespace snapshots, host side: when to take them, how to revive them, what the model is told.

Each session has one ``NamespaceKeeper`` (its snapshot directory, the debounce timer, the
notice waiting for the model) and each of its sandboxes is wrapped in a ``KeptSandbox``. The
wrapper revives the namespace in every new kernel (the backend calls
``Sandbox.after_kernel_start`` after each restart; a new sandbox is revived when it is
attached), schedules a snapshot after cells, takes a last one before the sandbox stops, and
notices a sandbox that is gone (``lost``: the supervisor starts a new one for the next cell).

The work inside the kernel is ``orchestrator/runtime/snapshot.py``; both directions run as
silent executions (no history, no output, not a model cell). docs/snapshots.md has the layout,
the bounds and the notice texts.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import logging
import re
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from orchestrator.errors import SandboxError
from orchestrator.ids import validate_session_id
from orchestrator.paths import Paths, ensure_private_dir
from orchestrator.runtime.snapshot import NOT_PREPARED, read_manifest
from orchestrator.sandbox.base import (
    CellResult,
    OutputListener,
    Sandbox,
    SandboxInfo,
    SandboxRef,
    SilentRunner,
)
from orchestrator.settings import SNAPSHOT_DEBOUNCE_S

__all__ = [
    "NEW_SANDBOX_TEXT",
    "SNAPSHOTS_DIR_NAME",
    "SNAPSHOT_MAX_DELAY_S",
    "SNAPSHOT_TIMEOUT_S",
    "SNAPSHOT_TIME_BUDGET_S",
    "SNAPSHOT_TOTAL_CAP_BYTES",
    "SNAPSHOT_VAR_CAP_BYTES",
    "KeptSandbox",
    "NamespaceKeeper",
    "merge_notice",
    "revival_text",
    "snapshot_dir_for",
]

log = logging.getLogger(__name__)

MIB: Final = 1024**2
SNAPSHOTS_DIR_NAME: Final = "snapshots"  # under the XDG data dir, next to "artifacts"
# After a cell, wait SNAPSHOT_DEBOUNCE_S (settings) for the next one before snapshotting (cells
# that come fast share one snapshot), but never leave a changed namespace unsaved for longer:
SNAPSHOT_MAX_DELAY_S: Final = 30.0
SNAPSHOT_VAR_CAP_BYTES: Final = 16 * MIB  # one variable's pickle; larger ones are skipped
SNAPSHOT_TOTAL_CAP_BYTES: Final = 256 * MIB  # all variables of one snapshot together
SNAPSHOT_TIME_BUDGET_S: Final = 30.0  # inside the kernel: later variables are skipped
# The host gives up on one save or restore after this long and interrupts the kernel.
SNAPSHOT_TIMEOUT_S: Final = 60.0
# A sandbox that stops (unload, shutdown) waits at most this long for its last snapshot: a
# daemon's shutdown must not stall on one session's namespace.
SNAPSHOT_STOP_TIMEOUT_S: Final = 10.0
# After this many revivals in a row that did not finish (the snapshot kills the kernel, say),
# the snapshot is set aside: the namespace starts empty and later snapshots replace it.
REVIVAL_MAX_FAILURES: Final = 2
# Slack for the silent execution's own timeout, so ours (which interrupts) fires first.
RUNNER_TIMEOUT_SLACK_S: Final = 5.0
NOTICE_MAX_NAMES: Final = 30  # names listed per kind in a notice; the rest are counted

_MODULE: Final = "orchestrator.runtime.snapshot"
REPORT_EXPRESSIONS: Final = {"report": f"__import__({_MODULE!r}, fromlist=['_']).last_report()"}
# The gateway's notices after a restart end in one of these; with a revival they are replaced.
_LOST = re.compile(r"(?:;| and) the namespace is lost\.")
NEW_SANDBOX_TEXT: Final = "This session got a new sandbox."

_REASONS: Final = {
    "too_large": "over the {var_cap} per-variable cap",
    "total_cap": "over the {total_cap} snapshot cap",
    "unpicklable": "cannot be pickled",
    "time_budget": "the snapshot ran out of time",
    "private": "private name, not saved",
    "runtime": "runtime name, not saved",
    "load": "failed to load",
    "import": "re-import failed",
}


def snapshot_dir_for(paths: Paths, session_id: str) -> Path:
    """The session's snapshot directory (created, 0700): ``<data>/snapshots/<session id>``."""
    return ensure_private_dir(paths.data_dir / SNAPSHOTS_DIR_NAME / validate_session_id(session_id))


def _mib(n: int) -> str:
    return f"{n / MIB:g} MiB"


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _names(items: list[str], more: int = 0) -> str:
    shown = items[:NOTICE_MAX_NAMES]
    extra = len(items) - len(shown) + more
    return ", ".join(shown) + (f" and {extra} more" if extra > 0 else "")


def revival_text(report: Mapping[str, Any], *, now: float | None = None) -> str:
    """What the model reads about a revival: which names came back and which did not."""
    if not report.get("ok"):
        return (
            f"Reviving the REPL namespace from its last snapshot failed "
            f"({report.get('error', 'unknown error')}); the namespace starts empty."
        )
    created = report.get("created_at")
    age = ""
    if isinstance(created, int | float):
        age = f", taken {_age((now or time.time()) - created)} ago"
    back = [str(n) for n in report.get("restored", [])]
    modules = [str(n) for n in report.get("modules", [])]
    caps = {
        "var_cap": _mib(int(report.get("var_cap_bytes") or SNAPSHOT_VAR_CAP_BYTES)),
        "total_cap": _mib(int(report.get("total_cap_bytes") or SNAPSHOT_TOTAL_CAP_BYTES)),
    }
    missing: list[str] = []
    for entry in [*report.get("failed", []), *report.get("skipped", [])]:
        reason = _REASONS.get(str(entry.get("reason")), str(entry.get("reason")))
        detail = entry.get("detail")
        text = reason.format(**caps) + (f": {detail}" if detail else "")
        missing.append(f"{entry.get('name')} ({text})")
    parts = [f"The REPL namespace was revived from its last snapshot{age}."]
    more_back = int(report.get("restored_more") or 0)
    parts.append(f"Back: {_names(back, more_back)}." if back or more_back else "Back: nothing.")
    if modules:
        parts.append(f"Re-imported: {_names(modules, int(report.get('modules_more') or 0))}.")
    more_missing = int(report.get("failed_more") or 0) + int(report.get("skipped_more") or 0)
    if missing or more_missing:
        parts.append(f"Not back: {_names(missing, more_missing)}.")
    parts.append("Anything defined after that snapshot is gone.")
    return " ".join(parts)


def merge_notice(notice: str, revival: str) -> str:
    """A result's notice with the revival text: "the namespace is lost" no longer holds."""
    base = _LOST.sub(".", notice).strip()
    return f"{base} {revival}".strip()


def _report(reply: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON report of a silent save/restore, from its ``user_expressions``."""
    value = (reply.get("user_expressions") or {}).get("report") or {}
    if value.get("status") != "ok":
        return {"ok": False, "error": f"{value.get('ename', 'no report')}: {value.get('evalue')}"}
    try:
        text = ast.literal_eval(value["data"]["text/plain"])
        report = json.loads(text)
    except (KeyError, TypeError, ValueError, SyntaxError):
        return {"ok": False, "error": "unreadable report"}
    return report if isinstance(report, dict) else {"ok": False, "error": "unreadable report"}


class NamespaceKeeper:
    """One session's snapshots: debounced saves, revival in new kernels, the pending notice."""

    def __init__(
        self,
        directory: Path,
        *,
        debounce_s: float = SNAPSHOT_DEBOUNCE_S,
        max_delay_s: float = SNAPSHOT_MAX_DELAY_S,
        var_cap_bytes: int = SNAPSHOT_VAR_CAP_BYTES,
        total_cap_bytes: int = SNAPSHOT_TOTAL_CAP_BYTES,
        time_budget_s: float = SNAPSHOT_TIME_BUDGET_S,
        timeout_s: float = SNAPSHOT_TIMEOUT_S,
    ):
        self.directory = directory
        # Where the current sandbox's kernel sees ``directory`` (a docker container mounts it at
        # a fixed path); None = the same path (a local kernel). Set by ``KeptSandbox``.
        self.kernel_directory: str | None = None
        self.debounce_s = debounce_s
        self.max_delay_s = max_delay_s
        self.var_cap_bytes = var_cap_bytes
        self.total_cap_bytes = total_cap_bytes
        self.time_budget_s = time_budget_s
        self.timeout_s = timeout_s
        # False while the session is being deleted: no last snapshot, and the directory goes.
        self.keep: Callable[[], bool] = lambda: True
        self.dirty = False  # a cell ran since the last committed snapshot
        self.last_save: dict[str, Any] | None = None  # the last save's report
        self.last_revival: dict[str, Any] | None = None
        self.saves = 0  # committed snapshots (statistics, tests)
        self._first_dirty_at = 0.0
        self._last_cell_at = 0.0
        self._timer: asyncio.Task[None] | None = None
        self._target: Sandbox | None = None
        self._notice = ""  # for the model: the next cell's result, or the next turn's note
        self._revival_failures = 0  # revivals in a row that did not finish

    # --- revival ----------------------------------------------------------------------------

    def _kernel_path(self) -> str:
        """The snapshot directory as the kernel sees it (what save/restore are given)."""
        return self.kernel_directory or str(self.directory)

    def has_snapshot(self) -> bool:
        return read_manifest(self.directory) is not None

    async def revive(self, run: SilentRunner, *, new_sandbox: bool = False) -> None:
        """Load the snapshot into a new kernel (also when there is none: the kernel then
        knows its namespace is the session's). Never raises; the notice says what happened."""
        if self._revival_failures >= REVIVAL_MAX_FAILURES:
            await self.adopt(run)  # start afresh; later snapshots replace the bad one
            self._add_notice(
                f"{NEW_SANDBOX_TEXT if new_sandbox else ''} The last namespace snapshot could "
                f"not be loaded ({self._revival_failures} attempts); it was set aside and the "
                "REPL namespace starts empty."
            )
            return
        code = f"__import__({_MODULE!r}, fromlist=['_']).restore({self._kernel_path()!r})"
        report = await self._run(run, code)
        self.last_revival = report
        if report.get("ok"):
            self._revival_failures = 0
            if not report.get("found"):
                return  # nothing was kept: nothing came back, nothing to say
        elif not self.has_snapshot():
            return  # e.g. a backend that cannot run host code, and nothing to revive anyway
        else:
            self._revival_failures += 1
        text = revival_text(report)
        if new_sandbox:
            text = f"{NEW_SANDBOX_TEXT} {text}"
        self._add_notice(text)
        log.info("revived %s: %s", self.directory.name, text)

    def _add_notice(self, text: str) -> None:
        self._notice = f"{self._notice} {text.strip()}".strip()

    async def adopt(self, run: SilentRunner) -> None:
        """An adopted kernel (namespace intact) may replace the snapshot from now on."""
        await self._run(run, f"__import__({_MODULE!r}, fromlist=['_']).adopt()")

    async def after_kernel_start(self, run: SilentRunner) -> None:
        """``Sandbox.after_kernel_start``: a restarted kernel (or a replaced container)."""
        await self.revive(run)

    def take_notice(self) -> str:
        notice, self._notice = self._notice, ""
        return notice

    # --- saving -----------------------------------------------------------------------------

    def cell_done(self, sandbox: Sandbox) -> None:
        """A cell finished: snapshot once cells pause (``debounce_s``) or ``max_delay_s``."""
        now = time.monotonic()
        if not self.dirty:
            self.dirty = True
            self._first_dirty_at = now
        self._last_cell_at = now
        self._target = sandbox
        if self._timer is None or self._timer.done():
            self._timer = asyncio.get_running_loop().create_task(
                self._debounced(), name=f"snapshot-{self.directory.name}"
            )

    async def _debounced(self) -> None:
        while self.dirty and self._target is not None:
            now = time.monotonic()
            due = min(self._last_cell_at + self.debounce_s, self._first_dirty_at + self.max_delay_s)
            if now < due:
                await asyncio.sleep(due - now)
                continue
            report = await self.save(self._target)
            if not report.get("ok"):
                return  # tried again after the next cell, and before the sandbox stops

    async def save(self, sandbox: Sandbox, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Snapshot now (serialized with cells); returns the kernel's report."""
        self.dirty = False  # a cell that ends meanwhile sets it again
        budget = self.time_budget_s if timeout_s is None else min(self.time_budget_s, timeout_s)
        code = (
            f"__import__({_MODULE!r}, fromlist=['_']).save({self._kernel_path()!r}, "
            f"{self.var_cap_bytes}, {self.total_cap_bytes}, {budget})"
        )
        try:
            report = await self._run(
                sandbox.run_silent, code, interrupt=sandbox, timeout_s=timeout_s
            )
        except BaseException:  # cancelled part-way: the change is still unsaved
            self.dirty = True
            raise
        self.last_save = report
        if report.get("ok"):
            self.saves += 1
            skipped = [e.get("name") for e in report.get("skipped", [])]
            log.debug("snapshot of %s: %s saved, skipped %s", self.directory.name,
                      len(report.get("saved", [])), skipped)  # fmt: skip
        else:
            self.dirty = True
            level = logging.DEBUG if report.get("error") == NOT_PREPARED else logging.WARNING
            log.log(level, "snapshot of %s failed: %s", self.directory.name, report.get("error"))
        return report

    async def flush(self, sandbox: Sandbox) -> None:
        """Before the sandbox stops: the debounce timer goes, a changed namespace is saved."""
        await self.cancel()
        if self.dirty and self.keep():
            await self.save(sandbox, timeout_s=SNAPSHOT_STOP_TIMEOUT_S)

    async def cancel(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and not timer.done():
            timer.cancel()
            await asyncio.wait({timer})

    def discard(self) -> None:
        """The session is deleted: its snapshots go with it."""
        shutil.rmtree(self.directory, ignore_errors=True)

    async def _run(
        self,
        run: SilentRunner,
        code: str,
        *,
        interrupt: Sandbox | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            async with asyncio.timeout(limit):
                reply = await run(
                    code,
                    user_expressions=REPORT_EXPRESSIONS,
                    timeout_s=limit + RUNNER_TIMEOUT_SLACK_S,
                )
        except TimeoutError:
            if interrupt is not None:  # stop the kernel's work, or the next cell waits for it
                with contextlib.suppress(SandboxError):
                    await interrupt.interrupt()
            return {"ok": False, "error": f"no answer within {limit:g} s"}
        except SandboxError as exc:
            return {"ok": False, "error": str(exc)}
        return _report(reply)


class KeptSandbox(Sandbox):
    """A session's sandbox whose namespace is kept (see the module docstring).

    ``lost`` becomes True when an execution fails and the sandbox is no longer alive: the
    supervisor then starts a new sandbox for the next cell, and the namespace is revived there.
    """

    def __init__(self, inner: Sandbox, keeper: NamespaceKeeper):
        self.inner = inner
        self.keeper = keeper
        self.lost = False
        inner.after_kernel_start = keeper.after_kernel_start
        keeper.kernel_directory = inner.kernel_snapshot_dir  # this sandbox's view of it

    @property
    def ref(self) -> SandboxRef:
        return self.inner.ref

    @ref.setter
    def ref(self, value: SandboxRef) -> None:
        self.inner.ref = value

    async def execute(
        self,
        code: str,
        *,
        timeout_s: float,
        cell_id: str,
        on_output: OutputListener | None = None,
    ) -> CellResult:
        try:
            result = await self.inner.execute(
                code, timeout_s=timeout_s, cell_id=cell_id, on_output=on_output
            )
        except asyncio.CancelledError:
            self.keeper.cell_done(self)  # interrupted part-way: it may have changed things
            raise
        except SandboxError as exc:
            if await self.inner.is_alive():
                raise
            self.lost = True
            with contextlib.suppress(Exception):
                await self.inner.stop()
            raise SandboxError(
                f"{exc}; this sandbox is gone: the next cell starts a new one, with the "
                "namespace revived from its last snapshot"
            ) from exc
        notice = self.keeper.take_notice()
        if notice:
            result.notice = merge_notice(result.notice, notice)
            result.kernel_restarted = True
        self.keeper.cell_done(self)
        return result

    async def run_silent(
        self, code: str, *, user_expressions: Mapping[str, str] | None = None, timeout_s: float
    ) -> dict[str, Any]:
        return await self.inner.run_silent(
            code, user_expressions=user_expressions, timeout_s=timeout_s
        )

    async def interrupt(self) -> None:
        await self.inner.interrupt()

    async def restart_kernel(self) -> None:
        await self.inner.restart_kernel()

    async def is_alive(self) -> bool:
        return not self.lost and await self.inner.is_alive()

    async def info(self) -> SandboxInfo:
        return await self.inner.info()

    async def stop(self) -> None:
        """A last snapshot when the namespace changed (not for a deleted session), then stop."""
        if not self.lost:
            await self.keeper.flush(self.inner)
        else:
            await self.keeper.cancel()
        await self.inner.stop()
        if not self.keeper.keep():
            self.keeper.discard()
