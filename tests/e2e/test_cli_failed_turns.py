"""Hold under attack, as a user sees it: real ``prime-agent`` processes, a real daemon, real
kernels, the scripted model over HTTP (docs/agent-loop.md, "A failed turn", "Runaway loops").

- After each model fault (500, a 429 asking for an hour, a garbage body, a cut stream, a stall
  past the idle timeout) the ``-p`` run exits 1 with typed ``turn_end``/``run_end`` events;
  then ``send``, ``--resume -p`` and ``compact`` on that session all work and the next model
  call happens. Once in process (no daemon yet), then through the daemon for every fault.
- A sandbox whose start backoff gives up (its working directory is gone) is marked failed in
  ``sandbox_info``; the session stays ``idle``, and ``sandbox_control restart`` starts it once
  the directory is back.
- The same cell, or malformed tool-call JSON, four times in a row: ``-p`` exits
  ``EXIT_STUCK`` after a bounded number of model calls. Two empty replies: exit 1, nothing on
  stdout.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from orchestrator.agent.stuck import STUCK_REPEAT_LIMIT
from orchestrator.api.client import ControlClient
from orchestrator.cli.common import EXIT_ERROR, EXIT_OK, EXIT_STUCK
from orchestrator.sessions.supervisor import START_MAX_FAILURES
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, stop_daemons, write_config

pytestmark = pytest.mark.timeout(900)

IDLE_TIMEOUT_S: Final = 3.0  # the stall fault times out after this (per attempt)
QUIET_TIMEOUT_S: Final = 90.0
FAULTS: Final = {
    "500": "server_error",
    "429": "rate_limited",
    "garbage": "bad_response",
    "cut": "stream_cut",
    "stall": "timeout",
}
SCRIPT: Final = """
repeat forever:
    when "FAULT-500": 500
    when "FAULT-429": 429 retry-after=3600
    when "FAULT-garbage": garbage
    when "FAULT-cut":
        text: partial words here
        cut 2
    when "FAULT-stall": slow 60
    when "NEXT-": text: next ok
    when "AGAIN-": text: again ok
    when "REPEAT-CELL": code: print('SAME-OUT')
    when "SAME-OUT": code: print('SAME-OUT')
    when "BAD-JSON": bad-tool-json
    when "not valid JSON": bad-tool-json
    when "EMPTY-TWICE": empty
    when "PLEASE-RUN": code: print("hi")
    when "tries again after": code: print("hi")
    when "the sandbox is marked failed": text: giving up
    when "marked failed": code: print('hi')
    when re "^hi$": text: done
    else: text: noted
