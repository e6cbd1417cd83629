"""The TUI's own costs, without a daemon: folding events into a transcript, drawing a replayed
chat, and following a streamed answer.

- transcript fold: ``Transcript.apply`` over ``FOLD_EVENTS`` stored events (events/s);
- replay render: a headless Textual app mounts the widgets of ``REPLAY_TURNS`` turns (a user
  line, a cell, a Markdown answer each) and draws them (ms until the screen is idle);
- streamed deltas: ``STREAM_DELTAS`` text deltas of ``DELTA_CHARS`` characters into one
  Markdown answer, each followed by a sync (ms per delta until the last one is on screen).

Usage: ``.venv/bin/python -m bench tui`` (through the runner), or ``python bench/bench_tui.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from textual.app import App, ComposeResult

from bench.common import row
from tui.transcript import Transcript
from tui.transcript_view import TranscriptView

__all__ = ["main", "run"]

REPEATS = 5
QUICK_REPEATS = 2
FOLD_EVENTS = 10_000
REPLAY_TURNS = 100
STREAM_DELTAS = 300
DELTA_CHARS = 8
SIZE = (120, 40)
MS = 1000.0


def _turn(seq: int) -> list[dict[str, Any]]:
    """Four stored events of one turn, from ``seq`` on."""
    call_id = f"c{seq}"
    code = json.dumps({"code": f"x = {seq}\nprint(x * 2)"})
    return [
        {"type": "user_message", "seq": seq, "id": f"e{seq}", "payload": {"text": f"turn {seq}"}},
        {
            "type": "assistant_message",
            "seq": seq + 1,
            "id": f"e{seq + 1}",
            "payload": {"text": "", "tool_calls": [{"id": call_id, "arguments": code}]},
        },
        {
            "type": "tool_result",
            "seq": seq + 2,
            "id": f"e{seq + 2}",
            "payload": {"tool_call_id": call_id, "text": str(seq * 2), "duration_ms": 3.0},
        },
        {
            "type": "assistant_message",
            "seq": seq + 3,
            "id": f"e{seq + 3}",
            "payload": {"text": f"The answer is **{seq * 2}**.\n\n- one\n- two"},
        },
    ]


def _events(turns: int) -> list[dict[str, Any]]:
    return [e for t in range(turns) for e in _turn(1 + 4 * t)]


def _fold() -> float:
    events = _events(FOLD_EVENTS // 4)
    start = time.perf_counter()
    transcript = Transcript()
    for event in events:
        transcript.apply(event)
    return len(events) / (time.perf_counter() - start)


class _Bench(App[None]):
    def compose(self) -> ComposeResult:
        yield TranscriptView(id="transcript")


async def _replay_ms() -> float:
    transcript = Transcript()
    for event in _events(REPLAY_TURNS):
        transcript.apply(event)
    app = _Bench()
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(TranscriptView)
        start = time.perf_counter()
        view.sync(transcript)
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()
        return (time.perf_counter() - start) * MS


async def _stream_ms_per_delta() -> float:
    transcript = Transcript()
    app = _Bench()
    async with app.run_test(size=SIZE) as pilot:
        view = app.query_one(TranscriptView)
        start = time.perf_counter()
        for _ in range(STREAM_DELTAS):
            transcript.stream({"type": "text_delta", "delta": "word " * (DELTA_CHARS // 5 + 1)})
            view.sync(transcript)
            await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()
        return (time.perf_counter() - start) * MS / STREAM_DELTAS


def run(quick: bool = False) -> dict[str, Any]:
    """The bench runner's entry."""
    repeats = QUICK_REPEATS if quick else REPEATS
    folds = [_fold() for _ in range(repeats)]
    replays = [asyncio.run(_replay_ms()) for _ in range(repeats)]
    streams = [asyncio.run(_stream_ms_per_delta()) for _ in range(repeats)]
    rows = [
        row(
            f"tui transcript fold, {FOLD_EVENTS:,} events",
            "events/s",
            folds,
            higher_is_better=True,
        ),
        row(f"tui replay render, {REPLAY_TURNS} turns", "ms", replays),
        row(f"tui streamed answer, {STREAM_DELTAS} deltas", "ms/delta", streams),
    ]
    return {"rows": rows, "notes": [f"headless Textual at {SIZE[0]}x{SIZE[1]}"]}


def main() -> None:
    for r in run()["rows"]:
        samples = ", ".join(f"{s:,.2f}" for s in r["samples"])
        print(f"{r['name']:<44} {r['unit']:<9} {samples}")


if __name__ == "__main__":
    main()
