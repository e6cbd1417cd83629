"""The Agents View: sessions grouped Running / Idle / Inactive, recursively by parent.

The top level lists root sessions; → on a row lists that session's subagents, and so on down
the tree (← or Esc goes back up). Enter opens the row's chat, Space composes a message to it
(any state: an inactive session is woken, a busy one queues it), `i` opens its sandbox
inspector, `/` searches by name. The list is refreshed from ``list_sessions`` every
``REFRESH_S``; the highlighted session stays highlighted across refreshes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Final

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Input, OptionList, Static
from textual.widgets.option_list import Option

from orchestrator.api import ApiCommandError, ConnectionClosed
from tui import format as fmt
from tui.chat import REFRESH_S
from tui.screen_host import ScreenHost, host_of

__all__ = ["GROUPS", "AgentsScreen", "ComposeScreen", "group_of", "row_text"]

GROUPS: Final = ("Running", "Idle", "Inactive")
# The view lists at most this many sessions of its scope (the newest); the rest are counted.
AGENTS_LIST_MAX: Final = 500
NAME_MIN_CHARS: Final = 16
# Width taken by everything on a row except the name: depth and backend (11), tokens (11),
# cost (9), status (9), last activity (9), spaces and the list's scrollbar and padding.
ROW_FIXED_CHARS: Final = 58
AGO_CHARS: Final = 9
NAME_MAX_CHARS: Final = 60


def group_of(row: dict[str, Any]) -> str:
    status = row.get("status")
    if status == "running":
        return "Running"
    # Loaded and waiting (a failed turn leaves a session loaded and able to take input).
    if status == "idle" or (row.get("live") and status not in ("aborted", "deleted")):
        return "Idle"
    return "Inactive"


def row_text(row: dict[str, Any], width: int, now: datetime) -> Text:
    """One session on one line, fitted to ``width`` columns."""
    name_chars = max(NAME_MIN_CHARS, min(NAME_MAX_CHARS, width - ROW_FIXED_CHARS))
    name = fmt.first_line(str(row.get("name") or row.get("id")), name_chars)
    total = (row.get("usage") or {}).get("total") or {}
    status = str(row.get("status", ""))
    if status == "running" and row.get("activity") not in (None, "idle", "turn"):
        status = str(row["activity"])
    elif status not in ("running", "idle") and status != "inactive":
        status = status[:8]
    text = Text()
    text.append(f"{name:<{name_chars}} ", style="bold")
    text.append(f"d{row.get('depth', 0)} {row.get('backend') or ''!s:<7} ", style="dim")
    text.append(f"{fmt.tokens(int(total.get('tokens', 0))):>6} tok ")
    text.append(f"{fmt.cost(total.get('cost_usd'), int(total.get('unknown_cost_calls', 0))):>8} ")
    text.append(f"{status:<8} ", style="cyan" if status == "running" else "")
    text.append(f"{fmt.ago(row.get('last_activity'), now):>{AGO_CHARS}}", style="dim")
    if int(row.get("pending") or 0):
        text.append(f" +{row['pending']} queued", style="yellow")
    return text


class ComposeScreen(ModalScreen[str | None]):
    """One line to send to a session; Enter sends, Esc cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, target: str):
        super().__init__()
        self.target = target

    def compose(self) -> ComposeResult:
        with Vertical(id="compose"):
            yield Static(Text(f"Message to {self.target}", style="bold"))
            yield Input(placeholder="queued if it is busy; Enter sends, Esc cancels", id="message")

    def on_mount(self) -> None:
        self.query_one("#message", Input).focus()

    @on(Input.Submitted, "#message")
    def _send(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class AgentsScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("right", "drill", "Subagents"),
        Binding("left,escape", "back", "Back"),
        Binding("space", "compose", "Message"),
        Binding("i", "inspect", "Sandbox"),
        Binding("slash", "search", "Search"),
    ]

    def __init__(self, parent: str | None = None, parent_name: str | None = None):
        super().__init__()
        self.parent_id = parent
        self.parent_name = parent_name
        self.rows: list[dict[str, Any]] = []
        self.total = 0  # sessions in this scope, listed or not
        self.query_text = ""
        self._refreshing = False

    @property
    def tui(self) -> ScreenHost:
        return host_of(self)

    def compose(self) -> ComposeResult:
        title = "Agents" if self.parent_id is None else f"Subagents of {self.parent_name}"
        yield Static(Text(title, style="bold"), id="agents-title")
        yield Input(placeholder="/ search by name", id="search")
        yield OptionList(id="agents")
        yield Static(id="agents-hint")
        yield Footer()

    async def on_mount(self) -> None:
        self.query_one("#agents", OptionList).focus()
        self.set_interval(REFRESH_S, self.reload)
        await self.reload()

    async def reload(self) -> None:
        if self._refreshing:
            return
        self._refreshing = True
        scope: dict[str, Any] = (
            {"roots_only": True} if self.parent_id is None else {"parent": self.parent_id}
        )
        try:
            listed = await self.tui.link.call("list_sessions", limit=AGENTS_LIST_MAX, **scope)
        except (ApiCommandError, ConnectionClosed) as exc:
            self._say(str(exc))
            return
        finally:
            self._refreshing = False
        self.rows = list(listed.get("sessions") or [])
        self.total = int(listed.get("total", len(self.rows)))
        self._draw()

    def visible_rows(self) -> list[dict[str, Any]]:
        """The rows shown, in display order (groups, then activity)."""
        needle = self.query_text.lower()
        rows = [r for r in self.rows if needle in str(r.get("name") or r.get("id")).lower()]
        out: list[dict[str, Any]] = []
        for group in GROUPS:
            members = [r for r in rows if group_of(r) == group]
            if group == "Running":
                members.sort(key=lambda r: str(r.get("created_at", "")))
            else:
                members.sort(key=lambda r: str(r.get("last_activity") or ""), reverse=True)
            out.extend(members)
        return out

    def _draw(self) -> None:
        options = self.query_one("#agents", OptionList)
        selected = self.selected_id()
        width = max(self.app.size.width, NAME_MIN_CHARS + ROW_FIXED_CHARS)
        now = self.tui.now()
        rows = self.visible_rows()
        content: list[Option | None] = []
        for group in GROUPS:
            members = [r for r in rows if group_of(r) == group]
            header = Text(f"{group} ({len(members)})", style="bold underline")
            content.append(Option(header, id=f"group-{group}", disabled=True))
            content.extend(Option(row_text(r, width, now), id=str(r["id"])) for r in members)
        options.set_options(content)
        ids = [str(r["id"]) for r in rows]
        if selected in ids:
            options.highlighted = _index_of(options, selected)
        elif ids:
            options.highlighted = _index_of(options, ids[0])
        if not self.rows:
            self._say("no sessions yet" if self.parent_id is None else "no subagents")
        elif self.total > len(self.rows):
            self._say(f"the newest {len(self.rows)} of {self.total} (prime-agent agents lists all)")

    def selected_id(self) -> str | None:
        options = self.query_one("#agents", OptionList)
        option = options.highlighted_option
        if option is None or option.id is None or option.id.startswith("group-"):
            return None
        return option.id

    def _selected_row(self) -> dict[str, Any] | None:
        sid = self.selected_id()
        return next((r for r in self.rows if r.get("id") == sid), None)

    def _say(self, text: str) -> None:
        self.query_one("#agents-hint", Static).update(Text(text, style="dim"))

    @on(OptionList.OptionSelected, "#agents")
    def _open(self, event: OptionList.OptionSelected) -> None:
        if event.option.id is not None and not event.option.id.startswith("group-"):
            self.tui.open_chat(event.option.id, replace=True)

    @on(Input.Changed, "#search")
    def _search(self, event: Input.Changed) -> None:
        self.query_text = event.value.strip()
        self._draw()

    @on(Input.Submitted, "#search")
    def _search_done(self) -> None:
        self.query_one("#agents", OptionList).focus()

    def action_search(self) -> None:
        self.query_one("#search", Input).focus()

    def action_drill(self) -> None:
        row = self._selected_row()
        if row is not None:
            self.tui.open_agents(str(row["id"]), str(row.get("name") or row["id"]))

    def action_back(self) -> None:
        search = self.query_one("#search", Input)
        if search.has_focus and search.value:
            search.value = ""
            self.query_one("#agents", OptionList).focus()
            return
        self.tui.close_screen(self)

    def action_inspect(self) -> None:
        sid = self.selected_id()
        if sid is not None:
            self.tui.open_inspector(sid)

    def action_compose(self) -> None:
        row = self._selected_row()
        if row is None:
            return
        sid = str(row["id"])

        async def send(text: str | None) -> None:
            if not text:
                return
            try:
                answer = await self.tui.link.call(
                    "prompt", session=sid, text=text, mode="follow_up"
                )
            except (ApiCommandError, ConnectionClosed) as exc:
                self._say(f"not sent: {exc}")
                return
            self._say(f"sent to {row.get('name') or sid} ({answer.get('status', 'queued')})")
            await self.reload()

        self.app.push_screen(ComposeScreen(str(row.get("name") or sid)), send)


def _index_of(options: OptionList, option_id: str | None) -> int | None:
    if option_id is None:
        return None
    try:
        return options.get_option_index(option_id)
    except Exception:  # the option went away between two refreshes
        return None
