"""The daemon's answers to ``sandbox_info`` and ``sandbox_control`` (docs/protocol.md): a
session's sandbox as the TUI's inspector shows it, and stopping or restarting it.

``sandbox_info`` never wakes a session: one that is not loaded, or has no sandbox up (none
started yet, starting, lost), answers ``sandbox: null``. CPU percent is computed here, in one
place (``CpuMeter``): the sandbox reports the CPU seconds it has used, and the percent is the
share of one CPU over the time since the previous ``sandbox_info`` of that very sandbox. A
kubernetes sandbox's answer also has ``pod`` (``orchestrator/api/sandbox_pod.py``: namespace,
phase, node, restarts, newest events, metrics); its CPU percent is metrics.k8s.io's rate over
the metrics window (no counter to compare), or null without a metrics server.

``sandbox_control`` goes through the orchestrator's own operations: ``stop`` is
``Orchestrator.unload`` (a last namespace snapshot, sandbox stopped, status ``inactive``; input
that arrives while the sandbox stops is handed to the reloaded session, never lost).
``restart`` touches the sandbox only: a loaded session gets a new sandbox through
``Orchestrator.restart_sandbox`` (the namespace revived from the last snapshot,
docs/snapshots.md) and stays loaded, with its context, driver and queued input, and its loaded
descendants keep their sandboxes; an inactive session is loaded and its sandbox started at once.
Both are refused (``busy``) while the session or a loaded descendant is in a turn or has input
waiting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final

from orchestrator.api.errors import ApiCommandError
from orchestrator.api.protocol import JsonObject, SandboxControl
from orchestrator.api.sandbox_pod import SandboxPod, SandboxPodEvent
from orchestrator.api.wire import E_BUSY
from orchestrator.daemon.command_context import CommandContext
from orchestrator.daemon.tree_commands import quiet_family
from orchestrator.errors import SandboxError, SandboxStartError, UserError
from orchestrator.sandbox.base import PodDetails, Sandbox, SandboxInfo, SandboxRef
from orchestrator.sessions.compaction import running_sandbox
from orchestrator.sessions.live import LiveSession
from orchestrator.sessions.manager import TERMINAL_STATES
from orchestrator.sessions.snapshots import KeptSandbox
from orchestrator.store.db import SessionRecord

__all__ = [
    "CPU_SAMPLES_MAX",
    "SANDBOX_INFO_TIMEOUT_S",
    "CpuMeter",
    "sandbox_control",
    "sandbox_info",
    "sandbox_name",
]

log = logging.getLogger(__name__)

# A wedged engine (or /proc read) must not hold the answer longer than this.
SANDBOX_INFO_TIMEOUT_S: Final = 10.0
# The CPU meter remembers at most this many sandboxes (the least recently sampled go first).
CPU_SAMPLES_MAX: Final = 256
PERCENT: Final = 100.0
MILLICORES_PER_CPU: Final = 1000.0
CPU_PERCENT_DECIMALS: Final = 1
SECONDS_DECIMALS: Final = 3


def _key(ref: SandboxRef) -> str:
    return f"{ref.backend}:{ref.ref}"


class CpuMeter:
    """CPU percent of each sandbox since its previous sample (100 = one CPU busy)."""

    def __init__(
        self,
        *,
        max_entries: int = CPU_SAMPLES_MAX,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._max_entries = max_entries
        self._clock = clock
        self._last: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._last)

    def sample(self, key: str, cpu_seconds: float | None) -> float | None:
        """Record ``cpu_seconds`` for ``key`` now; the percent since the previous sample, or
        None for the first one (or when the counter went backwards: another sandbox)."""
        now = self._clock()
        previous = self._last.pop(key, None)
        if cpu_seconds is None:
            return None
        self._last[key] = (now, cpu_seconds)
        while len(self._last) > self._max_entries:
            self._last.popitem(last=False)
        if previous is None:
            return None
        then, used = previous
        elapsed = now - then
        if elapsed <= 0 or cpu_seconds < used:
            return None
        return round((cpu_seconds - used) / elapsed * PERCENT, CPU_PERCENT_DECIMALS)

    def forget(self, key: str) -> None:
        self._last.pop(key, None)


def sandbox_name(live: LiveSession | None) -> str | None:
    """What ``prime-agent agents`` names a loaded session's sandbox by: its recorded ref (a
    pod's name, a container's id, a gateway's pid); None when none is up."""
    sandbox = _up(live)
    if sandbox is None:
        return None
    return sandbox.ref.ref or None


def _up(live: LiveSession | None) -> Sandbox | None:
    """The session's sandbox when one is up (never starts one)."""
    sandbox = running_sandbox(live) if live is not None else None
    if isinstance(sandbox, KeptSandbox) and sandbox.lost:
        return None
    return sandbox


