"""A chat's transcript as data: the session's events folded into display items.

Pure (no Textual): ``Transcript.apply`` takes a durable event (as the daemon pushes or replays
it), ``Transcript.stream`` a transient one (``text_delta``, ``tool_start``, ``tool_output``,
``compaction_start``). Durable events are applied once, in cursor order; a later durable event
replaces what streaming guessed (the ``assistant_message`` holds the whole text). The chat
widget renders ``items`` and redraws the ones whose ``version`` changed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

__all__ = ["CELL_OUTPUT_MAX_CHARS", "Item", "ItemKind", "Transcript"]

# An expanded cell shows at most this much of its output (the model saw at most 64 KiB of it;
# the full output is the artifact the tool result names).
CELL_OUTPUT_MAX_CHARS: Final = 8000

ItemKind = Literal["user", "assistant", "thinking", "cell", "notice", "error"]

# Durable events that only matter to the accounting or the tree, not to a reader of the chat.
_SILENT: Final = frozenset({"usage", "turn_end", "run_end", "custom"})


@dataclass
class Item:
    """One thing on screen. ``version`` goes up whenever the item changes."""

    kind: ItemKind
    key: str  # stable: an event id, or a tool call id for cells
    text: str = ""  # user/assistant/notice/error text; for cells the code
    label: str = ""  # user: who wrote it ("you", "parent", "child worker-1"); cell: status
    output: str = ""  # cells: what the model was shown
    duration_ms: float | None = None  # cells
    streaming: bool = False  # assistant text still arriving
    version: int = 0

    def touch(self) -> None:
        self.version += 1


@dataclass
class Transcript:
    items: list[Item] = field(default_factory=list)
    cursor: int = 0  # the newest durable event applied
    _by_key: dict[str, Item] = field(default_factory=dict)

    def clear(self) -> None:
        self.items.clear()
        self._by_key.clear()
        self.cursor = 0

    def _add(self, item: Item) -> Item:
        self.items.append(item)
        self._by_key[item.key] = item
        return item

    def _streaming(self, kind: ItemKind = "assistant") -> Item | None:
        last = self.items[-1] if self.items else None
        if last is not None and last.streaming and last.kind == kind:
            return last
        return None

    def _thinking_before_stream(self) -> Item | None:
        """A streamed reasoning item whose answer is streaming after it (not yet stored)."""
        if len(self.items) < 2 or self._streaming() is None:
            return None
        before = self.items[-2]
        return before if before.kind == "thinking" and before.key.startswith("stream-") else None

    # ---------------------------------------------------------------------------- transient

    def stream(self, event: dict[str, Any], after: int | None = None) -> Item | None:
        """A transient event; returns the item it changed (None: nothing to show).

        ``after`` is the cursor of the session's newest durable event when the daemon emitted
        it. Below ours, a durable event we applied since already holds what it previews: an
        attach's replay can hold the whole answer whose deltas were pushed while the replay
        was read. Shown, they would start a second copy of that answer."""
        if after is not None and after < self.cursor:
            return None
        kind = event.get("type")
        if kind == "thinking_delta":  # the model's reasoning, before its answer
            item = self._streaming("thinking")
            if item is None:
                item = self._add(Item("thinking", f"stream-{len(self.items)}", streaming=True))
            item.text += str(event.get("delta", ""))
            item.touch()
            return item
        if kind == "text_delta":
            thinking = self._streaming("thinking")
            if thinking is not None:  # the answer starts: its reasoning is complete
                thinking.streaming = False
                thinking.touch()
            item = self._streaming()
            if item is None:
                item = self._add(Item("assistant", f"stream-{len(self.items)}", streaming=True))
            item.text += str(event.get("delta", ""))
            item.touch()
            return item
        if kind == "tool_start":
            cell = self._by_key.get(str(event.get("tool_call_id", "")))
            if cell is not None and cell.kind == "cell":
                cell.label = "running"
                cell.touch()
                return cell
        if kind == "tool_output":  # a running cell's output as it comes; its result replaces it
            cell = self._by_key.get(str(event.get("tool_call_id", "")))
            if cell is not None and cell.kind == "cell" and cell.label == "running":
                room = CELL_OUTPUT_MAX_CHARS - len(cell.output)
                if room > 0:
                    cell.output += str(event.get("delta", ""))[:room]
                    cell.touch()
                return cell
        return None

    # ---------------------------------------------------------------------------- durable

    def apply(self, event: dict[str, Any], cursor: int | None = None) -> list[Item]:
        """A durable event; returns the items it added or changed. Events at or below the
        cursor already applied are ignored (a replay and a live push may overlap)."""
        seq = cursor if cursor is not None else event.get("seq")
        if isinstance(seq, int):
            if seq <= self.cursor:
                return []
            self.cursor = seq
        kind = str(event.get("type", ""))
        payload = event.get("payload") or {}
        key = str(event.get("id") or f"seq-{seq}")
        if kind in _SILENT:
            return []
        handler = _HANDLERS.get(kind)
        if handler is None:
            return [self._add(Item("notice", key, text=kind.replace("_", " ")))]
        return handler(self, key, payload)

    def _user(self, key: str, p: dict[str, Any]) -> list[Item]:
        if p.get("notice_ids"):
            return []  # subagent notices batched for the model: each notice item is shown
        source = p.get("source", "user")
        label = {"user": "you", "parent": "task", "harness": "harness"}.get(source, "")
        if source == "agent":
            label = str(p.get("sender_label") or p.get("sender") or "agent")
        return [self._add(Item("user", key, text=str(p.get("text", "")), label=label))]

    def _assistant(self, key: str, p: dict[str, Any]) -> list[Item]:
        changed: list[Item] = []
        text = str(p.get("text", ""))
        thought = str(p.get("thinking") or "")
        thinking = self._streaming("thinking") or self._thinking_before_stream()
        if thinking is not None:  # what the deltas built: the stored reasoning replaces it
            del self._by_key[thinking.key]
            thinking.key, thinking.streaming = f"{key}:thinking", False
            thinking.text = thought or thinking.text
            self._by_key[thinking.key] = thinking
            thinking.touch()
            changed.append(thinking)
        elif thought.strip():
            changed.append(self._add(Item("thinking", f"{key}:thinking", text=thought)))
        streamed = self._streaming()
        if streamed is not None:
            # The durable text replaces what the deltas built (they may have been dropped).
            del self._by_key[streamed.key]
            streamed.key, streamed.text, streamed.streaming = key, text, False
            self._by_key[key] = streamed
            streamed.touch()
            changed.append(streamed)
        elif text.strip():
            changed.append(self._add(Item("assistant", key, text=text)))
        for call in p.get("tool_calls") or []:
            code = _code_of(str(call.get("arguments", "")))
            cell = Item("cell", str(call.get("id", key)), text=code, label="queued")
            changed.append(self._add(cell))
        if p.get("stop_reason") == "error" and not changed:
            changed.append(self._add(Item("error", key, text="the model call failed")))
        return changed

    def _tool_result(self, key: str, p: dict[str, Any]) -> list[Item]:
        call_id = str(p.get("tool_call_id", ""))
        cell = self._by_key.get(call_id)
        if cell is None or cell.kind != "cell":
            cell = self._add(Item("cell", call_id or key, text=""))
        status = str(p.get("status", "ok"))
        cell.label = "error" if p.get("is_error") and status == "ok" else status
        cell.output = str(p.get("text", ""))[:CELL_OUTPUT_MAX_CHARS]
        cell.duration_ms = float(p.get("duration_ms") or 0.0)
        cell.touch()
        return [cell]

    def _error(self, key: str, p: dict[str, Any]) -> list[Item]:
        text = f"{p.get('kind', 'error')}: {p.get('message', '')}"
        return [self._add(Item("error", key, text=text))]

    def _notice(self, key: str, text: str) -> list[Item]:
        return [self._add(Item("notice", key, text=text))]


def _code_of(arguments: str) -> str:
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get("code"), str):
        return str(parsed["code"])
    return arguments


def _compaction(t: Transcript, key: str, p: dict[str, Any]) -> list[Item]:
    before, after = p.get("tokens_before", 0), p.get("tokens_after", 0)
    return t._notice(key, f"context compacted ({p.get('reason', '')}): {before} → {after} tokens")


def _gate(t: Transcript, key: str, p: dict[str, Any]) -> list[Item]:
    verdict = "skipped" if p.get("skipped") else ("passed" if p.get("passed") else "failed")
    item = Item("notice" if p.get("passed") else "error", key)
    item.text = f"gate {verdict}: {p.get('command', '')}"
    return [t._add(item)]


def _stop(t: Transcript, key: str, p: dict[str, Any]) -> list[Item]:
    detail = f" — {p['detail']}" if p.get("detail") else ""
    return t._notice(key, f"autonomous run stopped: {p.get('reason', '')}{detail}")


_Handler = Callable[[Transcript, str, dict[str, Any]], list[Item]]
_HANDLERS: Final[dict[str, _Handler]] = {
    "user_message": Transcript._user,
    "assistant_message": Transcript._assistant,
    "tool_result": Transcript._tool_result,
    "error": Transcript._error,
    "notice": lambda t, k, p: t._notice(k, str(p.get("text", ""))),
    "aborted": lambda t, k, p: t._notice(k, f"aborted ({p.get('reason', '')})"),
    "retry": lambda t, k, p: t._notice(
        k, f"retry {p.get('attempt', '')} in {p.get('delay_s', 0):.1f}s: {p.get('reason', '')}"
    ),
    "compaction": _compaction,
    "model_change": lambda t, k, p: t._notice(k, f"model: {p.get('model', '')}"),
    "branch_summary": lambda t, k, p: t._notice(k, f"branch summary: {p.get('summary', '')}"),
    "gate_result": _gate,
    "autonomous_stop": _stop,
    "goal_update": lambda t, k, p: t._notice(
        k, f"goal {p.get('status', '')}: {p.get('objective', '')}"
    ),
    "schedule_tick": lambda t, k, p: t._notice(
        k, f"schedule {p.get('label') or p.get('schedule_id', '')}: {p.get('status', '')}"
    ),
}
