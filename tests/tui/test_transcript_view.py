"""The transcript widget on its own (no daemon needed): a long chat keeps at most ``limit``
widgets, says how many earlier items it does not show, and always shows the newest."""

from __future__ import annotations

from textual.app import App, ComposeResult

from tests.tui.pilot import screen_text
from tui.transcript import Transcript
from tui.transcript_view import CellView, TranscriptView

LIMIT = 10


class _Host(App[None]):
    def compose(self) -> ComposeResult:
        yield TranscriptView(id="transcript", limit=LIMIT)


def _notices(transcript: Transcript, first: int, count: int) -> None:
    for n in range(first, first + count):
        transcript.apply({"type": "notice", "seq": n, "id": f"e{n}", "payload": {"text": f"n{n}"}})


async def test_a_long_chat_keeps_the_newest_items_and_counts_the_rest() -> None:
    transcript = Transcript()
    _notices(transcript, 1, 25)
    app = _Host()
    async with app.run_test(size=(80, 40)) as pilot:
        view = app.query_one(TranscriptView)
        view.sync(transcript)
        await pilot.pause()
        shown = [w for w in view.children if getattr(w, "item", None) is not None]
        assert [w.item.text for w in shown] == [f"n{n}" for n in range(16, 26)]  # type: ignore[attr-defined]
        assert view.hidden == 15
        assert "15 earlier items not shown" in screen_text(pilot)

        _notices(transcript, 26, 5)
        transcript.apply(
            {
                "type": "assistant_message",
                "seq": 31,
                "id": "e31",
                "payload": {"tool_calls": [{"id": "c", "arguments": '{"code": "1 + 1"}'}]},
            }
        )
        view.sync(transcript)
        await pilot.pause()
        shown = [w for w in view.children if getattr(w, "item", None) is not None]
        assert len(shown) == LIMIT and isinstance(shown[-1], CellView)
        assert view.hidden == 21
        assert "21 earlier items not shown" in screen_text(pilot)

        transcript.clear()  # a snapshot replaces everything
        _notices(transcript, 1, 3)
        view.sync(transcript)
        await pilot.pause()
        assert view.hidden == 0 and "earlier items" not in screen_text(pilot)
