"""Read-only screens: the usage tree (/usage), the event tree (/tree) and help (/help)."""

from __future__ import annotations

from typing import Any, ClassVar, Final

from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from orchestrator.api import ApiCommandError, ConnectionClosed
from tui import format as fmt
from tui import slash
from tui.screen_host import ScreenHost, host_of

__all__ = ["HELP_KEYS", "HelpScreen", "TreeScreen", "UsageScreen", "usage_table"]

USAGE_NAME_CHARS: Final = 32
USAGE_NAME_MIN_CHARS: Final = 8
# Everything on a usage row but the name: status and the six numbers with their gaps.
USAGE_FIXED_CHARS: Final = 66
USAGE_STATUS_CHARS: Final = 9
# Numeric columns and the width each needs ("12.3k", "$0.0042", "unknown", "3m 05s").
USAGE_NUMBER_COLUMNS: Final = (
    ("own tok", 7),
    ("own $", 7),
    ("tree tok", 8),
    ("tree $", 7),
    ("model", 6),
    ("wall", 6),
)
TREE_INDENT: Final = "  "
# The keys listed by /help (docs/tui.md has the full table).
HELP_KEYS: Final = (
    ("Enter", "send (a steer while a turn runs)"),
    ("Alt-Enter / Ctrl-J", "queue a follow-up"),
    ("Esc", "abort the turn / back"),
    ("↑ ↓", "input history"),
    ("Tab", "complete a slash command"),
    ("← (empty input)", "Agents View"),
    ("Ctrl-G", "this session's subagents"),
    ("Ctrl-S", "sandbox inspector"),
    ("Ctrl-O", "expand / collapse REPL cells"),
    ("Ctrl-Q", "quit (sessions keep running)"),
)


