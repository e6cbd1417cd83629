"""The kernel's variables around a compaction, host side (docs/compaction.md, docs/spec.md §5).

Before the summary call the kernel lists its variables with their sizes
(``orchestrator/runtime/namespace.py``, a silent execution), so the summary can name the ones
worth reusing. After a successful compaction, variables over the drop size (16 MiB by default,
``Settings.compaction``) are deleted from the kernel when dropping is on, and the model is told
in the summary message what was dropped and what is still defined. Any failure here (no
sandbox, a busy or dead kernel, a timeout) only means no listing and nothing dropped: it never
fails the compaction.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from orchestrator.errors import SandboxError
from orchestrator.sandbox.base import Sandbox

__all__ = [
    "KERNEL_CALL_TIMEOUT_S",
    "NOTE_MAX_NAMES",
    "KernelVariable",
    "drop_variables",
    "kernel_note",
    "list_variables",
]

log = logging.getLogger(__name__)

_MODULE: Final = "orchestrator.runtime.namespace"
# One listing or drop in the kernel; past it the kernel is interrupted and the step skipped.
KERNEL_CALL_TIMEOUT_S: Final = 30.0
# The silent execution's own limit, a little longer so that ours (which interrupts) fires first.
RUNNER_TIMEOUT_SLACK_S: Final = 5.0
NOTE_MAX_NAMES: Final = 40  # names a note lists; the rest are counted
MIB: Final = 1024**2


@dataclass(frozen=True)
class KernelVariable:
    name: str
    type: str
    bytes: int
    exact: bool
    over: bool  # larger than the drop size

    def describe(self) -> str:
        size = f"{self.bytes / MIB:.1f} MiB" if self.bytes >= MIB else f"{self.bytes} B"
        return f"{self.name} ({self.type}, {'' if self.exact else '≥'}{size})"


def _value(reply: Mapping[str, Any]) -> dict[str, Any] | None:
    value = (reply.get("user_expressions") or {}).get("report") or {}
    if value.get("status") != "ok":
        return None
    try:
        parsed = json.loads(ast.literal_eval(value["data"]["text/plain"]))
    except (KeyError, TypeError, ValueError, SyntaxError):
        return None
    return parsed if isinstance(parsed, dict) and parsed.get("ok") else None


async def _ask(sandbox: Sandbox, expression: str) -> dict[str, Any] | None:
    try:
        async with asyncio.timeout(KERNEL_CALL_TIMEOUT_S):
            reply = await sandbox.run_silent(
                "pass",
                user_expressions={"report": expression},
                timeout_s=KERNEL_CALL_TIMEOUT_S + RUNNER_TIMEOUT_SLACK_S,
            )
    except TimeoutError:
        with contextlib.suppress(SandboxError):
            await sandbox.interrupt()
        log.warning("the kernel did not answer %s within %g s", expression, KERNEL_CALL_TIMEOUT_S)
        return None
    except SandboxError as exc:
        log.info("kernel step skipped: %s", exc)
        return None
    return _value(reply)


async def list_variables(sandbox: Sandbox, cap_bytes: int) -> list[KernelVariable] | None:
    """The kernel's user variables with sizes (None when the kernel could not say)."""
    report = await _ask(sandbox, f"__import__({_MODULE!r}, fromlist=['_']).inventory({cap_bytes})")
    if report is None:
        return None
    out = []
    for row in report.get("variables") or []:
        if isinstance(row, dict) and isinstance(row.get("name"), str):
            out.append(
                KernelVariable(
                    name=row["name"],
                    type=str(row.get("type", "?")),
                    bytes=int(row.get("bytes") or 0),
                    exact=bool(row.get("exact", True)),
                    over=bool(row.get("over")),
                )
            )
    return out


async def drop_variables(sandbox: Sandbox, names: list[str]) -> list[str]:
    """Delete ``names`` from the kernel; the names actually dropped."""
    if not names:
        return []
    report = await _ask(sandbox, f"__import__({_MODULE!r}, fromlist=['_']).drop({names!r})")
    dropped = report.get("dropped") if report is not None else None
    return [str(n) for n in dropped] if isinstance(dropped, list) else []


def _names(items: list[str]) -> str:
    shown = items[:NOTE_MAX_NAMES]
    more = len(items) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def kernel_note(variables: list[KernelVariable], dropped: list[str], *, limit_bytes: int) -> str:
    """What the model reads about its kernel after the compaction."""
    gone = set(dropped)
    kept = [v.name for v in variables if v.name not in gone]
    parts = ["Your IPython kernel kept running through the compaction."]
    if dropped:
        described = [v.describe() for v in variables if v.name in gone]
        parts.append(
            f"Dropped to free memory (over {limit_bytes / MIB:g} MiB): {_names(described)}."
        )
    parts.append(f"Still defined: {_names(kept)}." if kept else "No variables are defined.")
    return " ".join(parts)
