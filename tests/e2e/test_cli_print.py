"""prime-agent -p / --mode json as a user runs it: a real subprocess, litellm over real HTTP to
the scripted model, a real Kernel Gateway, a real DuckDB file."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from orchestrator.agent.prompts import FENCED_TURN_REMINDER
from orchestrator.paths import Paths
from orchestrator.sandbox.choice import LOCAL_WARNING
from orchestrator.store.db import Store
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, need, write_config

FAST_RETRIES = "retry_base_delay_s = 0.01\nmodel_max_retries = 2\n"

COMPUTE = """
text: Let me compute.
code: print(6 * 7)
usage in=120 out=12
---
when "42":
    text: The answer is 42.
    usage in=150 out=6
"""


def _events(session_id: str | None = None) -> tuple[str, list[tuple[str, dict[str, object]]]]:
    async def read() -> tuple[str, list[tuple[str, dict[str, object]]]]:
        store = await Store.open(Paths.from_env().database_file, read_only=True)
        try:
            sid = session_id or (await store.list_sessions())[-1].id
            return sid, [(e.type, e.payload) for e in await store.events(sid)]
        finally:
            await store.close()

    return asyncio.run(read())


@pytest.fixture
def model() -> FakeModelServer:
    write_config(FAST_RETRIES)
    srv = FakeModelServer(COMPUTE).start()
    yield srv  # type: ignore[misc]
    srv.close()


def test_print_mode_prints_only_the_final_answer(model: FakeModelServer) -> None:
    proc = cli(["-p", "what is 6*7?", "--model", "openai/fake", "--api-base", model.url])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "The answer is 42.\n"
    # The second request carried the cell's real output back to the model.
    tool_msgs = [m for m in model.requests[1]["messages"] if m["role"] == "tool"]
    assert tool_msgs and "42" in tool_msgs[0]["content"]
    _, events = _events()
    types = [t for t, _ in events]
    assert types == [
        "user_message",
        "assistant_message",
        "usage",
        "tool_result",
        "assistant_message",
        "usage",
        "turn_end",
        "run_end",
    ]
    usage = events[2][1]
    assert (usage["input"], usage["output"], usage["cost_usd"]) == (120, 12, None)


def test_stdin_task_when_not_a_terminal(model: FakeModelServer) -> None:
    proc = cli(["--model", "openai/fake", "--api-base", model.url], input="what is 6*7?\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "The answer is 42.\n"
    assert model.requests[0]["messages"][-1]["content"] == "what is 6*7?"


def test_json_mode_streams_every_durable_event(model: FakeModelServer) -> None:
    proc = cli(["-p", "6*7", "--mode", "json", "--model", "openai/fake", "--api-base", model.url])
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert lines[0]["type"] == "session" and lines[0]["version"] == 3
    durable = [e for e in lines if "seq" in e]
    assert [e["seq"] for e in durable] == list(range(1, len(durable) + 1))
    assert any(e["type"] == "text_delta" for e in lines)
    _sid, events = _events(lines[0]["id"])
    # Everything the client saw as durable is in the database, in order, with the same payload.
    assert [(e["type"], e["payload"]) for e in durable] == events
    assert durable[-1]["type"] == "run_end" and durable[-1]["payload"]["reason"] == "completed"


def test_usage_and_export(model: FakeModelServer) -> None:
    assert cli(["-p", "x", "--model", "openai/fake", "--api-base", model.url]).returncode == 0
    sid, _ = _events()
    usage = cli(["usage"])
    assert usage.returncode == 0, usage.stderr
    row = next(line for line in usage.stdout.splitlines() if line.startswith(sid))
    assert "unknown" in row and "270" in row  # 120 + 150 input tokens, price unknown
    exported = cli(["export", sid, "--format", "jsonl"])
    assert exported.returncode == 0, exported.stderr
    entries = [json.loads(line) for line in exported.stdout.splitlines()]
    assert entries[0]["type"] == "session" and entries[0]["version"] == 3
    roles = [e["message"]["role"] for e in entries if e["type"] == "message"]
    assert roles == ["user", "assistant", "toolResult", "assistant"]


def test_fenced_protocol_model_from_config(tmp_path: Path) -> None:
    script = """
    text: I will compute it.
    code: print(sum(i * i for i in range(1, 101)))
    ---
    when "338350": text: 338350
    """
    with FakeModelServer(script) as srv:
        write_config(
            FAST_RETRIES
            + f'[models."openai/tiny"]\napi_base = "{srv.url}"\ntool_protocol = "fenced"\n'
        )
        proc = cli(["-p", "sum of squares 1..100", "--model", "openai/tiny"])
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "338350\n"
        assert "tools" not in srv.requests[0]
        # The task reaches a fenced model with the reminder to run code first, in the request
        # only; the code's output (the next request's last message) has none.
        first = srv.requests[0]["messages"][-1]
        assert first["content"] == "sum of squares 1..100" + FENCED_TURN_REMINDER
        second = srv.requests[1]["messages"][-1]
        assert second["role"] == "user" and "338350" in second["content"]
        assert FENCED_TURN_REMINDER not in second["content"]
        assert srv.requests[1]["messages"][1]["content"] == "sum of squares 1..100"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-p", "x", "--model", "gpt-4o"], "provider/name"),
        (["-p", "x", "--model", "openai/gpt-4o-mini"], "OPENAI_API_KEY"),
        (["-p", "x", "--model", "nosuch/model"], "unknown provider"),
        (["-p", "x", "--mode", "xml"], "xml"),
        (["-p", "x", "--cwd", "/nonexistent/dir"], "not a directory"),
        (["-p", "x", "--backend", "nosuch"], "nosuch"),
        (["-p", "x", "--api-base", "http://127.0.0.1:9/v1"], "--api-base needs --model"),
        (["export", "s-doesnotexist"], "no session"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(args: list[str], needle: str) -> None:
    write_config(FAST_RETRIES)
    proc = cli(args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_unreachable_endpoint_is_a_user_error() -> None:
    write_config(FAST_RETRIES)
    proc = cli(["-p", "x", "--model", "openai/fake", "--api-base", "http://127.0.0.1:9/v1"])
    assert proc.returncode == 2, proc.stderr
    assert "cannot reach the model endpoint" in proc.stderr
    assert "Traceback" not in proc.stderr
    # The failed run is still on record.
    _, events = _events()
    assert [t for t, _ in events][-3:] == ["error", "turn_end", "run_end"]


def test_bad_config_file_is_one_line() -> None:
    write_config("cell_timeout_s = 'soon'\n")
    proc = cli(["-p", "x"])
    assert proc.returncode == 2
    assert "config.toml" in proc.stderr and "cell_timeout_s" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_debug_shows_the_traceback() -> None:
    proc = cli(["-p", "x", "--model", "gpt-4o", "--debug"])
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def test_no_provider_key_reaches_the_kernel(model: FakeModelServer) -> None:
    script = """
    code: import os; print(sorted(k for k in os.environ if 'KEY' in k or 'SECRET' in k))
    ---
    text: done
    """
    model.load(script)
    env_key = "sk-planted-secret-value"
    os.environ["OPENAI_API_KEY"] = env_key
    try:
        proc = cli(["-p", "env", "--model", "openai/fake", "--api-base", model.url])
    finally:
        del os.environ["OPENAI_API_KEY"]
    assert proc.returncode == 0, proc.stderr
    tool_msg = next(m for m in model.requests[1]["messages"] if m["role"] == "tool")
    assert env_key not in tool_msg["content"]
    assert "OPENAI_API_KEY" not in tool_msg["content"]


def test_print_mode_on_the_docker_backend(model: FakeModelServer) -> None:
    from orchestrator.sandbox.docker import docker_usable

    usable, why = docker_usable()
    if not usable:
        need("docker", why)
    proc = cli(
        ["-p", "6*7", "--backend", "docker", "--model", "openai/fake", "--api-base", model.url]
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "The answer is 42.\n"
    assert LOCAL_WARNING not in proc.stderr


ROUTE_SCRIPT = """
code:
    rows = open("/proc/net/route").read().splitlines()[1:]
    print("default route", any(r.split()[1] == "00000000" for r in rows))
---
text: checked
"""


@pytest.mark.parametrize(("flag", "expected"), [("--no-network", "False"), ("--network", "True")])
def test_network_is_off_by_default_and_granted_explicitly(flag: str, expected: str) -> None:
    """Looks at the routing table only: no packet leaves the machine."""
    from orchestrator.sandbox.docker import docker_usable

    usable, why = docker_usable()
    if not usable:
        need("docker", why)
    with FakeModelServer(ROUTE_SCRIPT) as srv:
        proc = cli(
            [
                "-p",
                "x",
                "--backend",
                "docker",
                flag,
                "--model",
                "openai/fake",
                "--api-base",
                srv.url,
            ]
        )
        assert proc.returncode == 0, proc.stderr
        tool = next(m for m in srv.requests[1]["messages"] if m["role"] == "tool")
    assert tool["content"] == f"default route {expected}"
