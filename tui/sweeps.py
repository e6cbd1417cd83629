"""The sweep view (docs/sweeps.md, docs/tui.md): every sweep with its progress, cost and ETA;
a sweep's cells grouped by state. Enter on a cell opens its session's chat, ``i`` its sandbox
inspector. Both refresh every ``REFRESH_S`` from the daemon (``sweep_list``, ``sweep_status``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from orchestrator.api import ApiCommandError, ConnectionClosed
from tui.screen_host import ScreenHost, host_of

__all__ = ["CELL_GROUPS", "REFRESH_S", "SweepScreen", "SweepsScreen", "eta_text", "progress_line"]

REFRESH_S: Final = 2.0
CELL_GROUPS: Final = ("running", "pending", "errored", "unrunnable", "scored")
_SECONDS_PER_MINUTE: Final = 60
_SECONDS_PER_HOUR: Final = 3600
_BAR_CELLS: Final = 20


def eta_text(seconds: float | None) -> str:
    if seconds is None:
        return "ETA –"
    if seconds < 2 * _SECONDS_PER_MINUTE:
        return f"ETA {seconds:.0f}s"
    if seconds < 2 * _SECONDS_PER_HOUR:
        return f"ETA {seconds / _SECONDS_PER_MINUTE:.0f}m"
    return f"ETA {seconds / _SECONDS_PER_HOUR:.1f}h"


def progress_line(sweep: dict[str, Any]) -> str:
    """``[#####-----] 12/40 done · 4 running · 1 failed · $0.0123 · ETA 3m · running``."""
    counts = sweep.get("counts") or {}
    total = int(sweep.get("cells_total") or 0)
    done = int(counts.get("scored", 0))
    filled = round(_BAR_CELLS * done / total) if total else 0
    bar = "#" * filled + "-" * (_BAR_CELLS - filled)
    runner = "running" if sweep.get("runner_alive") else str(sweep.get("state"))
    return (
        f"[{bar}] {done}/{total} done · {counts.get('running', 0)} running · "
        f"{counts.get('errored', 0)} failed · ${float(sweep.get('cost_usd') or 0):.4f} · "
        f"{eta_text(sweep.get('eta_s'))} · {runner}"
    )


class _Refreshing(Screen[None]):
    """A screen that reloads itself every ``REFRESH_S`` (never two loads at once)."""

    def __init__(self) -> None:
        super().__init__()
        self._loading = False

    @property
    def tui(self) -> ScreenHost:
        return host_of(self)

    async def on_mount(self) -> None:
        self.query_one(OptionList).focus()
        self.set_interval(REFRESH_S, self.reload)
        await self.reload()

    async def reload(self) -> None:
        if self._loading:
            return
        self._loading = True
        try:
            await self.load()
        except (ApiCommandError, ConnectionClosed) as exc:
            self.say(str(exc))
        finally:
            self._loading = False

    async def load(self) -> None:
        raise NotImplementedError

    def say(self, text: str) -> None:
        self.query_one(".hint", Static).update(Text(text, style="dim"))

    def action_back(self) -> None:
        self.tui.close_screen(self)


class SweepsScreen(_Refreshing):
    """Every sweep; Enter opens one."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("left,escape", "back", "Back")]

    def __init__(self) -> None:
        super().__init__()
        self.sweeps: list[dict[str, Any]] = []

    def compose(self) -> ComposeResult:
        yield Static(Text("Sweeps", style="bold"), id="sweeps-title")
        yield OptionList(id="sweeps")
        yield Static(classes="hint")
        yield Footer()

    async def load(self) -> None:
        listed = await self.tui.link.call("sweep_list")
        self.sweeps = list(listed.get("sweeps") or [])
        options = self.query_one("#sweeps", OptionList)
        highlighted = options.highlighted
        options.set_options(
            Option(Text(f"{s['name']}  {progress_line(s)}"), id=str(s["name"])) for s in self.sweeps
        )
        if self.sweeps:
            options.highlighted = min(highlighted or 0, len(self.sweeps) - 1)
            self.say("Enter opens a sweep's cells (prime-agent sweep report NAME draws it)")
        else:
            self.say("no sweeps yet: prime-agent sweep run FILE.yaml starts one")

    @on(OptionList.OptionSelected, "#sweeps")
    def _open(self, event: OptionList.OptionSelected) -> None:
        if event.option.id is not None:
            self.app.push_screen(SweepScreen(event.option.id))


def cell_text(cell: dict[str, Any]) -> str:
    score = "–" if cell.get("score") is None else f"{float(cell['score']):.2f}"
    cost = "" if cell.get("cost_usd") is None else f" ${float(cell['cost_usd']):.4f}"
    reason = f" {cell['stop_reason']}" if cell.get("stop_reason") else ""
    return (
        f"{cell['task_id']}  {cell['model']}  {cell['variant']}  seed {cell['seed']}  "
        f"score {score}{cost}{reason}"
    )


class SweepScreen(_Refreshing):
    """One sweep's cells by state; Enter opens a cell's chat, ``i`` its sandbox."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left,escape", "back", "Back"),
        Binding("i", "inspect", "Sandbox"),
    ]

    def __init__(self, name: str) -> None:
        super().__init__()
        self.sweep_name = name
        self.sweep: dict[str, Any] = {}
        self.cells: list[dict[str, Any]] = []

    def compose(self) -> ComposeResult:
        yield Static(Text(f"Sweep {self.sweep_name}", style="bold"), id="sweep-title")
        yield Static(id="sweep-progress")
        yield OptionList(id="cells")
        yield Static(classes="hint")
        yield Footer()

    async def load(self) -> None:
        first = await self.tui.link.call("sweep_status", name=self.sweep_name)
        cells = list(first.get("cells") or [])
        while len(cells) < int(first.get("cells_total") or 0):
            page = await self.tui.link.call("sweep_status", name=self.sweep_name, offset=len(cells))
            if not page.get("cells"):
                break
            cells.extend(page["cells"])
        self.sweep, self.cells = first["sweep"], cells
        self.query_one("#sweep-progress", Static).update(Text(progress_line(self.sweep)))
        self._draw()

    def _draw(self) -> None:
        options = self.query_one("#cells", OptionList)
        selected = self.selected_session()
        content: list[Option] = []
        for group in CELL_GROUPS:
            members = [c for c in self.cells if c.get("state") == group]
            if not members:
                continue
            header = Text(f"{group.capitalize()} ({len(members)})", style="bold underline")
            content.append(Option(header, id=f"group-{group}", disabled=True))
            content.extend(
                Option(Text(cell_text(c)), id=f"cell-{c['fingerprint']}") for c in members
            )
        options.set_options(content)
        ids = [o.id for o in content if o.id and not o.id.startswith("group-")]
        keep = next(
            (
                f"cell-{c['fingerprint']}"
                for c in self.cells
                if c.get("session_id") == selected and selected
            ),
            None,
        )
        target = keep if keep in ids else (ids[0] if ids else None)
        if target is not None:
            options.highlighted = options.get_option_index(target)
        self.say("Enter: the cell's chat · i: its sandbox · ←: back")

    def _selected_cell(self) -> dict[str, Any] | None:
        option = self.query_one("#cells", OptionList).highlighted_option
        if option is None or option.id is None or not option.id.startswith("cell-"):
            return None
        fingerprint = option.id.removeprefix("cell-")
        return next((c for c in self.cells if c["fingerprint"] == fingerprint), None)

    def selected_session(self) -> str | None:
        cell = self._selected_cell()
        return str(cell["session_id"]) if cell and cell.get("session_id") else None

    @on(OptionList.OptionSelected, "#cells")
    def _open(self, event: OptionList.OptionSelected) -> None:
        session = self.selected_session()
        if session is None:
            self.say("this cell has not run yet: no session to open")
            return
        self.tui.open_chat(session)

    def action_inspect(self) -> None:
        session = self.selected_session()
        if session is not None:
            self.tui.open_inspector(session)
