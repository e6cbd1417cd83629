"""``DockerSandbox.info()``: a container as the control API's ``sandbox_info`` shows it.

One inspect, one stats sample and the last log lines, each a blocking docker SDK call, so the
whole of it runs in a thread. ``stats(stream=False, one_shot=True)`` answers at once (without
``one_shot`` the engine waits for a second sample); engines older than API 1.41 do not know
it and get the slower call. Memory is reported as ``docker stats`` does: the cgroup's usage
minus its inactive page cache.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any, Final

from orchestrator.sandbox.base import SANDBOX_LOG_TAIL_LINES, SandboxInfo
from orchestrator.sandbox.docker_owned import docker_errors, translate_error

__all__ = ["container_info", "docker_time"]

NANOSECONDS_PER_SECOND: Final = 1_000_000_000
# Docker's times carry nanoseconds; Python's datetime takes microseconds.
_MICROSECOND_DIGITS: Final = 6
# "0001-01-01T00:00:00Z" is docker's "never" (a container created but not started).
_EARLIEST_YEAR: Final = 1970
# The page cache the kernel may drop at any time, by cgroup version (v1, v2).
_INACTIVE_CACHE_KEYS: Final = ("total_inactive_file", "inactive_file")


def docker_time(text: object) -> datetime | None:
    """A docker API time (``2024-05-01T10:00:00.123456789Z``) as an aware UTC datetime."""
    if not isinstance(text, str) or not text:
        return None
    stamp = text.removesuffix("Z")
    offset = ""
    for sign in ("+", "-"):
        head, found, tail = stamp.rpartition(sign)
        if found and "T" in head and ":" in tail:
            stamp, offset = head, sign + tail
            break
    whole, dot, fraction = stamp.partition(".")
    stamp = whole + (dot + fraction[:_MICROSECOND_DIGITS] if dot else "")
    try:
        parsed = datetime.fromisoformat(stamp + (offset or "+00:00"))
    except ValueError:
        return None
    return parsed.astimezone(UTC) if parsed.year > _EARLIEST_YEAR else None


def _stats(container: Any) -> dict[str, Any]:
    errors = docker_errors()
    try:
        stats = container.stats(stream=False, one_shot=True)
    except errors.InvalidVersion:  # an engine older than API 1.41
        stats = container.stats(stream=False)
    return stats if isinstance(stats, dict) else {}


def _memory(stats: dict[str, Any]) -> tuple[int | None, int | None]:
    memory = stats.get("memory_stats") or {}
    usage = memory.get("usage")
    limit = memory.get("limit")
    if isinstance(usage, int):
        detail = memory.get("stats") or {}
        cache = next((detail[k] for k in _INACTIVE_CACHE_KEYS if k in detail), 0)
        if isinstance(cache, int) and 0 < cache < usage:
            usage -= cache
    return (
        usage if isinstance(usage, int) else None,
        limit if isinstance(limit, int) and limit > 0 else None,
    )


def _logs(container: Any) -> tuple[str, ...]:
    with contextlib.suppress(Exception):  # diagnostics only
        raw = container.logs(tail=SANDBOX_LOG_TAIL_LINES)
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        lines = [line for line in text.splitlines() if line.strip()]
        return tuple(lines[-SANDBOX_LOG_TAIL_LINES:])
    return ()


def container_info(docker: Any, container_id: str, *, running: bool) -> SandboxInfo:
    """The container ``container_id`` (blocking: call it in a thread). ``running`` False (a
    stopped sandbox) or a container that is gone answers with what is known, never raises
    ``NotFound``; another engine failure is a ``SandboxError``."""
    errors = docker_errors()
    if not container_id:
        return SandboxInfo(name="", state="starting" if running else "stopped")
    try:
        container = docker.containers.get(container_id)
    except errors.NotFound:
        return SandboxInfo(name=container_id[:12], state="gone")
    except errors.DockerException as exc:
        raise translate_error(exc, "inspecting a container") from exc
    attrs = container.attrs or {}
    state = attrs.get("State") or {}
    status = str(state.get("Status") or container.status or "unknown")
    cpu: float | None = None
    memory: int | None = None
    limit: int | None = None
    if status == "running":
        try:
            stats = _stats(container)
        except errors.DockerException as exc:
            raise translate_error(exc, "reading a container's stats") from exc
        total = ((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage")
        if isinstance(total, int):
            cpu = total / NANOSECONDS_PER_SECOND
        memory, limit = _memory(stats)
    if limit is None:  # not running: the configured limit
        configured = (attrs.get("HostConfig") or {}).get("Memory")
        limit = configured if isinstance(configured, int) and configured > 0 else None
    return SandboxInfo(
        name=str(attrs.get("Name") or container.name or container_id[:12]).lstrip("/"),
        image=(attrs.get("Config") or {}).get("Image"),
        state="oom-killed" if state.get("OOMKilled") else status,
        started_at=docker_time(state.get("StartedAt")),
        cpu_seconds=cpu,
        memory_bytes=memory,
        memory_limit_bytes=limit,
        log_tail=_logs(container),
    )
