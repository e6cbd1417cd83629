"""Widgets that draw a ``Transcript``: messages, Markdown answers and collapsible REPL cells."""

from __future__ import annotations

from typing import Final

from rich.syntax import Syntax
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Collapsible, Markdown, Static

from tui import format as fmt
from tui.transcript import Item, Transcript

__all__ = ["CellView", "TranscriptView", "cell_title"]

# A condensed cell shows this much of its first line of code.
CELL_TITLE_CODE_CHARS: Final = 60
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


class CellView(Collapsible):
    """A REPL cell: condensed to its title; expanded, the full code and output."""

    def __init__(self, item: Item):
        self.item = item
        self._code = Static(classes="cell-code")
        self._output = Static(classes="cell-output")
        super().__init__(self._code, self._output, title=cell_title(item), collapsed=True)
        self._shown = -1
        self.set_class(item.label != "ok" and item.label not in ("queued", "running"), "failed")

    def on_mount(self) -> None:
        self.sync()

    def sync(self) -> None:
        item = self.item
        if item.version == self._shown:
            return
        self._shown = item.version
        self.title = cell_title(item)
        failed = item.label not in ("ok", "queued", "running")
        self.set_class(failed, "failed")
        self._code.update(Syntax(item.text or "", "python", theme="ansi_dark", word_wrap=True))
        output = Text(item.output or "(no output yet)")
        if failed:
            output.stylize("red")
        self._output.update(output)


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
        else:
            self.update(Text(f"• {item.text}", style="dim"))


class _AnswerView(Markdown):
    """Assistant Markdown. Updates run one at a time, newest text last: Textual's
    ``Markdown.update`` picks the blocks to replace when called, so two overlapping updates
    (deltas arrive faster than a parse) could leave stale blocks on screen."""

    def __init__(self, item: Item):
        super().__init__(item.text, classes="msg-assistant")
        self.item = item
        self._rendered = item.text
        self._draining = False

    def sync(self) -> None:
        if self.item.text != self._rendered and not self._draining:
            self._draining = True
            self.run_worker(self._drain(), group="markdown")

    async def _drain(self) -> None:
        try:
            while self.item.text != self._rendered:
                text = self.item.text
                await self.update(text)
                self._rendered = text
        finally:
            self._draining = False

    @property
    def settled(self) -> bool:
        """True when the screen shows the item's whole text."""
        return not self._draining and self._rendered == self.item.text


def _view_for(item: Item) -> Widget:
    if item.kind == "cell":
        return CellView(item)
    if item.kind == "assistant":
        return _AnswerView(item)
    return _MessageView(item)


class TranscriptView(VerticalScroll):
    """Mounts a widget per item and updates the ones that changed; follows the end."""

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self._views: dict[int, Widget] = {}  # id(item) -> its widget

    def clear_views(self) -> None:
        self._views.clear()
        self.remove_children()

    def sync(self, transcript: Transcript) -> None:
        at_end = self.is_vertical_scroll_end or self.max_scroll_y == 0
        new: list[Widget] = []
        for item in transcript.items:
            view = self._views.get(id(item))
            if view is None:
                if item.kind == "assistant" and not item.text.strip() and not item.streaming:
                    continue
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
