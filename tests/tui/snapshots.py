"""SVG snapshots of what a person sees, made comparable across runs.

The screen is rendered as Textual draws it (the compositor's strips), then every value that
changes from run to run (session ids, durations, "12s ago", process ids) is replaced by a
placeholder of the same width that takes the style of the value's first cell, so the layout
and colours around it are compared exactly. The result is exported as SVG with Rich (fixed
unique id and title) and compared with ``tests/tui/snapshots/<name>.svg``; a mismatch fails
with a diff of the visible text and leaves the new SVG next to the old one (``.new.svg``).
``UPDATE_SNAPSHOTS=1`` rewrites the stored files.
"""

from __future__ import annotations

import difflib
import io
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from rich.console import Console
from rich.segment import Segment, Segments
from rich.style import Style
from textual.pilot import Pilot
from textual.widgets import Input

SNAPSHOT_DIR: Final = Path(__file__).parent / "snapshots"
UPDATE_ENV: Final = "UPDATE_SNAPSHOTS"
PLACEHOLDER: Final = "#"
# A screen just pushed may not have drawn every widget yet (the footer comes a frame later on
# a loaded machine): the comparison is repeated until it matches or this bound passes.
SETTLE_TIMEOUT_S: Final = 10.0
_SETTLE_STEP_S: Final = 0.05
_UNIQUE_ID: Final = "prime-agent-snapshot"
_TITLE: Final = "prime-agent"

# Values that differ between two runs of the same test. Durations and relative times take the
# spaces in front of them: the TUI right-aligns them in fixed-width columns, so value plus
# padding is the same width in every run.
_VOLATILE: Final = (
    r"\bs-[a-z0-9]{8,}\b",  # session ids
    r" *(?:\b\d+[dh] \d\d[hm]\b|\b\d+m \d\ds\b)",  # long durations
    r" *\b\d+(?:\.\d+)?(?:ms|s)\b",  # short durations
    r" *(?:just now|\b\d+[smhd] ago\b)",  # relative times
    r"\bpid \d+\b",
    r"\b\d+(?:\.\d+)? (?:B|KiB|MiB|GiB)\b",
    r"\b\d+(?:\.\d+)?%",
)
_PATTERN: Final = re.compile("|".join(f"(?:{p})" for p in _VOLATILE))


def _cells(segments: Iterable[Segment]) -> list[tuple[str, Style | None]]:
    out: list[tuple[str, Style | None]] = []
    for segment in segments:
        if segment.control:
            continue
        out.extend((char, segment.style) for char in segment.text)
    return out


def _normalized_line(segments: Iterable[Segment]) -> list[Segment]:
    cells = _cells(segments)
    text = "".join(char for char, _ in cells)
    for match in _PATTERN.finditer(text):
        start, end = match.span()
        style = cells[start][1]
        for i in range(start, end):
            cells[i] = (PLACEHOLDER, style)
    merged: list[Segment] = []
    for char, style in cells:
        if merged and merged[-1].style == style:
            merged[-1] = Segment(merged[-1].text + char, style)
        else:
            merged.append(Segment(char, style))
    return merged


def render_svg(pilot: Pilot[None]) -> tuple[str, str]:
    """The current screen as (SVG, plain text), volatile values masked."""
    app = pilot.app
    for field in app.screen.query(Input):
        field.cursor_blink = False  # a blinking cursor would be caught half the time
    width, height = app.size
    strips = app.screen._compositor.render_strips()
    lines = [_normalized_line(strip) for strip in strips]
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    flat: list[Segment] = []
    for i, line in enumerate(lines):
        flat.extend(line)
        if i < len(lines) - 1:
            flat.append(Segment.line())
    console.print(Segments(flat), end="")
    svg = console.export_svg(title=_TITLE, unique_id=_UNIQUE_ID)
    text = "\n".join("".join(s.text for s in line).rstrip() for line in lines)
    return svg, text


def _text_of(svg: str) -> str:
    """The visible text of a stored snapshot, for a readable diff."""
    runs = re.findall(r"<text [^>]*>([^<]*)</text>", svg)
    return "\n".join(r.replace("&#160;", " ") for r in runs)


async def assert_snapshot(pilot: Pilot[None], name: str) -> None:
    """Compare the screen with ``snapshots/<name>.svg`` (see the module docstring)."""
    await pilot.pause()
    svg, text = render_svg(pilot)
    path = SNAPSHOT_DIR / f"{name}.svg"
    if os.environ.get(UPDATE_ENV) == "1" or not path.exists():
        if os.environ.get(UPDATE_ENV) != "1":
            raise AssertionError(
                f"no stored snapshot {path.name}; run with {UPDATE_ENV}=1 to create it. "
                f"Screen:\n{text}"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(svg)
        return
    stored = path.read_text()
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while stored != svg and time.monotonic() < deadline:
        await pilot.pause(_SETTLE_STEP_S)
        svg, text = render_svg(pilot)
    if stored != svg:
        fresh = path.with_suffix(".new.svg")
        fresh.write_text(svg)
        diff = "\n".join(
            difflib.unified_diff(
                _text_of(stored).splitlines(), _text_of(svg).splitlines(), lineterm="", n=1
            )
        )
        raise AssertionError(
            f"{path.name} differs (new one written to {fresh.name}); text diff:\n"
            f"{diff or '(same text: styles or layout changed)'}\nscreen now:\n{text}"
        )
