"""``prime-agent usage`` asks the daemon for its rows page by page (a large store's rows do not
fit one answer line)."""

from __future__ import annotations

import asyncio
from typing import Any

from orchestrator.cli.usage import paged_rows

PAGE = 2


class FakeDaemon:
    """Answers ``get_usage`` row pages from a fixed list, and remembers what it was asked."""

    def __init__(self, count: int):
        self.rows = [{"session_id": f"s-{i}"} for i in range(count)]
        self.asked: list[dict[str, Any]] = []

    async def call(self, command: str, **fields: Any) -> dict[str, Any]:
        assert command == "get_usage"
        self.asked.append(fields)
        start, limit = fields["rows_offset"], fields["rows_limit"]
        return {"usage": [], "rows": self.rows[start : start + limit], "rows_total": len(self.rows)}


def test_every_row_arrives_in_pages() -> None:
    daemon = FakeDaemon(5)
    rows = asyncio.run(paged_rows(daemon.call, None, page=PAGE))
    assert rows == daemon.rows
    assert [a["rows_offset"] for a in daemon.asked] == [0, 2, 4]
    assert all(a["rows"] and a["rows_limit"] == PAGE and "session" not in a for a in daemon.asked)


def test_one_session_and_an_empty_store() -> None:
    daemon = FakeDaemon(1)
    assert asyncio.run(paged_rows(daemon.call, "s-0", page=PAGE)) == daemon.rows
    assert daemon.asked == [{"rows": True, "rows_limit": PAGE, "rows_offset": 0, "session": "s-0"}]
    empty = FakeDaemon(0)
    assert asyncio.run(paged_rows(empty.call, None, page=PAGE)) == []
    assert len(empty.asked) == 1
