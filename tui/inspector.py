"""The sandbox inspector: one session's sandbox, polled live; stop or restart it.

Shows backend, container / pod / process name, image, state, CPU (over the last poll), memory,
uptime and the newest log lines (``sandbox_info``). `s` stops the sandbox (the session goes
inactive, everything on disk), `r` restarts it (a new sandbox, namespace revived from its
snapshot) through ``sandbox_control``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Final, cast

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from orchestrator.api import ApiCommandError, ConnectionClosed
from tui import format as fmt

if TYPE_CHECKING:
    from tui.app import PrimeAgentApp

__all__ = ["INSPECTOR_POLL_S", "InspectorScreen", "info_table"]

# CPU and memory are sampled this often while the inspector is open.
INSPECTOR_POLL_S: Final = 2.0
_BYTES_UNITS: Final = ("B", "KiB", "MiB", "GiB", "TiB")
_BYTES_STEP: Final = 1024.0


def _bytes(n: Any) -> str:
    if n is None:
        return "—"
    value = float(n)
    for unit in _BYTES_UNITS:
        if value < _BYTES_STEP or unit == _BYTES_UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= _BYTES_STEP
    return f"{value:.1f} {_BYTES_UNITS[-1]}"  # pragma: no cover


def info_table(answer: dict[str, Any]) -> Table:
    """``sandbox_info``'s answer as a two-column table."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    box = answer.get("sandbox")
    table.add_row("session", f"{answer.get('session', '')} ({answer.get('status', '')})")
    if box is None:
        table.add_row("sandbox", "none: the session is inactive (a message or restart wakes it)")
        return table
    cpu = box.get("cpu_percent")
    memory = _bytes(box.get("memory_bytes"))
    if box.get("memory_limit_bytes"):
        memory += f" of {_bytes(box['memory_limit_bytes'])}"
    uptime = box.get("uptime_s")
    rows = (
        ("backend", box.get("backend")),
        ("name", box.get("name")),
        ("image", box.get("image") or "—"),
        ("state", box.get("state")),
        ("cpu", "—" if cpu is None else f"{float(cpu):.1f}%"),
        ("memory", memory),
        ("uptime", "—" if uptime is None else fmt.duration(float(uptime))),
    )
    for key, value in rows:
        table.add_row(key, str(value if value is not None else "—"))
    return table


class InspectorScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,left", "back", "Back"),
        Binding("s", "control('stop')", "Stop sandbox"),
        Binding("r", "control('restart')", "Restart sandbox"),
    ]

    def __init__(self, session_id: str):
        super().__init__()
        self.session_id = session_id
        self.answer: dict[str, Any] = {}
        self._busy = False

    @property
    def tui(self) -> PrimeAgentApp:
        return cast("PrimeAgentApp", self.app)

    def compose(self) -> ComposeResult:
        yield Static(Text("Sandbox", style="bold"), id="inspector-title")
        yield Static(id="info")
        yield Static(Text("last log lines", style="bold"), id="logs-title")
        with VerticalScroll(id="logs-box"):
            yield Static(id="logs")
        yield Static(id="inspector-hint")
        yield Footer()

    async def on_mount(self) -> None:
        self.set_interval(INSPECTOR_POLL_S, self.poll)
        await self.poll()

    async def poll(self) -> None:
        if self._busy:
            return
        self._busy = True
        try:
            self.answer = await self.tui.link.call("sandbox_info", session=self.session_id)
        except (ApiCommandError, ConnectionClosed) as exc:
            self._hint(str(exc), error=True)
            return
        finally:
            self._busy = False
        self._draw()

    def _draw(self) -> None:
        self.query_one("#info", Static).update(info_table(self.answer))
        box = self.answer.get("sandbox") or {}
        lines = box.get("log_tail") or []
        self.query_one("#logs", Static).update(Text("\n".join(lines) or "(no log lines)"))

    def _hint(self, text: str, *, error: bool = False) -> None:
        style = "bold red" if error else "dim"
        self.query_one("#inspector-hint", Static).update(Text(text, style=style))

    async def action_control(self, action: str) -> None:
        if self._busy:
            return
        self._busy = True
        self._hint(f"{action} requested…")
        try:
            await self.tui.link.call("sandbox_control", session=self.session_id, action=action)
        except (ApiCommandError, ConnectionClosed) as exc:
            self._hint(f"{action}: {exc}", error=True)
            return
        finally:
            self._busy = False
        self._hint("stopped: the session is inactive" if action == "stop" else "restarted")
        await self.poll()

    def action_back(self) -> None:
        self.tui.close_screen(self)
