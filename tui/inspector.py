"""The sandbox inspector: one session's sandbox, polled live; stop or restart it.

Shows backend, container / pod / process name, image, state, CPU (over the last poll), memory,
uptime and the newest log lines (``sandbox_info``). A pod (the kubernetes backend: the
answer's ``pod``, read as ``SandboxPod``) adds its namespace, phase, node, restarts, why it has
no metrics when it has none, and its newest events. `s` stops the sandbox (the session goes
inactive, everything on disk), `r` restarts it (a new sandbox: a new container or a new pod,
namespace revived from its snapshot) through ``sandbox_control``.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, ClassVar, Final

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Static

from orchestrator.api import ApiCommandError, ConnectionClosed, SandboxPod
from tui import format as fmt
from tui.screen_host import ScreenHost, host_of

__all__ = ["INSPECTOR_POLL_S", "InspectorScreen", "info_table", "pod_rows"]

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


def _event_line(event: Any, now: datetime) -> str:
    at = event.at.isoformat() if event.at is not None else None
    message = f": {event.message}" if event.message else ""
    times = f" (x{event.count})" if event.count > 1 else ""
    return f"{fmt.ago(at, now)} {event.kind} {event.reason}{message}{times}"


def pod_rows(raw: object, now: datetime) -> list[tuple[str, str]]:
    """The rows a pod adds to the table (none when ``raw``, the answer's ``pod``, is absent or
    not one: another backend, an older daemon)."""
    if not isinstance(raw, dict):
        return []
    try:
        pod = SandboxPod.model_validate(raw)
    except ValueError:
        return [("pod", "(unreadable)")]
    rows = [
        ("namespace", pod.namespace),
        ("phase", pod.phase),
        ("node", pod.node or "—"),
        ("restarts", str(pod.restarts)),
    ]
    if pod.metrics:
        rows.append(("metrics", pod.metrics))
    events = [_event_line(event, now) for event in pod.events]
    rows.append(("events", "\n".join(events) or "(none)"))
    return rows


def info_table(answer: dict[str, Any], now: datetime | None = None) -> Table:
    """``sandbox_info``'s answer as a two-column table (``now``: the clock events' ages are
    measured with)."""
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
    for key, value in (*rows, *pod_rows(box.get("pod"), now or datetime.now(UTC))):
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
        # Held by a poll or a stop / restart: a timer tick skips its poll while it is held;
        # `s` / `r` wait for a poll in flight to answer.
        self._lock = asyncio.Lock()
        self._controlling = False

    @property
    def tui(self) -> ScreenHost:
        return host_of(self)

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
        if self._lock.locked():
            return
        async with self._lock:
            await self._poll()

    async def _poll(self) -> None:
        try:
            self.answer = await self.tui.link.call("sandbox_info", session=self.session_id)
        except (ApiCommandError, ConnectionClosed) as exc:
            self._hint(str(exc), error=True)
            return
        self._draw()

    def _draw(self) -> None:
        box = self.answer.get("sandbox") or {}
        lines = box.get("log_tail") or []
        self._update("#info", info_table(self.answer, self.tui.now()))
        self._update("#logs", Text("\n".join(lines) or "(no log lines)"))

    def _hint(self, text: str, *, error: bool = False) -> None:
        self._update("#inspector-hint", Text(text, style="bold red" if error else "dim"))

    def _update(self, selector: str, content: Table | Text) -> None:
        try:
            widget = self.query_one(selector, Static)
        except NoMatches:  # closed (Esc) while a stop / restart was under way
            return
        widget.update(content)

    def action_control(self, action: str) -> None:
        if self._controlling:  # one stop / restart at a time
            return
        self._controlling = True
        self._hint(f"{action} requested…")
        # The app's worker, not the screen's: the keys keep working while it waits for a poll
        # in flight or a slow restart, and Esc does not cancel what was asked.
        self.app.run_worker(self._control(action), name=f"sandbox-{action}", group="inspector")

    async def _control(self, action: str) -> None:
        try:
            async with self._lock:  # a poll in flight answers first
                try:
                    await self.tui.link.call(
                        "sandbox_control", session=self.session_id, action=action
                    )
                except (ApiCommandError, ConnectionClosed) as exc:
                    self._hint(f"{action}: {exc}", error=True)
                    return
                self._hint("stopped: the session is inactive" if action == "stop" else "restarted")
                await self._poll()
        finally:
            self._controlling = False

    def action_back(self) -> None:
        self.tui.close_screen(self)
