"""The turn loop against the scripted model (litellm over real HTTP), a real Kernel Gateway and
a real DuckDB file: retries, faults, bad tool input, cell timeouts, bounded output."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.prompts import IPYTHON_TOOL
from orchestrator.models.registry import resolve_model
from orchestrator.paths import Paths
from orchestrator.sessions.runner import RunOptions, RunResult, run_session
from orchestrator.settings import Settings
from orchestrator.store.db import Store
from orchestrator.testing import FakeModelServer

FAST = Settings(
    retry_base_delay_s=0.01,
    model_max_retries=2,
    model_stream_idle_timeout_s=2.0,
    cell_timeout_s=30.0,
    interrupt_grace_s=2.0,
)


async def _run(
    script: str, task: str = "go", settings: Settings = FAST, cwd: Path | None = None
) -> tuple[RunResult, list[tuple[str, dict[str, Any]]], FakeModelServer]:
    paths = Paths.from_env()
    with FakeModelServer(script) as srv:
        model = resolve_model("openai/fake", settings, api_base=srv.url, env={})
        result = await run_session(
            RunOptions(task=task, cwd=cwd or Path.cwd(), backend="local"), model, settings, paths
        )
        requests = srv
    store = await Store.open(paths.database_file, read_only=True)
    try:
        events = [(e.type, e.payload) for e in await store.events(result.session_id)]
    finally:
        await store.close()
    return result, events, requests


def _types(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [t for t, _ in events]


async def test_429_honours_retry_after_then_succeeds() -> None:
    result, events, _ = await _run("429 retry-after=0.2\n---\ntext: fine")
    assert result.outcome.reason == "completed" and result.outcome.final_text == "fine"
    retry = next(p for t, p in events if t == "retry")
    assert retry["delay_s"] == pytest.approx(0.2) and "429" in retry["reason"]


@pytest.mark.parametrize("fault", ["500", "503", "cut 2", "slow 5"])
async def test_transient_faults_are_retried(fault: str) -> None:
    script = f"{fault}\n---\ntext: recovered"
    if fault.startswith("cut"):
        script = f"text: partial words here\n{fault}\n---\ntext: recovered"
    result, events, _ = await _run(script)
    assert result.outcome.final_text == "recovered", events
    assert _types(events).count("retry") == 1


async def test_retries_are_bounded_then_a_typed_error_is_recorded() -> None:
    result, events, srv = await _run("repeat forever:\n    500")
    assert result.outcome.reason == "error"
    assert len(srv.requests) == FAST.model_max_retries + 1
    assert _types(events)[-3:] == ["error", "turn_end", "run_end"]
    assert "gave up after 3 attempts" in events[-3][1]["message"]


async def test_malformed_tool_json_becomes_an_error_result_the_model_can_fix() -> None:
    script = """
    bad-tool-json
    ---
    when "not valid JSON":
        code: print('fixed')
    ---
    when "fixed": text: ok
    """
    result, events, _ = await _run(script)
    assert result.outcome.final_text == "ok"
    results = [p for t, p in events if t == "tool_result"]
    assert results[0]["status"] == "invalid_arguments" and results[0]["is_error"]
    assert results[1]["text"] == "fixed"


async def test_state_persists_and_errors_are_shown() -> None:
    script = """
    code: x = 41
    ---
    code: x += 1; print(x); 1/0
    ---
    text: done
    """
    _, events, _ = await _run(script)
    second = [p for t, p in events if t == "tool_result"][1]
    assert second["text"].startswith("42") and "ZeroDivisionError" in second["text"]
    assert second["status"] == "error"


async def test_cell_timeout_interrupts_and_keeps_the_namespace() -> None:
    script = """
    code: y = 7
    ---
    code: while True: pass
    ---
    code: print(y)
    ---
    text: survived
    """
    settings = FAST.with_overrides(cell_timeout_s=1.0)
    result, events, _ = await _run(script, settings=settings)
    results = [p for t, p in events if t == "tool_result"]
    assert results[1]["status"] == "timeout"
    assert results[2]["text"] == "7" and not results[2]["kernel_restarted"]
    assert result.outcome.final_text == "survived"


async def test_model_may_set_a_cell_timeout_within_the_ceiling() -> None:
    script = """
    call ipython: {"code": "import time; time.sleep(5)", "timeout": 0.5}
    ---
    text: ok
    """
    _, events, _ = await _run(script)
    result = next(p for t, p in events if t == "tool_result")
    assert result["status"] == "timeout" and result["duration_ms"] < 4000


async def test_huge_output_is_bounded_with_the_full_text_in_an_artifact() -> None:
    script = """
    code: print('y' * 3_000_000)
    ---
    text: ok
    """
    _, events, srv = await _run(script)
    result = next(p for t, p in events if t == "tool_result")
    assert len(result["text"]) < 70_000 and "truncated" in result["text"]
    artifact = Path(result["artifact"])
    assert artifact.stat().st_size >= 3_000_000
    assert len(srv.requests[1]["messages"][-1]["content"]) < 70_000


async def test_100_mb_in_one_line_reaches_the_model_as_head_tail_and_an_artifact() -> None:
    # R10: the kernel writes it to a file; the tool result names the file and its size, the
    # model's next request carries that, and the next cell's result holds nothing of it.
    script = """
    code: import sys; sys.stdout.write('x' * 100_000_000)
    ---
    when re "100000000 bytes[)] are in /[^ ]+[.]stdout[.]txt":
        code: print('next cell')
    when re ".":
        text: the artifact was not named
    ---
    text: done
    """
    result, events, srv = await _run(script)
    assert result.outcome.final_text == "done", events
    first, second = (p for t, p in events if t == "tool_result")
    artifact = Path(first["artifact"])
    assert artifact.name.endswith(".stdout.txt") and artifact.stat().st_size == 100_000_000
    assert len(first["text"]) < 70_000 and first["text"].startswith("x" * 1000)
    assert f"full output (100000000 bytes) in {artifact}" in first["text"]
    seen = srv.requests[1]["messages"][-1]["content"]
    assert str(artifact) in seen and len(seen) < 70_000
    assert second["text"] == "next cell" and second["artifact"] is None


async def test_unknown_tool_name_is_an_error_result() -> None:
    script = """
    call shell: {"cmd": "ls"}
    ---
    text: ok
    """
    _, events, _ = await _run(script)
    result = next(p for t, p in events if t == "tool_result")
    assert result["status"] == "unknown_tool" and "only tool is ipython" in result["text"]


async def test_cwd_is_the_sessions_working_directory(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("hello\n")
    script = """
    code: print(open('data.txt').read().strip())
    ---
    text: ok
    """
    _, events, _ = await _run(script, cwd=tmp_path)
    assert next(p for t, p in events if t == "tool_result")["text"] == "hello"


async def test_cancel_records_the_abort_and_leaves_a_result_for_the_open_call() -> None:
    paths = Paths.from_env()
    started = asyncio.Event()

    def sink(event: dict[str, Any]) -> None:
        if event["type"] == "tool_start":
            started.set()

    with FakeModelServer("code: import time; time.sleep(60)") as srv:
        model = resolve_model("openai/fake", FAST, api_base=srv.url, env={})
        task = asyncio.create_task(
            run_session(
                RunOptions(task="sleep", cwd=Path.cwd(), backend="local"),
                model,
                FAST,
                paths,
                sink=sink,
            )
        )
        await asyncio.wait_for(started.wait(), timeout=60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    store_path = paths.database_file
    store = await Store.open(store_path, read_only=True)
    try:
        sessions = await store.list_sessions()
        events = await store.events(sessions[-1].id)
    finally:
        await store.close()
    types = [e.type for e in events]
    assert "aborted" in types and types[-1] == "run_end"
    assert sessions[-1].status == "aborted"
    aborted_result = next(e.payload for e in events if e.type == "tool_result")
    assert aborted_result["status"] == "aborted"


async def test_each_message_is_encoded_once_however_many_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Per step the loop encodes only what is new: each context message once (when it is
    added), the system prompt once per call, the tool schema never (it is a constant). Work
    per step that grows with the history would show here as more encodes (docs/benchmarks.md,
    "Where a step's host CPU goes")."""
    steps = 3
    encoded: list[str] = []
    dumps = json.dumps

    def counting(obj: Any, *args: Any, **kwargs: Any) -> str:
        if obj is IPYTHON_TOOL:
            encoded.append("tool schema")
        elif isinstance(obj, dict) and "role" in obj:
            encoded.append(str(obj["role"]))
        return dumps(obj, *args, **kwargs)

    monkeypatch.setattr(json, "dumps", counting)
    script = "\n---\n".join([f"code: print({k})" for k in range(steps)] + ["text: done"])
    result, _, _ = await _run(script)
    assert result.outcome.final_text == "done"
    calls = steps + 1
    assert sorted(encoded) == sorted(
        ["user"] + ["assistant", "tool"] * steps + ["assistant"] + ["system"] * calls
    )