"""


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelServer]:
    monkeypatch.setenv("PRIME_AGENT_DAEMON_AUTOSTART", "1")
    with FakeModelServer(SCRIPT) as srv:
        write_config(
            "retry_base_delay_s = 0.01\nmodel_max_retries = 1\nwarm_pool_size = 0\n"
            f"model_stream_idle_timeout_s = {IDLE_TIMEOUT_S}\n"
            f'[models."openai/fake"]\napi_base = "{srv.url}"\n'
        )
        yield srv
    stop_daemons(os.environ["XDG_RUNTIME_DIR"])


def _json_run(task: str, *more: str) -> tuple[int, list[dict[str, Any]], str]:
    proc = cli(["-p", task, "--model", "openai/fake", "--mode", "json", *more])
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr


def _last_texts(srv: FakeModelServer) -> list[str]:
    return [str(r["messages"][-1].get("content")) for r in srv.requests]


def _survives(srv: FakeModelServer, sid: str, label: str) -> None:
    """send, --resume -p and compact on a session whose last turn failed."""
    sent = cli(["send", sid, f"NEXT-{label}"])
    assert sent.returncode == 0 and sent.stdout.startswith("delivered"), sent.stderr
    resumed = cli(["--resume", sid, "-p", f"AGAIN-{label}"])
    assert resumed.returncode == EXIT_OK, resumed.stderr
    assert resumed.stdout == "again ok\n"
    texts = _last_texts(srv)
    assert f"NEXT-{label}" in texts  # the send's turn called the model
    assert texts[-1] == f"AGAIN-{label}"
    compacted = cli(["compact", sid])
    assert compacted.returncode == EXIT_OK, compacted.stderr
    assert "cannot be woken" not in compacted.stderr


def test_a_failed_turn_never_kills_the_session(model: FakeModelServer) -> None:
    # In process (no daemon runs): the failed run's session is left wakeable.
    first = _json_run("FAULT-500 first")
    code, lines, err = first
    assert code == EXIT_ERROR and "server error (500)" in err
    sid = lines[0]["id"]
    assert lines[-1]["type"] == "run_end"
    assert lines[-1]["payload"]["error_class"] == "server_error"
    _survives(model, sid, "in-process")

    # Through the daemon (started by `send` above), every fault.
    for fault, error_class in FAULTS.items():
        before = len(model.requests)
        code, lines, err = _json_run(f"FAULT-{fault} go")
        assert code == EXIT_ERROR, (fault, err)
        # One error line (after the local backend's warning that it isolates nothing).
        errors = [line for line in err.splitlines() if not line.startswith("prime-agent: warning:")]
        assert len(errors) == 1 and errors[0].startswith("prime-agent: error: "), err
        sid = lines[0]["id"]
        ends = [e["payload"] for e in lines if e.get("type") == "turn_end"]
        assert ends == [{"reason": "error", "error_class": error_class}], (fault, lines)
        assert lines[-1]["type"] == "run_end" and lines[-1]["payload"]["reason"] == "error"
        assert len(model.requests) > before
        _survives(model, sid, fault)


def test_runaway_loops_stop_with_their_own_exit_code(model: FakeModelServer) -> None:
    # In process, then the same through a daemon.
    for task in ("REPEAT-CELL", "BAD-JSON", "start a daemon", "REPEAT-CELL", "BAD-JSON"):
        if task == "start a daemon":
            assert cli(["daemon", "start"]).returncode == 0
            continue
        before = len(model.requests)
        proc = cli(["-p", task, "--model", "openai/fake", "--mode", "json"])
        assert proc.returncode == EXIT_STUCK, proc.stderr
        assert "the run stopped: stuck" in proc.stderr
        assert len(model.requests) - before == STUCK_REPEAT_LIMIT  # bounded
        lines = [json.loads(line) for line in proc.stdout.splitlines()]
        results = [e["payload"] for e in lines if e.get("type") == "tool_result"]
        assert results[-1]["status"] == "stuck"
        assert lines[-1]["type"] == "run_end" and lines[-1]["payload"]["reason"] == "stuck"

    before = len(model.requests)
    empty = cli(["-p", "EMPTY-TWICE", "--model", "openai/fake"])
    assert empty.returncode == EXIT_ERROR and empty.stdout == "", empty.stderr
    assert "empty reply" in empty.stderr
    assert len(model.requests) - before == 2  # asked once more, then an error


def test_a_failed_sandbox_start_does_not_fail_the_session(
    model: FakeModelServer, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    # A session with no sandbox running and no snapshot: its next cell starts one.
    code, lines, err = _json_run("hello", "--cwd", str(project))
    assert code == EXIT_OK, err
    sid = lines[0]["id"]
    shutil.rmtree(project)  # every start of its sandbox fails now
    assert cli(["daemon", "start"]).returncode == 0

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[Any]]:
        async with await ControlClient.connect() as client:
            await client.call("prompt", session=sid, text="PLEASE-RUN")
            await client.call("wait_quiet", session=sid, timeout_s=QUIET_TIMEOUT_S)
            failed = await client.call("sandbox_info", session=sid)
            project.mkdir()  # the cause is fixed: a restart starts the sandbox
            restarted = await client.call("sandbox_control", session=sid, action="restart")
            await client.call("prompt", session=sid, text="PLEASE-RUN again")
            await client.call("wait_quiet", session=sid, timeout_s=QUIET_TIMEOUT_S)
            after = await client.call("sandbox_info", session=sid)
            replay = await client.call("attach", session=sid, cursor=0)
            return failed, restarted, after, replay["events"]

    failed, restarted, after, events = asyncio.run(scenario())
    results = [e["payload"] for e in events if e["type"] == "tool_result"]
    assert failed["status"] == "idle" and failed["sandbox"] is None  # the session is fine
    assert failed["sandbox_failed"]["failures"] == START_MAX_FAILURES, results
    assert "not a directory" in failed["sandbox_failed"]["error"]
    assert restarted["status"] == "idle" and restarted["sandbox"] is not None
    assert "sandbox_failed" not in after
    assert [r["status"] for r in results[:-1]] == ["sandbox_error"] * (START_MAX_FAILURES + 1)
    assert "the sandbox is marked failed" in results[-2]["text"]
    assert results[-1]["status"] == "ok" and results[-1]["text"] == "hi"
