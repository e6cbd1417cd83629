"""``Follower`` (orchestrator/cli/follow.py) against a scripted stand-in for the daemon client:
replays, duplicates, gaps, new descendants, resyncs, and the drain after the final answer;
plus ``render_event`` for every event type."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, cast

from orchestrator.api.client import ControlClient
from orchestrator.api.messages import Event, Resync
from orchestrator.cli.follow import Follower
from orchestrator.cli.render import RENDER_MAX_LINES, render_event


def _event(session: str, seq: int) -> dict[str, Any]:
    return {"type": "notice", "session_id": session, "seq": seq, "payload": {"text": f"{seq}"}}


class FakeClient:
    """Answers ``attach`` from a per-session history; hands out queued pushes."""

    def __init__(self, history: dict[str, int], family: list[str] | None = None):
        self.history = history
        self.family = family or []
        self.attaches: list[tuple[str, int, bool]] = []
        self.queue: deque[Event | Resync] = deque()

    async def call(self, command: str, **fields: Any) -> dict[str, Any]:
        assert command == "attach"
        session, cursor = fields["session"], fields.get("cursor") or 0
        family = bool(fields.get("family"))
        self.attaches.append((session, cursor, family))
        last = self.history.get(session, 0)
        events = [_event(session, seq) for seq in range(cursor + 1, last + 1)]
        answer: dict[str, Any] = {"cursor": last, "snapshot": False, "events": events}
        if family:
            answer["family"] = list(self.family)
        return answer

    def push(self, session: str, seq: int) -> None:
        self.history[session] = max(self.history.get(session, 0), seq)
        self.queue.append(Event(session=session, cursor=seq, event=_event(session, seq)))

    async def next_event(self) -> Event | Resync | None:
        while not self.queue:
            await asyncio.sleep(0.001)
        return self.queue.popleft()

    def next_event_nowait(self) -> Event | Resync | None:
        return self.queue.popleft() if self.queue else None


def _follower(client: FakeClient) -> tuple[Follower, list[tuple[str, int]], list[tuple[str, int]]]:
    seen: list[tuple[str, int]] = []
    gaps: list[tuple[str, int]] = []
    follower = Follower(
        cast(ControlClient, client),
        lambda e: seen.append((e["session_id"], e["seq"])),
        on_gap=lambda s, n: gaps.append((s, n)),
    )
    return follower, seen, gaps


def test_a_new_run_gets_every_session_complete_in_order_once() -> None:
    client = FakeClient({"root": 2, "kid": 2}, family=["kid"])
    follower, seen, _ = _follower(client)

    async def run() -> None:
        await follower.attach("root", 0, family=True)
        client.push("root", 2)  # a push the replay already had
        client.push("root", 3)
        client.history["kid"] = 3  # kid 3 was committed but its push went missing
        client.push("kid", 4)
        client.push("new", 1)  # a child spawned after the attach
        client.push("new", 2)
        for _ in range(5):
            item = client.next_event_nowait()
            assert item is not None
            await follower.handle(item)

    asyncio.run(run())
    assert seen == [
        ("root", 1),
        ("root", 2),
        ("kid", 1),
        ("kid", 2),
        ("root", 3),
        ("kid", 3),  # replayed before 4: the gap is filled, in order
        ("kid", 4),
        ("new", 1),
        ("new", 2),
    ]
    assert ("kid", 2, False) in client.attaches


def test_a_resumed_run_skips_old_history_of_descendants() -> None:
    client = FakeClient({"root": 40, "old": 57}, family=["old"])
    follower, seen, _ = _follower(client)

    async def run() -> None:
        await follower.attach("root", 40, family=True, history=False)
        client.push("old", 58)  # taken as it comes: no replay of its 57 earlier events
        client.push("old", 58)
        client.push("root", 41)
        while (item := client.next_event_nowait()) is not None:
            await follower.handle(item)

    asyncio.run(run())
    assert seen == [("old", 58), ("root", 41)]
    assert [a[0] for a in client.attaches] == ["root"]


def test_resync_with_a_snapshot_reports_the_gap_and_without_one_reattaches() -> None:
    client = FakeClient({"root": 3})
    follower, seen, gaps = _follower(client)

    async def run() -> None:
        await follower.attach("root", 0)
        snapshot = {"cursor": 1500, "snapshot": True, "missed": 1497, "events": []}
        snapshot["events"] = [_event("root", seq) for seq in (1499, 1500)]
        await follower.handle(Resync(session="root", cursor=1500, snapshot=snapshot))
        client.history["root"] = 1502
        await follower.handle(Resync(session="root"))

    asyncio.run(run())
    assert seen == [("root", s) for s in (1, 2, 3, 1499, 1500, 1501, 1502)]
    assert gaps == [("root", 1495)]


def test_follow_until_drains_what_came_before_the_answer() -> None:
    client = FakeClient({"root": 0})
    follower, seen, _ = _follower(client)

    async def work() -> str:
        client.push("root", 1)
        client.push("root", 2)  # queued with the answer: must still be emitted
        return "done"

    async def run() -> str:
        await follower.attach("root", 0)
        return await follower.follow_until(work())

    assert asyncio.run(run()) == "done"
    assert seen == [("root", 1), ("root", 2)]


def test_render_every_event_type() -> None:
    long_output = "\n".join(f"line {i}" for i in range(RENDER_MAX_LINES + 5))
    cases: list[tuple[dict[str, Any], list[str]]] = [
        ({"type": "user_message", "payload": {"text": "hi"}}, ["» user:", "  hi"]),
        (
            {"type": "user_message", "payload": {"text": "go", "source": "parent"}},
            ["» task from parent:", "  go"],
        ),
        (
            {
                "type": "assistant_message",
                "payload": {
                    "text": "Let me look.",
                    "tool_calls": [{"name": "ipython", "arguments": '{"code": "print(1)"}'}],
                },
            },
            ["« assistant:", "  Let me look.", "» ipython:", "  print(1)"],
        ),
        ({"type": "usage", "payload": {"input": 1}}, []),
        ({"type": "aborted", "payload": {"reason": "user"}}, ["· aborted (user)"]),
        ({"type": "run_end", "payload": {"reason": "completed"}}, ["· run ended: completed"]),
    ]
    for event, lines in cases:
        assert render_event(event) == lines
    result = render_event({"type": "tool_result", "payload": {"text": long_output}})
    assert result[0] == "  ✓ result" and result[-1] == "  │ [… 5 more lines]"
    assert len(result) == RENDER_MAX_LINES + 2
    failed = render_event({"type": "tool_result", "payload": {"text": "x", "is_error": True}})
    assert failed[0] == "  ✗ result"
