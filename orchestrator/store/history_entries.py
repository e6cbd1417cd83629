"""An event as ``history`` shows it: a role, a bounded text and where it sits (docs/runtime.md,
"history"; ``HistoryEntry`` in the kernel).

This is the one place a stored event becomes role and text. The kernel's ``history.*``
requests answer with these entries (``sessions/history_service.py``) and the ``/refine``
planner reads the conversation through them (``harness/refine_plan.py``), so both see the same
words for the same event.

One entry's text is at most ``HISTORY_TEXT_MAX_CHARS`` (plus a cut mark at each end that was
cut); for a search hit the excerpt is placed around the match.
"""

from __future__ import annotations

import json
from typing import Any, Final

from orchestrator.store.db import EventRecord

__all__ = ["CUT_MARK", "HISTORY_TEXT_MAX_CHARS", "code_of", "entry_of"]

HISTORY_TEXT_MAX_CHARS: Final = 4000  # one entry's text (a search shows the part that matched)
# A search hit's excerpt starts this share of the excerpt before the match.
MATCH_CONTEXT_SHARE: Final = 4
CUT_MARK: Final = "…"


def code_of(arguments: str) -> str:
    """The ``code`` of a tool call's JSON arguments; the arguments as they are otherwise."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    code = parsed.get("code") if isinstance(parsed, dict) else None
    return code if isinstance(code, str) else arguments


def _role_and_text(event: EventRecord) -> tuple[str, str]:
    p = event.payload
    if event.type == "user_message":
        source = str(p.get("source") or "user")
        if source == "agent":
            return "user", f"[message from {p.get('sender_label') or p.get('sender')}]\n{p['text']}"
        return ("user" if source in ("user", "parent") else source), str(p.get("text", ""))
    if event.type == "assistant_message":
        parts = [str(p.get("text") or "")] if p.get("text") else []
        if not p.get("fenced"):
            for call in p.get("tool_calls") or []:
                parts.append(f"[{call.get('name', 'tool')}]\n{code_of(str(call.get('arguments')))}")
        return "assistant", "\n".join(parts)
    if event.type == "tool_result":
        return "tool", str(p.get("text", ""))
    if event.type in ("compaction", "branch_summary"):
        return "summary", str(p.get("summary", ""))
    if event.type == "error":
        return "error", f"{p.get('kind', '')}: {p.get('message', '')}"
    if event.type == "model_change":
        return "notice", f"model changed to {p.get('model')}"
    if event.type == "aborted":
        return "notice", f"aborted ({p.get('reason', '')})"
    return "notice", str(p.get("text", ""))


def _excerpt(text: str, match: str | None) -> tuple[str, bool]:
    """At most ``HISTORY_TEXT_MAX_CHARS`` of ``text``, around ``match`` when it is found;
    True when something was cut."""
    if len(text) <= HISTORY_TEXT_MAX_CHARS:
        return text, False
    start = 0
    if match:
        found = text.lower().find(match.lower())
        if found > 0:
            start = max(0, found - HISTORY_TEXT_MAX_CHARS // MATCH_CONTEXT_SHARE)
    piece = text[start : start + HISTORY_TEXT_MAX_CHARS]
    head = CUT_MARK if start > 0 else ""
    tail = CUT_MARK if start + HISTORY_TEXT_MAX_CHARS < len(text) else ""
    return f"{head}{piece}{tail}", True


def entry_of(event: EventRecord, match: str | None = None) -> dict[str, Any]:
    """An event as ``history`` shows it (``HistoryEntry`` in the kernel)."""
    role, text = _role_and_text(event)
    shown, truncated = _excerpt(text, match)
    entry: dict[str, Any] = {
        "seq": event.seq,
        "id": event.id,
        "type": event.type,
        "role": role,
        "text": shown,
        "at": event.ts.isoformat(),
    }
    if truncated:
        entry["truncated"] = True
    return entry
