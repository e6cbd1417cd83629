"""Widgets that draw a ``Transcript``: messages, Markdown answers and collapsible REPL cells."""

from __future__ import annotations

from typing import ClassVar, Final

from rich.console import Group
from rich.markdown import Markdown as RichMarkdown
from rich.padding import Padding
from rich.syntax import Syntax
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

from tui import format as fmt
from tui.transcript import Item, Transcript

__all__ = ["TRANSCRIPT_WIDGETS_MAX", "CellView", "TranscriptView", "cell_title"]

# A condensed cell shows this much of its first line of code.
CELL_TITLE_CODE_CHARS: Final = 60
# At most this many transcript items have widgets; older ones are counted in a line on top.
TRANSCRIPT_WIDGETS_MAX: Final = 400
# An expanded cell's code and output are indented under its title: (top, right, bottom, left).
CELL_BODY_INDENT: Final = (0, 0, 0, 4)
_STATUS_ICON: Final = {
    "queued": "·",
    "running": "⟳",
    "ok": "✓",
    "error": "✗",
    "timeout": "⏱",
    "aborted": "■",
    "kernel_died": "✗",
    "invalid_arguments": "✗",
}


def cell_title(item: Item) -> str:
    """A cell on one line: icon, first line of code, status, duration."""
    icon = _STATUS_ICON.get(item.label, "?")
    code = fmt.first_line(item.text, CELL_TITLE_CODE_CHARS) or "(empty cell)"
    took = ""
    if item.duration_ms is not None:
        took = f" {fmt.duration(item.duration_ms / 1000):>{fmt.DURATION_CHARS}}"
    return f"{icon} {code}  [{item.label}{took}]"


class CellView(Static, can_focus=True):
    """A REPL cell: one line (▶ and its title) until expanded (Enter, a click, or Ctrl-O for
    every cell), then its full code and output. One widget per cell: a replayed chat mounts
    hundreds of them (bench/bench_tui.py)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "toggle_cell", "Expand", show=False)]

    def __init__(self, item: Item):
        super().__init__(classes="cell")
        self.item = item
        self._collapsed = True
        self._shown = -1

    @property
    def title(self) -> str:
        return cell_title(self.item)

    @property
    def collapsed(self) -> bool:
        return self._collapsed

    @collapsed.setter
    def collapsed(self, value: bool) -> None:
        if value != self._collapsed:
            self._collapsed = value
            self._shown = -1
            self.sync()

    @property
    def failed(self) -> bool:
        return self.item.label not in ("ok", "queued", "running")

    def on_mount(self) -> None:
        self.sync()

    def action_toggle_cell(self) -> None:
        self.collapsed = not self.collapsed

    def on_click(self) -> None:
        self.action_toggle_cell()

    def sync(self) -> None:
        item = self.item
        if item.version == self._shown:
            return
        self._shown = item.version
        self.set_class(self.failed, "failed")
        head = Text(f"{'▶' if self._collapsed else '▼'} {self.title}")
        if self._collapsed:
            self.update(head)
            return
        output = Text(item.output or "(no output yet)", style="red" if self.failed else "")
        code = Syntax(item.text or "", "python", theme="ansi_dark", word_wrap=True)
        self.update(Group(head, Padding(code, CELL_BODY_INDENT), Padding(output, CELL_BODY_INDENT)))


class _MessageView(Static):
    def __init__(self, item: Item):
        super().__init__(classes=f"msg-{item.kind}")
        self.item = item
        self._shown = -1

    def on_mount(self) -> None:
        self.sync()

    def sync(self) -> None:
        if self.item.version == self._shown and self._shown >= 0:
            return
        self._shown = self.item.version
        item = self.item
        if item.kind == "user":
            text = Text()
            text.append(f"{item.label or 'you'} › ", style="bold cyan")
            text.append(item.text)
            self.update(text)
        elif item.kind == "error":
            self.update(Text(f"✗ {item.text}", style="bold red"))
        elif item.kind == "thinking":
            text = Text("thinking › ", style="dim bold")
            text.append(item.text, style="dim italic")
            self.update(text)
        else:
            self.update(Text(f"• {item.text}", style="dim"))


class _AnswerView(Static):
    """Assistant text as Markdown. A Rich ``Markdown`` renderable in a ``Static``: one widget
    per answer (Textual's ``Markdown`` widget mounts one per block, which made replaying a long
    chat take seconds, bench/bench_tui.py), re-rendered as streamed text grows."""

    def __init__(self, item: Item):
        super().__init__(classes="msg-assistant")
        self.item = item
        self._rendered: str | None = None

    def on_mount(self) -> None:
        self.sync()

    def sync(self) -> None:
        if self.item.text != self._rendered:
            self._rendered = self.item.text
            self.update(RichMarkdown(self.item.text))


def _view_for(item: Item) -> Widget:
    if item.kind == "cell":
        return CellView(item)
    if item.kind == "assistant":
        return _AnswerView(item)
    return _MessageView(item)


def _visible(item: Item) -> bool:
    """An answer with no text (a reply that only called the tool) takes no line."""
    quiet = item.kind in ("assistant", "thinking") and not item.text.strip()
    return not (quiet and not item.streaming)


class TranscriptView(VerticalScroll):
    """Mounts a widget per item and updates the ones that changed; follows the end.

    At most ``limit`` items have widgets: a multi-day session's chat stays as quick to draw as
    a short one. Older items lose theirs, and a line at the top says how many are not shown
    (the whole history is in the store: ``prime-agent export``, ``/tree``)."""

    def __init__(self, *, id: str | None = None, limit: int = TRANSCRIPT_WIDGETS_MAX):
        super().__init__(id=id)
        self.limit = limit
        self._views: dict[int, Widget] = {}  # id(item) -> its widget
        self._first = 0  # the index of the first transcript item that may have a widget
        self._earlier = Static(classes="msg-notice")
        self._earlier.display = False

    def compose(self) -> ComposeResult:
        yield self._earlier

    @property
    def hidden(self) -> int:
        """How many transcript items (from the start) have no widget any more."""
        return self._first

    def clear_views(self) -> None:
        for view in self._views.values():
            view.remove()
        self._views.clear()
        self._first = 0
        self._earlier.display = False

    def sync(self, transcript: Transcript) -> None:
        at_end = self.is_vertical_scroll_end or self.max_scroll_y == 0
        items = transcript.items
        if self._first > len(items):  # the transcript was replaced by a shorter one
            self.clear_views()
        shown = [i for i in range(self._first, len(items)) if _visible(items[i])]
        if len(shown) > self.limit:
            keep_from = shown[-self.limit]
            for item in items[self._first : keep_from]:
                dropped = self._views.pop(id(item), None)
                if dropped is not None:
                    dropped.remove()
            self._first = keep_from
            shown = shown[-self.limit :]
            self._earlier.update(
                Text(f"… {keep_from} earlier items not shown (prime-agent export has them all)")
            )
            self._earlier.display = True
        new: list[Widget] = []
        for index in shown:
            item = items[index]
            view = self._views.get(id(item))
            if view is None:
                view = _view_for(item)
                self._views[id(item)] = view
                new.append(view)
            elif isinstance(view, CellView | _MessageView | _AnswerView):
                view.sync()
        if new:
            self.mount_all(new)
        if at_end:
            self.call_after_refresh(self.scroll_end, animate=False)

    def cells(self) -> list[CellView]:
        return list(self.query(CellView))

    def set_expanded(self, expanded: bool) -> None:
        for cell in self.cells():
            cell.collapsed = not expanded
