"""The chat screen: one session's transcript, the input, its subagents and the tree's usage.

Keys (docs/tui.md): Enter sends (a steer while a turn runs), Alt-Enter (or Ctrl-J) queues a
follow-up, Esc aborts the turn, ↑/↓ walk the input history, Tab completes a slash command, ←
on an empty input opens the Agents View, Ctrl-G this session's subagents, Ctrl-S the sandbox
inspector, Ctrl-O expands or collapses every REPL cell.

A new chat has no session: the first message creates one (in the TUI's cwd) and attaches it.
Events pushed before the attach answer is applied are held back and then applied in cursor
order, so a replay and a live push never interleave out of order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Final

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.screen import Screen
from textual.suggester import Suggester
from textual.widgets import Footer, Input, Static

from orchestrator.api import ApiCommandError, ConnectionClosed
from tui import format as fmt
from tui import slash
from tui.link import Pushed
from tui.screen_host import ScreenHost, host_of
from tui.transcript import Item, Transcript
from tui.transcript_view import TranscriptView

__all__ = ["REFRESH_S", "ChatScreen"]

# How often the header, the subagent list and the usage line are refreshed from the daemon.
REFRESH_S: Final = 1.0
# At most this many subagents are listed under the input (the Agents View has them all).
SUBAGENTS_SHOWN: Final = 5
SUBAGENT_NAME_CHARS: Final = 28
RUNNING_STATES: Final = frozenset({"running"})


class _Arrived(Message):
    def __init__(self, pushed: Pushed):
        super().__init__()
        self.pushed = pushed


class _SlashSuggester(Suggester):
    """Ghost text for a slash command being typed (→ accepts it, Tab completes)."""

    def __init__(self) -> None:
        super().__init__(use_cache=False, case_sensitive=True)

    async def get_suggestion(self, value: str) -> str | None:
        if not slash.is_slash(value):
            return None
        found = slash.complete(value)
        return found[0] if len(found) == 1 and found[0] != value else None


class ChatScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "abort", "Abort turn"),
        Binding("alt+enter,ctrl+j", "follow_up", "Follow-up", show=False),
        Binding("left", "agents_or_left", "Agents", priority=True, show=False),
        Binding("up", "history(-1)", show=False),
        Binding("down", "history(1)", show=False),
        Binding("tab", "complete", show=False),
        Binding("ctrl+g", "subagents", "Subagents"),
        Binding("ctrl+s", "inspector", "Sandbox"),
        Binding("ctrl+o", "toggle_cells", "Cells"),
    ]

    def __init__(self, session_id: str | None = None):
        super().__init__()
        self.session_id = session_id
        self.transcript = Transcript()
        self.row: dict[str, Any] = {}
        self.children_rows: list[dict[str, Any]] = []
        self.usage: dict[str, Any] = {}
        self._replayed = session_id is None
        self._held: list[Pushed] = []
        self._local = 0
        self._history_at: int | None = None
        self._expanded = False
        self._refreshing = False
        self.streamed = 0  # transient events shown (text deltas, cell starts)

    @property
    def tui(self) -> ScreenHost:
        return host_of(self)

    def compose(self) -> ComposeResult:
        yield Static(id="title")
        yield TranscriptView(id="transcript")
        yield Static(id="hint")
        yield Input(
            placeholder="Message the agent · / for commands · ← agents",
            id="prompt",
            suggester=_SlashSuggester(),
        )
        yield Static(id="subagents")
        yield Static(id="usage")
        yield Footer()

    async def on_mount(self) -> None:
        self.query_one("#prompt", Input).focus()
        self._draw_title()
        if self.session_id is not None:
            await self._attach_session(None)
        self.set_interval(REFRESH_S, self._refresh)
        await self._refresh()

    def on_unmount(self) -> None:
        if self.session_id is not None:
            self.tui.link.unsubscribe(self.session_id, self._pushed)

    # ---------------------------------------------------------------------------- events

    def _pushed(self, pushed: Pushed) -> None:
        self.post_message(_Arrived(pushed))

    async def _attach_session(self, cursor: int | None) -> None:
        assert self.session_id is not None
        self._replayed = False
        answer = await self.tui.link.subscribe(self.session_id, self._pushed, cursor)
        await self._apply_replay(answer)

    async def _apply_replay(self, answer: dict[str, Any]) -> None:
        if answer.get("snapshot"):
            self.transcript.clear()
            self.query_one(TranscriptView).clear_views()
        self.row = dict(answer.get("session") or self.row)
        for event in answer.get("events") or []:
            self.transcript.apply(event)
        self._replayed = True
        held, self._held = self._held, []
        for pushed in held:
            # Stored events the replay already holds are dropped by cursor. Held deltas are
            # dropped: they may belong to an answer the replay has whole, and streamed text is
            # only ever a preview of a stored message.
            if pushed.kind == "event":
                self._take(pushed)
        self._redraw()

    @on(_Arrived)
    async def _arrived(self, message: _Arrived) -> None:
        pushed = message.pushed
        if not self._replayed:
            self._held.append(pushed)
            return
        if pushed.kind == "resync":
            await self._resync(pushed)
            return
        self._take(pushed)
        self._redraw()

    def _take(self, pushed: Pushed) -> None:
        if pushed.kind == "stream":
            if self.transcript.stream(pushed.event, pushed.after) is not None:
                self.streamed += 1
            self.row["status"] = "running"
        elif pushed.kind == "event":
            self.transcript.apply(pushed.event, pushed.cursor)
            kind = pushed.event.get("type")
            if kind in ("turn_end", "run_end", "aborted"):
                self.row["status"] = "idle"
            elif kind in ("user_message", "assistant_message"):
                self.row["status"] = "running"

    async def _resync(self, pushed: Pushed) -> None:
        if pushed.snapshot is not None:
            await self._apply_replay({**pushed.snapshot, "snapshot": True})
            return
        assert self.session_id is not None
        answer = await self.tui.link.call(
            "attach", session=self.session_id, cursor=self.transcript.cursor
        )
        await self._apply_replay(answer)

    def _redraw(self) -> None:
        self.query_one(TranscriptView).sync(self.transcript)
        self._draw_title()

    # ---------------------------------------------------------------------------- status

    async def _refresh(self) -> None:
        if self.session_id is None or self._refreshing:
            return
        self._refreshing = True
        link = self.tui.link
        try:
            got = await link.call("get_session", session=self.session_id)
            self.row.update(got.get("session") or {})
            listed = await link.call("list_sessions", parent=self.session_id)
            self.children_rows = list(listed.get("sessions") or [])
            usage = await link.call("get_usage", session=self.session_id)
            nodes = usage.get("usage") or []
            self.usage = nodes[0] if nodes else {}
        except (ApiCommandError, ConnectionClosed):
            return
        finally:
            self._refreshing = False
        self._draw_title()
        self._draw_subagents()
        self._draw_usage()

    def _draw_title(self) -> None:
        if self.session_id is None:
            title = Text("new chat", style="bold")
            title.append(f"  {self.tui.cwd}", style="dim")
        else:
            row = self.row
            name = row.get("name") or self.session_id
            title = Text(str(name), style="bold")
            status = str(row.get("status", ""))
            activity = row.get("activity")
            if activity and activity != "idle" and status == "running":
                status = f"{status}: {activity}"
            parts = [row.get("model"), row.get("backend"), status]
            title.append("  " + " · ".join(str(p) for p in parts if p), style="dim")
        self.query_one("#title", Static).update(title)

    def _draw_subagents(self) -> None:
        widget = self.query_one("#subagents", Static)
        rows = self.children_rows
        widget.display = bool(rows)
        if not rows:
            return
        text = Text()
        for row in rows[:SUBAGENTS_SHOWN]:
            usage = (row.get("usage") or {}).get("total") or {}
            name = fmt.first_line(str(row.get("name") or row.get("id")), SUBAGENT_NAME_CHARS)
            text.append(f"  ↳ {name:<{SUBAGENT_NAME_CHARS}} ", style="bold")
            text.append(f"{row.get('status', ''):<9}")
            text.append(
                f" {fmt.tokens(int(usage.get('tokens', 0))):>6} tok "
                f"{fmt.cost(usage.get('cost_usd'), int(usage.get('unknown_cost_calls', 0)))}\n",
                style="dim",
            )
        if len(rows) > SUBAGENTS_SHOWN:
            text.append(f"  … {len(rows) - SUBAGENTS_SHOWN} more (Ctrl-G)\n", style="dim")
        text.rstrip()
        widget.update(text)

    def _draw_usage(self) -> None:
        own = self.usage.get("own") or {}
        total = self.usage.get("total") or {}
        line = Text("usage ", style="bold")
        line.append(_usage_part("own", own))
        line.append(" · ")
        line.append(_usage_part("tree", total))
        wall = fmt.duration(float(total.get("wall_s", 0.0)))
        line.append(f" · {wall:>{fmt.DURATION_CHARS}}", style="dim")
        self.query_one("#usage", Static).update(line)

    @property
    def running(self) -> bool:
        return self.row.get("status") in RUNNING_STATES

    # ---------------------------------------------------------------------------- input

    @on(Input.Submitted, "#prompt")
    async def _submitted(self, event: Input.Submitted) -> None:
        await self._send(event.value, "steer" if self.running else "follow_up")

    async def action_follow_up(self) -> None:
        await self._send(self.query_one("#prompt", Input).value, "follow_up")

    async def _send(self, text: str, mode: str) -> None:
        text = text.strip()
        if not text:
            return
        prompt = self.query_one("#prompt", Input)
        prompt.value = ""
        self._hint("")
        self.tui.remember(text)
        self._history_at = None
        if slash.is_slash(text):
            await slash.run_slash(text, self)
            return
        try:
            if self.session_id is None:
                await self._create(text)
            else:
                await self.tui.link.call("prompt", session=self.session_id, text=text, mode=mode)
                self.row["status"] = "running"
                self._draw_title()
        except ApiCommandError as exc:
            self.say(exc.message, error=True)

    async def _create(self, task: str) -> None:
        tui = self.tui
        fields: dict[str, Any] = {"cwd": str(tui.cwd), "task": task}
        if tui.model is not None:
            fields["model"] = tui.model
        if tui.backend is not None:
            fields["backend"] = tui.backend
        if tui.api_base is not None:
            fields["api_base"] = tui.api_base
        created = await tui.link.call("create_session", **fields)
        self.session_id = str(created["session"])
        self.row = {"name": created.get("name"), "model": created.get("model"), "status": "running"}
        self.row["backend"] = created.get("backend")
        if created.get("warning"):
            self.say(str(created["warning"]))
        await self._attach_session(None)
        await self._refresh()

    def action_history(self, step: int) -> None:
        history = self.tui.history
        if not history:
            return
        at = len(history) if self._history_at is None else self._history_at
        at = max(0, min(len(history), at + step))
        self._history_at = at
        prompt = self.query_one("#prompt", Input)
        prompt.value = history[at] if at < len(history) else ""
        prompt.cursor_position = len(prompt.value)

    def action_complete(self) -> None:
        prompt = self.query_one("#prompt", Input)
        if not (prompt.has_focus and slash.is_slash(prompt.value)):
            self.focus_next()
            return
        found = slash.complete(prompt.value)
        if len(found) == 1:
            prompt.value = found[0] + ("" if found[0].endswith(" ") else " ")
            prompt.cursor_position = len(prompt.value)
            self._hint("")
        elif found:
            self._hint("  ".join(found))
        else:
            self._hint("no command matches; /help lists them")

    def action_agents_or_left(self) -> None:
        prompt = self.query_one("#prompt", Input)
        if prompt.has_focus and prompt.value:
            prompt.action_cursor_left()
        elif prompt.has_focus or not isinstance(self.focused, Input):
            self.tui.open_agents(None)

    async def action_abort(self) -> None:
        if self.session_id is None:
            return
        try:
            answer = await self.tui.link.call("abort", session=self.session_id)
        except ApiCommandError as exc:
            self.say(exc.message, error=True)
            return
        self._hint("aborted" if answer.get("aborted") else "nothing to abort")

    def action_subagents(self) -> None:
        if self.session_id is not None:
            self.tui.open_agents(self.session_id)

    def action_inspector(self) -> None:
        if self.session_id is not None:
            self.tui.open_inspector(self.session_id)

    def action_toggle_cells(self) -> None:
        self._expanded = not self._expanded
        self.query_one(TranscriptView).set_expanded(self._expanded)

    def _hint(self, text: str) -> None:
        self.query_one("#hint", Static).update(Text(text, style="dim"))

    # ---------------------------------------------------------------------------- SlashHost

    async def call(self, command_type: str, /, **fields: Any) -> Any:
        return await self.tui.link.call(command_type, **fields)

    def open_agents(self, parent: str | None = None) -> None:
        self.tui.open_agents(parent)

    def open_usage(self) -> None:
        if self.session_id is not None:
            self.tui.open_usage(self.session_id)

    def open_sweeps(self) -> None:
        self.tui.open_sweeps()

    def open_tree(self) -> None:
        if self.session_id is not None:
            self.tui.open_tree(self.session_id)

    def open_help(self) -> None:
        self.tui.open_help()

    def open_session(self, session_id: str) -> None:
        self.tui.open_chat(session_id)

    @property
    def cwd(self) -> Path:
        return self.tui.cwd

    def say(self, text: str, *, error: bool = False) -> None:
        """One line in the chat that is not part of the session (a command's answer)."""
        self._local += 1
        item = Item("error" if error else "notice", f"local-{self._local}", text=text)
        self.transcript.items.append(item)
        self._redraw()


def _usage_part(label: str, totals: dict[str, Any]) -> Text:
    tokens = fmt.tokens(int(totals.get("tokens", 0)))
    cost = fmt.cost(totals.get("cost_usd"), int(totals.get("unknown_cost_calls", 0)))
    return Text(f"{label} {tokens} tok {cost}")
