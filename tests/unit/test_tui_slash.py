"""tui/slash.py without a daemon: parsing, completion, misuse (one error line and no call), and
what each command asks of the API, against a host that records calls and answers from a table.
The same commands against a real daemon: tests/tui/test_slash_daemon.py."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api import ApiCommandError, ConnectionClosed
from tests.slash_host import RecordingHost
from tui import slash


class Host(RecordingHost):
    """A SlashHost that records what it was asked and answers ``call`` from ``replies``."""

    def __init__(self, session_id: str | None = "s-1", **replies: Any):
        super().__init__(session_id)
        self.replies: dict[str, Any] = replies
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call(self, command_type: str, /, **fields: Any) -> Any:
        self.calls.append((command_type, fields))
        reply = self.replies.get(command_type, {})
        if isinstance(reply, BaseException):
            raise reply
        return reply


def run(text: str, host: Host) -> Host:
    asyncio.run(slash.run_slash(text, host))
    return host


def only_line(host: Host) -> tuple[str, bool]:
    assert len(host.lines) == 1, host.lines
    return host.lines[0]


def test_the_command_table() -> None:
    names = [spec.name for spec in slash.COMMANDS]
    assert names == [
        "compact",
        "refine",
        "harness",
        "goal",
        "heartbeat",
        "tree",
        "fork",
        "clone",
        "model",
        "autonomous",
        "agents",
        "usage",
        "sweeps",
        "export",
        "help",
    ]
    for spec in slash.COMMANDS:
        assert spec.usage.startswith(f"/{spec.name}") and spec.summary
    by_name = {spec.name: spec for spec in slash.COMMANDS}
    assert by_name["goal"].subwords == ("status", "pause", "resume", "clear")
    assert set(by_name["heartbeat"].subwords) == {"every", "status", "pause", "resume", "stop"}
    assert by_name["autonomous"].subwords == ("on", "off", "status")
    assert by_name["refine"].subwords == ("rollback",)
    assert by_name["harness"].subwords == ("accept", "reject")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/compact", True),
        ("/goal Ship it", True),
        ("  /help  ", True),
        ("/", True),
        ("/nosuch", True),
        ("/usr/bin is full", False),
        ("hello /compact", False),
        ("", False),
    ],
)
def test_is_slash(text: str, expected: bool) -> None:
    assert slash.is_slash(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/co", ["/compact"]),
        ("/c", ["/compact", "/clone"]),
        ("/h", ["/harness", "/heartbeat", "/help"]),
        ("/harness a", ["/harness accept"]),
        ("/GO", ["/goal"]),
        ("/zzz", []),
        ("/goal pa", ["/goal pause"]),
        ("/goal ", ["/goal status", "/goal pause", "/goal resume", "/goal clear"]),
        ("/heartbeat e", ["/heartbeat every"]),
        ("/heartbeat s", ["/heartbeat status", "/heartbeat stop"]),
        ("/autonomous o", ["/autonomous on", "/autonomous off"]),
        ("/refine r", ["/refine rollback"]),
        ("/goal pause ", []),  # past the sub-word
        ("/goal Ship it", []),
        ("/compact ", []),  # no fixed words
        ("/nosuch x", []),
        ("compact", []),
    ],
)
def test_complete(text: str, expected: list[str]) -> None:
    assert slash.complete(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "/nosuch",
        "/",
        "/goal status --budget 5",
        "/goal --budget 5",
        "/goal Ship it --budget lots",
        "/goal Ship it --budget 0",
        "/goal Ship it --budget",
        "/heartbeat every 10m",
        "/heartbeat status now",
        "/autonomous maybe",
        "/autonomous on now",
        "/model",
        "/model a/b c/d",
        "/model a/b --api-base",
        "/refine rollback",
        "/refine rollback r-1 r-2",
        "/harness maybe",
        "/harness accept",
        "/harness reject p-1 p-2",
        "/harness accept " + "p" * 129,
        "/fork 3 4",
        "/clone now",
        "/tree x",
        "/agents x",
        "/usage x",
        "/help goal",
        "/compact " + "x" * 4001,
        "/refine " + "x" * 4001,
        "/goal " + "x" * 4001,
        "/fork " + "1" * 129,
        "/model openai/" + "m" * 130,
        "/heartbeat every 10m " + "x" * 16_000,
    ],
)
def test_misuse_says_one_error_and_calls_nothing(text: str) -> None:
    host = run(text, Host())
    line, error = only_line(host)
    assert error and line
    assert host.calls == [] and host.opened == []


def test_misuse_names_the_usage() -> None:
    line, _ = only_line(run("/model", Host()))
    assert line.startswith("/model: ") and "usage: /model PROVIDER/NAME" in line
    line, _ = only_line(run("/frobnicate now", Host()))
    assert "/frobnicate" in line and "/help" in line


@pytest.mark.parametrize(
    "text",
    [
        "/compact",
        "/refine",
        "/goal",
        "/goal Ship it",
        "/heartbeat every 10m check",
        "/tree",
        "/fork",
        "/clone",
        "/model openai/x",
        "/autonomous",
        "/export",
    ],
)
def test_commands_that_need_a_session(text: str) -> None:
    host = run(text, Host(session_id=None))
    line, error = only_line(host)
    assert error and "needs a session" in line
    assert host.calls == [] and host.opened == []


def test_commands_that_need_no_session() -> None:
    host = Host(session_id=None, refine_rollback={"id": "r-1", "status": "applied"})
    for text in ("/agents", "/usage", "/help", "/sweeps", "/refine rollback r-1"):
        run(text, host)
    assert host.opened == [("agents", None), ("usage", None), ("help", None), ("sweeps", None)]
    assert host.calls == [("refine_rollback", {"id": "r-1"})]
    assert host.lines == [("refinement r-1 applied", False)]


def test_harness_lists_accepts_and_rejects_proposals() -> None:
    pending = [
        {"id": f"p-{n}", "action": "create", "target": f"global:prompt:n{n}", "source": "agent"}
        for n in range(7)
    ]
    target = {"target": "global:prompt:n0"}
    host = Host(
        session_id=None,
        harness_list={"entries": [], "proposals": pending},
        harness_accept={"proposal": target, "entry": {"version": 3, "deleted": False}},
        harness_reject={"proposal": target},
    )
    run("/harness", host)
    run("/HARNESS Accept p-0", host)
    run("/harness reject p-0", host)
    assert host.calls == [
        ("harness_list", {}),
        ("harness_accept", {"id": "p-0"}),
        ("harness_reject", {"id": "p-0"}),
    ]
    listed, accepted, rejected = host.lines
    assert listed[0].startswith("7 pending proposal(s): p-0 create global:prompt:n0 (from agent)")
    assert listed[0].endswith("; and 2 more (prime-agent harness list)")
    assert accepted == ("accepted p-0: global:prompt:n0 v3", False)
    assert rejected == ("rejected p-0: global:prompt:n0 stays as it is", False)
    host = Host(harness_list={"entries": [], "proposals": []})
    assert only_line(run("/harness", host)) == ("no pending harness proposals", False)


def test_compact() -> None:
    done = {"compacted": True, "scheduled": False, "tokens_before": 12_345, "tokens_after": 3_210}
    host = run("/compact keep the file paths", Host(compact=done))
    assert host.calls == [("compact", {"session": "s-1", "instructions": "keep the file paths"})]
    assert only_line(host) == ("compacted: 12,345 → 3,210 tokens", False)
    host = run("/compact", Host(compact={"compacted": False, "scheduled": True}))
    assert host.calls == [("compact", {"session": "s-1"})]
    assert only_line(host) == ("compaction scheduled: at the turn's next step", False)
    nothing = {"compacted": False, "scheduled": False, "reason": "nothing_to_compact"}
    nothing["message"] = "nothing to compact: the context is already short"
    line, error = only_line(run("/compact", Host(compact=nothing)))
    assert line.endswith("the context is already short") and not error


def test_goal_parsing() -> None:
    row = {"status": "active", "objective": "Ship it", "tokens_used": 120, "token_budget": 500}
    host = run("/goal Ship it --budget 500", Host(goal={"goal": row}))
    fields = {"session": "s-1", "action": "set", "objective": "Ship it", "token_budget": 500}
    assert host.calls == [("goal", fields)]
    assert only_line(host) == ("goal active: Ship it (120/500 tokens)", False)
    host = run("/goal --budget=500 Ship it", Host(goal={"goal": row}))
    assert host.calls == [("goal", fields)]
    host = run("/goal PAUSE", Host(goal={"goal": None}))
    assert host.calls == [("goal", {"session": "s-1", "action": "pause"})]
    host = run("/goal", Host(goal={"goal": None}))
    assert host.calls == [("goal", {"session": "s-1"})]
    assert only_line(host) == ("no goal", False)
    # As in the CLI: an action word is an action only alone.
    host = run("/goal clear the backlog", Host(goal={"goal": row}))
    assert host.calls[0][1] == {"session": "s-1", "action": "set", "objective": "clear the backlog"}


def test_heartbeat_passes_the_line() -> None:
    host = run("/heartbeat every 10m check the build", Host(heartbeat={"message": "heartbeat set"}))
    assert host.calls == [("heartbeat", {"session": "s-1", "text": "every 10m check the build"})]
    assert only_line(host) == ("heartbeat set", False)
    host = run("/heartbeat", Host(heartbeat={"message": "no heartbeat"}))
    assert host.calls == [("heartbeat", {"session": "s-1", "text": ""})]


def test_model_and_api_base() -> None:
    answer = {"session": "s-1", "model": "openai/b", "previous": "openai/a"}
    host = run("/model openai/b --api-base http://x/v1", Host(set_model=answer))
    assert host.calls == [
        ("set_model", {"session": "s-1", "model": "openai/b", "api_base": "http://x/v1"})
    ]
    assert only_line(host) == ("model: openai/a → openai/b from the next turn", False)


def test_fork_and_clone_open_the_new_session() -> None:
    made = {"session": "s-2", "name": "copy"}
    host = run("/fork 4", Host(fork=made))
    assert host.calls == [("fork", {"session": "s-1", "event": "4"})]
    assert host.opened == [("session", "s-2")]
    assert only_line(host) == ("forked s-1 into s-2 · copy", False)
    host = run("/clone", Host(clone={"session": "s-3", "name": None}))
    assert host.calls == [("clone", {"session": "s-1"})]
    assert host.opened == [("session", "s-3")]
    assert only_line(host) == ("cloned s-1 into s-3", False)


def test_refine() -> None:
    host = run("/refine fewer retries", Host(refine={"scheduled": True, "id": "r-9"}))
    assert host.calls == [("refine", {"session": "s-1", "instructions": "fewer retries"})]
    assert only_line(host)[0].startswith("refinement r-9 planning")
    host = run("/refine", Host(refine={"scheduled": False, "reason": "refine is disabled"}))
    assert only_line(host) == ("/refine: not refined: refine is disabled", True)


def test_autonomous() -> None:
    # The daemon's shape (orchestrator/daemon/control_commands.py: autonomous_state).
    state = {
        "mode": "on",
        "turns": 2,
        "tokens": 1500,
        "elapsed_s": 185.0,
        "limits": {"max_turns": 10, "max_tokens": 2_000_000, "timeout_ms": 3_600_000},
        "gates": ["pytest -q"],
        "started_at": "2026-05-09T12:00:00+00:00",
        "stop_reason": None,
    }
    host = run("/autonomous ON", Host(autonomous={"session": "s-1", "autonomous": state}))
    assert host.calls == [("autonomous", {"session": "s-1", "action": "on"})]
    line = "autonomous: on · turns 2/10 · tokens 1.5k/2.0M · 3m 05s/1h 00m · 1 gate(s)"
    assert only_line(host) == (line, False)
    stopped = {**state, "mode": "off", "stop_reason": "turn_limit", "gates": []}
    host = run("/autonomous", Host(autonomous={"session": "s-1", "autonomous": stopped}))
    assert host.calls == [("autonomous", {"session": "s-1", "action": "status"})]
    line = "autonomous: off · turns 2/10 · tokens 1.5k/2.0M · 3m 05s/1h 00m · stopped: turn_limit"
    assert only_line(host) == (line, False)
    never = {"mode": "off", "turns": 0, "tokens": 0, "limits": None, "started_at": None}
    host = run("/autonomous off", Host(autonomous={"session": "s-1", "autonomous": never}))
    assert only_line(host) == ("autonomous: off", False)


def test_export_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    named = {"session": {"id": "s-1", "name": "Fix the build / now"}}
    exported = {"path": "x", "bytes": 1234}
    host = run("/export", Host(get_session=named, export_session=exported))
    target = str(tmp_path / "Fix-the-build-now.jsonl")
    assert host.calls == [
        ("get_session", {"session": "s-1"}),
        ("export_session", {"session": "s-1", "path": target}),
    ]
    assert only_line(host) == ("exported 1,234 bytes to x", False)
    unnamed = {"session": {"id": "s-1", "name": None}}
    host = run("/export out", Host(get_session=unnamed))
    assert host.calls == [("export_session", {"session": "s-1", "path": str(tmp_path / "out")})]
    (tmp_path / "dir").mkdir()
    host = run("/export dir", Host(get_session=unnamed))
    assert host.calls[-1] == (
        "export_session",
        {"session": "s-1", "path": f"{tmp_path}/dir/s-1.jsonl"},
    )
    host = run('/export "my file.jsonl"', Host())
    assert host.calls == [
        ("export_session", {"session": "s-1", "path": f"{tmp_path}/my file.jsonl"})
    ]
    host = run("/export ~/e.jsonl", Host())
    assert host.calls[0][1]["path"] == os.path.expanduser("~/e.jsonl")


@pytest.mark.parametrize(
    "error",
    [
        ApiCommandError("busy", "session s-1 is in a turn"),
        ConnectionClosed("the daemon closed the connection"),
    ],
)
def test_api_errors_are_one_line(error: Exception) -> None:
    host = run("/model openai/b", Host(set_model=error))
    line, is_error = only_line(host)
    assert is_error and line == f"/model: {error.args[0]}"


def test_screens() -> None:
    host = Host()
    for text in ("/tree", "/agents", "/usage", "/help"):
        run(text, host)
    assert host.opened == [("tree", None), ("agents", None), ("usage", None), ("help", None)]
    assert host.calls == [] and host.lines == []
