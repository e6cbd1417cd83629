"""Our session events as ACP ``session/update`` payloads (docs/acp.md): pure functions, so the
mapping is tested without a client or a daemon.

- An assistant message's text is an ``agent_message_chunk``; each of its cells (a tool call of
  the ``ipython`` tool, native or fenced) a ``tool_call`` of kind ``execute`` in progress, with
  the source as ``rawInput.code`` and again as a fenced content block (the fence one backtick
  longer than the longest run in the source, so a cell cannot break out of it), titled by its
  first meaningful line (control and bidi characters removed; ``· +N lines`` after it).
- A tool result is a ``tool_call_update``, ``completed`` or ``failed``, whose content repeats
  the cell and adds its output (a client replaces a call's content on update).
- What ACP has no update for travels as a ``session_info_update`` with Prime Agent's ``_meta``
  envelope (``META_NAMESPACE``): compaction, a goal's progress, a subagent's state.

Payloads are camelCase dicts as they go on the wire; ``acp_mode.py`` stamps the turn lifecycle
fields onto each and publishes them in order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "CELL_TITLE_MAX_CHARS",
    "META_NAMESPACE",
    "GateTally",
    "cell_content",
    "cell_title",
    "meta",
    "subagent_update",
    "updates_for_event",
]

META_NAMESPACE: Final = "ai.primeintellect.prime-agent"
CELL_TITLE_MAX_CHARS: Final = 120
IPYTHON_TOOL: Final = "ipython"
# How Prime Agent words a gate that was not run again (the workspace had not changed).
GATE_NOT_RERUN: Final = "not rerun: workspace unchanged since previous failed gate"
GATE_TIMED_OUT: Final = "timed out"
GATE_DID_NOT_START: Final = "the gate could not start"
_UNSAFE_IN_TITLE: Final = re.compile(
    "[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)
_BACKTICKS: Final = re.compile(r"`+")
_MIN_FENCE: Final = 3
_ELLIPSIS: Final = "\u2026"
_DOT: Final = "\u00b7"


def meta(**fields: Any) -> dict[str, Any]:
    """Prime Agent's fields under its reverse-domain key (never at an ACP object's root)."""
    return {META_NAMESPACE: {k: v for k, v in fields.items() if v is not None}}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def cell_title(code: str) -> str:
    """One line that tells this cell from the next."""
    lines = [line.strip() for line in _UNSAFE_IN_TITLE.sub("", code).split("\n") if line.strip()]
    if not lines:
        return "IPython cell"
    title = lines[0]
    if title.startswith("%%") and len(lines) > 1:  # a cell magic: the first real line too
        title = f"{title} {_DOT} {lines[1]}"
    if len(title) > CELL_TITLE_MAX_CHARS:
        title = title[: CELL_TITLE_MAX_CHARS - 1] + _ELLIPSIS
    rest = len(lines) - 1
    return f"{title} {_DOT} +{rest} lines" if rest else title


def cell_content(code: str) -> dict[str, Any]:
    """The source as a fenced block no backtick run inside it can close."""
    longest = max((len(run) for run in _BACKTICKS.findall(code)), default=0)
    fence = "`" * max(_MIN_FENCE, longest + 1)
    return {"type": "content", "content": _text(f"{fence}python\n{code}\n{fence}")}


def _arguments(call: Mapping[str, Any]) -> Any:
    """A call's arguments: stored as the model's raw JSON text (maybe malformed)."""
    raw = call.get("arguments")
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _code_of(arguments: Any) -> str | None:
    if isinstance(arguments, Mapping) and isinstance(arguments.get("code"), str):
        return str(arguments["code"])
    return None


def updates_for_event(event: Mapping[str, Any], cells: dict[str, str]) -> list[dict[str, Any]]:
    """The ACP updates for one of the root's stored events (none for most). ``cells`` keeps
    each running cell's source by call id, so its update can repeat it."""
    kind = event.get("type")
    payload = event.get("payload")
    if not isinstance(payload, Mapping):
        return []
    if kind == "assistant_message":
        found: list[dict[str, Any]] = []
        thinking = str(payload.get("thinking") or "")
        if thinking:  # the model's reasoning, before what it said
            found.append({"sessionUpdate": "agent_thought_chunk", "content": _text(thinking)})
        text = str(payload.get("text") or "")
        if text:  # with the fenced protocol, the prose around the code block
            found.append({"sessionUpdate": "agent_message_chunk", "content": _text(text)})
        for call in payload.get("tool_calls") or []:
            if not isinstance(call, Mapping):
                continue
            call_id = str(call.get("id") or "")
            name = str(call.get("name") or IPYTHON_TOOL)
            arguments = _arguments(call)
            code = _code_of(arguments)
            update: dict[str, Any] = {
                "sessionUpdate": "tool_call",
                "toolCallId": call_id,
                "title": cell_title(code) if code is not None else name,
                "kind": "execute" if name == IPYTHON_TOOL else "other",
                "status": "in_progress",
                "rawInput": {"code": code} if code is not None else arguments,
            }
            if code is not None:
                cells[call_id] = code
                update["content"] = [cell_content(code)]
            found.append(update)
        return found
    if kind == "tool_result":
        call_id = str(payload.get("tool_call_id") or "")
        code = cells.pop(call_id, None)
        content = [cell_content(code)] if code is not None else []
        output = str(payload.get("text") or "")
        if output:
            content.append({"type": "content", "content": _text(output)})
        result: dict[str, Any] = {
            "sessionUpdate": "tool_call_update",
            "toolCallId": call_id,
            "status": "failed" if payload.get("is_error") else "completed",
        }
        if content:
            result["content"] = content
        return [result]
    if kind == "compaction":
        summary = payload.get("summary")
        return [
            {
                "sessionUpdate": "session_info_update",
                "_meta": meta(
                    compaction={"tokensBefore": payload.get("tokens_before"), "summary": summary}
                ),
            }
        ]
    if kind == "goal_update":
        goal = {
            "status": payload.get("status"),
            "objective": payload.get("objective"),
            "tokenBudget": payload.get("token_budget"),
            "tokensUsed": payload.get("tokens_used"),
        }
        return [{"sessionUpdate": "session_info_update", "_meta": meta(goal=goal)}]
    if kind in ("turn_end", "run_end", "aborted"):
        cells.clear()  # a cell that never reported is unreachable now
    return []