class _Panel(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,left,q", "back", "Back")]

    @property
    def tui(self) -> ScreenHost:
        return host_of(self)

    def action_back(self) -> None:
        self.tui.close_screen(self)


def usage_table(nodes: list[dict[str, Any]], width: int) -> Table:
    """Own and total tokens, cost and time per session, children indented under parents,
    fitted to ``width`` columns (names are cut; numbers never are)."""
    name_chars = max(USAGE_NAME_MIN_CHARS, min(USAGE_NAME_CHARS, width - USAGE_FIXED_CHARS))
    table = Table(box=None, padding=(0, 1), show_edge=False, pad_edge=False)
    table.add_column("session", no_wrap=True)
    table.add_column(
        "status",
        no_wrap=True,
        overflow="ellipsis",
        min_width=USAGE_STATUS_CHARS,
        max_width=USAGE_STATUS_CHARS,
    )
    for name, width in USAGE_NUMBER_COLUMNS:
        table.add_column(name, justify="right", no_wrap=True, min_width=width)

    def add(node: dict[str, Any], depth: int) -> None:
        own, total = node.get("own") or {}, node.get("total") or {}
        indent = TREE_INDENT * depth
        name = str(node.get("name") or node.get("session_id"))
        table.add_row(
            indent + fmt.first_line(name, max(1, name_chars - len(indent))),
            str(node.get("status", "")),
            fmt.tokens(int(own.get("tokens", 0))),
            fmt.cost(own.get("cost_usd"), int(own.get("unknown_cost_calls", 0))),
            fmt.tokens(int(total.get("tokens", 0))),
            fmt.cost(total.get("cost_usd"), int(total.get("unknown_cost_calls", 0))),
            fmt.duration(float(total.get("model_ms", 0.0)) / 1000),
            fmt.duration(float(total.get("wall_s", 0.0))),
        )
        for child in node.get("children") or []:
            add(child, depth + 1)

    for node in nodes:
        add(node, 0)
    return table


class _SessionPanel(_Panel):
    """A panel about one session, showing the ``nodes`` it loaded from the daemon."""

    def __init__(self, session_id: str):
        super().__init__()
        self.session_id = session_id
        self.nodes: list[dict[str, Any]] = []


class UsageScreen(_SessionPanel):
    """The session tree's usage: own and total tokens, cost and time (get_usage)."""

    def compose(self) -> ComposeResult:
        yield Static(
            Text("Usage (own: this session; tree: with its subagents)", style="bold"),
            classes="screen-title",
        )
        with VerticalScroll():
            yield Static(id="usage-table")
        yield Footer()

    async def on_mount(self) -> None:
        try:
            got = await self.tui.link.call("get_usage", session=self.session_id, tree=True)
        except (ApiCommandError, ConnectionClosed) as exc:
            self.query_one("#usage-table", Static).update(Text(str(exc), style="bold red"))
            return
        self.nodes = list(got.get("usage") or [])
        table = usage_table(self.nodes, self.app.size.width)
        self.query_one("#usage-table", Static).update(table)


class TreeScreen(_SessionPanel):
    """The session's event tree (``tree``); Enter moves the leaf to the highlighted event."""

    def compose(self) -> ComposeResult:
        yield Static(
            Text("Event tree (● active path; Enter branches there)", style="bold"),
            classes="screen-title",
        )
        yield OptionList(id="tree")
        yield Static(id="tree-hint")
        yield Footer()

    async def on_mount(self) -> None:
        await self.load()
        self.query_one("#tree", OptionList).focus()

    async def load(self) -> None:
        nodes: list[dict[str, Any]] = []
        after = 0
        try:
            while True:
                page = await self.tui.link.call("tree", session=self.session_id, after_seq=after)
                got = list(page.get("nodes") or [])
                nodes.extend(got)
                if not got or page.get("next_after") is None:
                    break
                after = int(page["next_after"])
        except (ApiCommandError, ConnectionClosed) as exc:
            self._hint(str(exc), error=True)
            return
        self.nodes = nodes
        depth: dict[int | None, int] = {}
        children: dict[int | None, int] = {}
        for node in nodes:
            children[node.get("parent_seq")] = children.get(node.get("parent_seq"), 0) + 1
        options = []
        for node in nodes:
            parent = node.get("parent_seq")
            level = depth.get(parent, -1) + (1 if children.get(parent, 0) > 1 else 0)
            level = max(level, 0)
            depth[int(node["seq"])] = level
            mark = "●" if node.get("active") else " "
            line = f"{mark} {TREE_INDENT * level}{node['seq']:>4} {node.get('type', '')}"
            line += f"  {node.get('text', '')}"
            options.append(Option(Text(line), id=str(node["id"])))
        tree_list = self.query_one("#tree", OptionList).set_options(options)
        leaf = next((i for i, n in enumerate(nodes) if n.get("seq") == page.get("leaf_seq")), None)
        tree_list.highlighted = leaf  # the cursor starts at the leaf

    def _hint(self, text: str, *, error: bool = False) -> None:
        style = "bold red" if error else "dim"
        self.query_one("#tree-hint", Static).update(Text(text, style=style))

    @on(OptionList.OptionSelected, "#tree")
    async def _branch(self, event: OptionList.OptionSelected) -> None:
        try:
            got = await self.tui.link.call("branch", session=self.session_id, event=event.option.id)
        except (ApiCommandError, ConnectionClosed) as exc:
            self._hint(f"branch: {exc}", error=True)
            return
        self._hint(f"leaf moved to event {got.get('leaf_seq', '')}")
        await self.load()


class HelpScreen(_Panel):
    def compose(self) -> ComposeResult:
        table = Table(box=None, padding=(0, 2), show_header=False)
        table.add_column(style="bold cyan")
        table.add_column()
        for spec in slash.COMMANDS:
            table.add_row(spec.usage, spec.summary)
        table.add_row("", "")
        for key, what in HELP_KEYS:
            table.add_row(key, what)
        yield Static(Text("Help", style="bold"), classes="screen-title")
        with VerticalScroll():
            yield Static(table)
        yield Footer()
