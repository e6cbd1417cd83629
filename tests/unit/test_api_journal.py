"""The persisted idempotency journal (orchestrator/api/journal.py), without a daemon: what a
restarted daemon loads, what it answers for a command cut off by a crash, and the bounds."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

from orchestrator.api import journal as journal_mod
from orchestrator.api.journal import JOURNAL_FILE_MODE, CommandJournal

UNCERTAIN = b'{"uncertain": true}\n'
TTL_S = 60.0


def _uncertain(command_id: str) -> bytes:
    return UNCERTAIN


class Clock:
    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall = 1_800_000_000.0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def _journal(clock: Clock, max_entries: int = 8) -> CommandJournal:
    return CommandJournal(
        max_entries=max_entries,
        ttl_s=TTL_S,
        clock=lambda: clock.mono,
        wall_clock=lambda: clock.wall,
    )


def test_answers_survive_a_restart_and_cut_off_commands_are_uncertain(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    clock = Clock()

    async def first_daemon() -> None:
        journal = _journal(clock)
        assert journal.open(path, _uncertain) == 0
        done = journal.reserve(("c1", "create-1"), "fp-create")
        journal.complete(("c1", "create-1"), done, b'{"ok": 1}\n')
        journal.reserve(("c1", "prompt-1"), "fp-prompt")  # the daemon dies while it runs
        journal.close()

    async def second_daemon() -> CommandJournal:
        journal = _journal(clock)
        assert journal.open(path, _uncertain) == 2
        return journal

    asyncio.run(first_daemon())
    assert stat.S_IMODE(os.stat(path).st_mode) == JOURNAL_FILE_MODE

    async def check() -> None:
        journal = await second_daemon()
        created = journal.get(("c1", "create-1"))
        assert created is not None and created.fingerprint == "fp-create"
        assert created.result.result() == b'{"ok": 1}\n'
        cut = journal.get(("c1", "prompt-1"))
        assert cut is not None and cut.result.result() == UNCERTAIN
        assert journal.get(("c2", "create-1")) is None  # another client, another namespace
        journal.close()

    asyncio.run(check())
    # The restarted daemon rewrote the file with what it kept: the cut-off command now has its
    # (uncertain) answer on disk, so a third daemon says the same.
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["i"] for r in records] == ["create-1", "prompt-1"] and all("r" in r for r in records)


def test_entries_past_the_ttl_are_dropped_on_load(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    clock = Clock()

    async def write() -> None:
        journal = _journal(clock)
        journal.open(path, _uncertain)
        old = journal.reserve(("c", "old"), "fp")
        journal.complete(("c", "old"), old, b"old\n")
        clock.advance(TTL_S / 2)
        new = journal.reserve(("c", "new"), "fp")
        journal.complete(("c", "new"), new, b"new\n")
        journal.close()

    async def read() -> tuple[bool, bool]:
        clock.advance(TTL_S * 0.75)  # "old" is now past the TTL, "new" is not
        journal = _journal(clock)
        journal.open(path, _uncertain)
        found = journal.get(("c", "old")) is None, journal.get(("c", "new")) is not None
        clock.advance(TTL_S)
        assert journal.get(("c", "new")) is None  # and it keeps expiring in memory
        journal.close()
        return found

    asyncio.run(write())
    assert asyncio.run(read()) == (True, True)


def test_the_file_stays_bounded(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    clock = Clock()
    max_entries = 4

    async def many() -> int:
        journal = _journal(clock, max_entries=max_entries)
        journal.open(path, _uncertain)
        for i in range(100):
            entry = journal.reserve(("c", str(i)), "fp")
            journal.complete(("c", str(i)), entry, b"x" * 100 + b"\n")
            lines = path.read_text().splitlines()
            assert len(lines) <= 2 * max_entries + 2
        journal.close()
        return len(journal)

    assert asyncio.run(many()) == max_entries

    async def reload() -> list[str]:
        journal = _journal(clock, max_entries=max_entries)
        journal.open(path, _uncertain)
        kept = [str(i) for i in range(100) if journal.get(("c", str(i))) is not None]
        journal.close()
        return kept

    assert asyncio.run(reload()) == ["96", "97", "98", "99"]


def test_large_answers_stay_in_memory_and_garbage_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    clock = Clock()
    big = b"y" * (journal_mod.JOURNAL_PERSIST_MAX_LINE_BYTES + 1)

    async def write() -> None:
        journal = _journal(clock)
        journal.open(path, _uncertain)
        entry = journal.reserve(("c", "big"), "fp")
        journal.complete(("c", "big"), entry, big)
        assert entry.result.result() == big  # answered in memory all the same
        journal.close()
        with open(path, "ab") as fh:  # a torn last line and foreign junk
            fh.write(b'[1, 2]\n{"c": 1}\nnot json\n{"c": "c", "i": "tor')

    async def read() -> bytes:
        journal = _journal(clock)
        assert journal.open(path, _uncertain) == 1
        entry = journal.get(("c", "big"))
        assert entry is not None
        journal.close()
        return entry.result.result()

    asyncio.run(write())
    assert asyncio.run(read()) == UNCERTAIN  # its answer never reached the disk


def test_an_unwritable_file_keeps_the_journal_in_memory(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    clock = Clock()

    async def run() -> None:
        journal = _journal(clock)
        journal.open(blocked / "journal.jsonl", _uncertain)
        assert journal.path is None
        entry = journal.reserve(("c", "1"), "fp")
        journal.complete(("c", "1"), entry, b"ok\n")
        assert journal.get(("c", "1")) is entry

    asyncio.run(run())