def subagent_update(child: Mapping[str, Any]) -> dict[str, Any]:
    """A subagent's state: ``{id, sessionName, status, model, depth, tokenCount, error}``."""
    entry = {
        "id": child.get("id"),
        "sessionName": child.get("sessionName"),
        "status": child.get("status"),
        "model": child.get("model"),
        "depth": child.get("depth"),
        "tokenCount": child.get("tokenCount"),
        "error": child.get("error"),
    }
    return {
        "sessionUpdate": "session_info_update",
        "_meta": meta(subagents=[{k: v for k, v in entry.items() if v is not None}]),
    }


def gate_exit_text(payload: Mapping[str, Any]) -> str:
    """How a failed gate ended, in Prime Agent's words (``exited N``, ``timed out`` ...)."""
    if payload.get("skipped"):
        return GATE_NOT_RERUN
    if payload.get("timed_out"):
        return GATE_TIMED_OUT
    code = payload.get("exit_code")
    if code is None:
        first = str(payload.get("output") or "").strip().splitlines()
        return first[0] if first else GATE_DID_NOT_START
    return f"exited {code}"


@dataclass
class GateTally:
    """The gates of an autonomous prompt turn so far, as the ``autonomous`` ``_meta`` shows
    them: each gate's consecutive failed attempts (a pass resets it) and the last failure."""

    attempts: dict[str, int] = field(default_factory=dict)
    failure: str | None = None  # its exit text
    failure_attempt: int = 0
    failed_command: str | None = None

    def record(self, payload: Mapping[str, Any]) -> None:
        """One ``gate_result`` event."""
        command = str(payload.get("command") or "")
        if payload.get("passed"):
            self.attempts[command] = 0
            if self.failed_command == command:
                self.failure, self.failure_attempt, self.failed_command = None, 0, None
            return
        attempt = int(payload.get("attempt") or 1)
        self.attempts[command] = attempt
        self.failure, self.failure_attempt = gate_exit_text(payload), attempt
        self.failed_command = command

    def meta(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The ``autonomous`` object, with the daemon's counters (``autonomous`` status)."""
        out: dict[str, Any] = {
            "enabled": True,
            "continuationsUsed": int(state.get("continuations") or 0),
            "turnsUsed": int(state.get("turns") or 0),
            "tokensUsed": int(state.get("tokens") or 0),
        }
        attempt = max(self.failure_attempt, 0, *self.attempts.values())
        if attempt:
            out["gateAttempt"] = attempt
        if self.failure is not None:
            out["gateFailure"] = self.failure
        return out
