"""Events as a person reads them (``attach``, ``observe``, ``--resume`` without a task).

One block per event: who said what, the code of each ``ipython`` call, the first lines of each
result. Usage rows are left out (``prime-agent usage`` has them). Long texts are cut at
``RENDER_MAX_LINES`` lines of at most ``RENDER_MAX_LINE_CHARS`` characters each, with a marker
saying how much was left out.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Final, TextIO

__all__ = ["RENDER_MAX_LINES", "RENDER_MAX_LINE_CHARS", "EventPrinter", "render_event"]

RENDER_MAX_LINES: Final = 20
RENDER_MAX_LINE_CHARS: Final = 200
_INDENT: Final = "  "
_RESULT_BAR: Final = "  │ "


def _clip(text: str, prefix: str) -> list[str]:
    lines = text.rstrip("\n").splitlines() or [""]
    shown = [
        prefix
        + (line if len(line) <= RENDER_MAX_LINE_CHARS else line[:RENDER_MAX_LINE_CHARS] + "…")
        for line in lines[:RENDER_MAX_LINES]
    ]
    if len(lines) > RENDER_MAX_LINES:
        shown.append(f"{prefix}[… {len(lines) - RENDER_MAX_LINES} more lines]")
    return shown


def _code_of(arguments: str) -> str:
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get("code"), str):
        return str(parsed["code"])
    return arguments


def _speaker(payload: dict[str, Any]) -> str:
    source = payload.get("source", "user")
    if source == "parent":
        return "task from parent"
    if source == "agent":
        return f"message from {payload.get('sender_label') or payload.get('sender') or 'agent'}"
    if source == "harness":
        return "harness"
    return "user"


def render_event(event: dict[str, Any]) -> list[str]:
    """The lines for one event (none for those a reader does not need)."""
    kind = event.get("type")
    payload = event.get("payload") or {}
    if kind == "user_message":
        if payload.get("notice_ids"):
            return []  # subagent notices on their way to the model: each was shown already
        return [f"» {_speaker(payload)}:", *_clip(str(payload.get("text", "")), _INDENT)]
    if kind == "assistant_message":
        lines: list[str] = []
        text = str(payload.get("text", ""))
        if text.strip():
            lines += ["« assistant:", *_clip(text, _INDENT)]
        if payload.get("fenced"):
            return lines  # the code is in the text already
        for call in payload.get("tool_calls") or []:
            code = _code_of(str(call.get("arguments", "")))
            lines += [f"» {call.get('name', 'tool')}:", *_clip(code, _INDENT)]
        return lines
    if kind == "tool_result":
        mark = "✗" if payload.get("is_error") else "✓"
        status = payload.get("status", "ok")
        head = f"{_INDENT}{mark} result" + ("" if status == "ok" else f" ({status})")
        return [head, *_clip(str(payload.get("text", "")), _RESULT_BAR)]
    if kind == "retry":
        return [f"{_INDENT}↻ retry {payload.get('attempt')}: {payload.get('reason', '')}"]
    if kind == "error":
        return [f"{_INDENT}✗ error ({payload.get('kind', '')}): {payload.get('message', '')}"]
    if kind == "notice":
        return ["· notice:", *_clip(str(payload.get("text", "")), _INDENT)]
    if kind == "aborted":
        return [f"· aborted ({payload.get('reason', '')})"]
    if kind == "run_end":
        return [f"· run ended: {payload.get('reason', '')}"]
    return []  # usage rows and types a newer daemon adds


class EventPrinter:
    """Prints events readably; in a family, each line of a non-root session carries its label."""

    def __init__(self, out: TextIO | None = None, *, root: str | None = None):
        self.out = out or sys.stdout
        self.root = root
        self.labels: dict[str, str] = {}

    def __call__(self, event: dict[str, Any]) -> None:
        lines = render_event(event)
        if not lines:
            return
        session = str(event.get("session_id", ""))
        if self.root is not None and session != self.root:
            label = f"[{self.labels.get(session, session)}] "
            lines = [label + line for line in lines]
        self.out.write("\n".join(lines) + "\n")
        self.out.flush()

    def gap(self, session: str, skipped: int) -> None:
        self.out.write(f"· … {skipped} earlier events of {session} not shown\n")
        self.out.flush()