async def _describe(meter: CpuMeter, sandbox: Sandbox) -> JsonObject:
    ref = sandbox.ref
    try:
        async with asyncio.timeout(SANDBOX_INFO_TIMEOUT_S):
            info = await sandbox.info()
    except (SandboxError, TimeoutError) as exc:
        log.warning("sandbox info of %s failed: %s", ref.session_id, exc)
        info = SandboxInfo(name=ref.ref)
    started = info.started_at
    uptime = (datetime.now(UTC) - started).total_seconds() if started is not None else None
    cpu = info.cpu_seconds
    cpu_percent = meter.sample(_key(ref), cpu)
    pod = info.pod
    if pod is not None and pod.cpu_millicores is not None and cpu_percent is None:
        # metrics.k8s.io gives a rate over its window, not a counter to compare.
        cpu_percent = round(pod.cpu_millicores / MILLICORES_PER_CPU * PERCENT, CPU_PERCENT_DECIMALS)
    answer: JsonObject = {
        "backend": ref.backend,
        "name": info.name,
        "ref": ref.ref,
        "image": info.image,
        "state": info.state,
        "started_at": started.isoformat() if started is not None else None,
        "uptime_s": round(max(0.0, uptime), SECONDS_DECIMALS) if uptime is not None else None,
        "cpu_percent": cpu_percent,
        "cpu_seconds": round(cpu, SECONDS_DECIMALS) if cpu is not None else None,
        "memory_bytes": info.memory_bytes,
        "memory_limit_bytes": info.memory_limit_bytes,
        "log_tail": list(info.log_tail),
    }
    if pod is not None:  # only the kubernetes backend's answer has the key
        answer["pod"] = _pod(pod).model_dump(mode="json")
    return answer


def _pod(pod: PodDetails) -> SandboxPod:
    events = [
        SandboxPodEvent(
            at=event.at,
            kind=event.kind,
            reason=event.reason,
            message=event.message,
            count=event.count,
        )
        for event in pod.events
    ]
    return SandboxPod(
        namespace=pod.namespace,
        phase=pod.phase,
        node=pod.node,
        ip=pod.ip,
        restarts=pod.restarts,
        events=events,
        cpu_millicores=pod.cpu_millicores,
        metrics=pod.metrics,
    )


async def sandbox_info(daemon: CommandContext, meter: CpuMeter, rec: SessionRecord) -> JsonObject:
    """``{session, status, sandbox: null | {...}}`` (docs/protocol.md), plus ``sandbox_failed:
    {failures, error}`` while the sandbox is marked failed (its start backoff gave up; the
    session itself stays usable, and its next prompt or a restart tries again)."""
    live = daemon.orch.loaded(rec.id)
    sandbox = _up(live)
    answer: JsonObject = {
        "session": rec.id,
        "status": live.state if live is not None else rec.status,
        "sandbox": await _describe(meter, sandbox) if sandbox is not None else None,
    }
    failure = daemon.orch.sandbox_failure(rec.id) if live is not None else None
    if failure is not None:
        answer["sandbox_failed"] = failure
    return answer


async def sandbox_control(
    daemon: CommandContext, meter: CpuMeter, rec: SessionRecord, command: SandboxControl
) -> JsonObject:
    orch = daemon.orch
    family = quiet_family(daemon, rec.id, f"{command.action} the sandbox of")
    live = orch.loaded(rec.id)
    status = live.state if live is not None else rec.status
    if command.action == "restart" and status in TERMINAL_STATES:
        raise ApiCommandError(E_BUSY, f"session {rec.id} is {status}; it cannot be restarted")
    if command.action == "stop":
        if live is not None:
            await _unload(daemon, meter, live, family)
        after = await daemon.store.get_session(rec.id)
        return {
            "session": rec.id,
            "status": after.status if after is not None else status,
            "sandbox": None,
            "unloaded": live is not None,
        }
    if live is None:
        try:
            live = await orch.load_session_id(rec.id)
        except UserError as exc:  # SessionNotLoadable, or its model cannot be resolved here
            raise ApiCommandError(E_BUSY, f"session {rec.id} cannot be loaded: {exc}") from None
        start = orch.sandbox_of(live)  # started by the load: revived before this returns
    else:
        old = _up(live)
        if old is not None:
            meter.forget(_key(old.ref))
        start = orch.restart_sandbox(live)
    try:
        await start
    except SandboxStartError as exc:
        raise ApiCommandError(E_BUSY, f"the sandbox of {rec.id} did not start: {exc}") from None
    # A restart never unloads: a loaded session stays loaded (only its sandbox is new).
    return {**await sandbox_info(daemon, meter, live.record), "unloaded": False}


async def _unload(
    daemon: CommandContext, meter: CpuMeter, live: LiveSession, family: list[LiveSession]
) -> None:
    """``live`` and its loaded descendants out of memory, as the idle unloader does it."""
    orch = daemon.orch
    for session in family:
        sandbox = _up(session)
        if sandbox is not None:
            meter.forget(_key(sandbox.ref))
    await orch.unload(live)  # a last snapshot, sandboxes stopped, rows inactive
    for session in family:
        orch.forget_sandbox(session.id)  # the next load starts from a clean slate
        # Input that arrived while the sandbox stopped would be lost with the object.
        leftover = orch.take_pending(session)
        if not leftover:
            continue
        try:
            fresh = await orch.load_session_id(session.id)
        except UserError as exc:
            log.warning("input for %s arrived while it was unloaded: lost (%s)", session.id, exc)
            continue
        for item in leftover:
            orch.submit(fresh, item)
