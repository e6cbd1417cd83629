"""``prime-agent model``, ``harness set|list|rm|log`` as a user runs them: a real daemon (started
by the CLI), a real kernel, the scripted model; what the next model call sees."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any, Final

import pytest

from orchestrator.paths import Paths
from orchestrator.store.db import Store
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, stop_daemons, write_config

SCRIPT: Final = """
repeat forever:
    when "first task": text: first done
    when "second task": text: second done
    when "third task": text: third done
"""


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelServer]:
    monkeypatch.setenv("PRIME_AGENT_DAEMON_AUTOSTART", "1")
    with FakeModelServer(SCRIPT) as srv:
        write_config(
            "retry_base_delay_s = 0.01\nmodel_max_retries = 1\n"
            f'[models."openai/fake"]\napi_base = "{srv.url}"\n'
            f'[models."openai/other"]\napi_base = "{srv.url}"\n'
        )
        yield srv
    stop_daemons(os.environ["XDG_RUNTIME_DIR"])


def _system(request: dict[str, Any]) -> str:
    return str(request["messages"][0]["content"])


async def _events(selector: str) -> list[tuple[str, dict[str, Any]]]:
    store = await Store.open(Paths.from_env().database_file, read_only=True)
    try:
        found = await store.find_session(selector)
        assert found is not None
        return [(e.type, e.payload) for e in await store.events(found.id)]
    finally:
        await store.close()


def test_model_switch_applies_from_the_next_turn(model: FakeModelServer) -> None:
    first = cli(["-p", "first task", "--model", "openai/fake"])
    assert first.returncode == 0, first.stderr
    switched = cli(["model", "first task", "openai/other"])
    assert switched.returncode == 0, switched.stderr
    assert "openai/fake -> openai/other" in switched.stdout
    second = cli(["-p", "second task", "--resume", "first task"])
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "second done"
    assert [r["model"] for r in model.requests] == ["fake", "other"]
    assert "Model: openai/other" in _system(model.requests[-1])
    bad = cli(["model", "first task", "nope/unknown-model"])
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    cli(["daemon", "stop"])
    events = asyncio.run(_events("first task"))
    changes = [p for t, p in events if t == "model_change"]
    assert changes == [
        {
            "model": "openai/other",
            "previous": "openai/fake",
            "api_base": model.url,  # both endpoints are named (the config's here)
            "previous_api_base": model.url,
        }
    ]


def test_user_harness_edits_show_in_the_next_prompt_and_the_log(model: FakeModelServer) -> None:
    first = cli(["-p", "first task", "--model", "openai/fake"])
    assert first.returncode == 0, first.stderr
    local = cli(["harness", "set", "memory", "Build tool", "use make", "--session", "first task"])
    assert local.returncode == 0, local.stderr
    assert local.stdout.strip() == "local:memory:build_tool v1"
    glob = cli(["harness", "set", "prompt", "Be brief", "answer in one line", "--global"])
    assert glob.returncode == 0, glob.stderr
    listed = cli(["harness", "list", "first task", "--json"])
    ids = sorted((e["scope"], e["id"]) for e in json.loads(listed.stdout))
    assert ids == [("global", "be_brief"), ("local", "build_tool")]
    second = cli(["-p", "second task", "--resume", "first task"])
    assert second.returncode == 0, second.stderr
    prompt = _system(model.requests[-1])
    assert "build_tool] Build tool: use make" in prompt and "be_brief] Be brief" in prompt
    # A stale version is refused and changes nothing.
    where = ["--session", "first task", "--id", "build_tool", "--version", "7"]
    stale = cli(["harness", "set", "memory", "Build tool", "use ninja", *where])
    assert stale.returncode == 2 and "version" in stale.stderr, stale.stderr
    removed = cli(["harness", "rm", "memory", "build_tool", "--session", "first task"])
    assert removed.returncode == 0 and "deleted (v2)" in removed.stdout, removed.stderr
    third = cli(["-p", "third task", "--resume", "first task"])
    assert third.returncode == 0, third.stderr
    assert "Build tool" not in _system(model.requests[-1])
    assert "be_brief] Be brief" in _system(model.requests[-1])
    log = cli(["harness", "log", "first task"])
    assert log.returncode == 0, log.stderr
    lines = log.stdout.splitlines()
    assert len(lines) == 3 and all("[user]" in line for line in lines), log.stdout
    assert "local:memory:build_tool deleted" in lines[0]


PLAN: Final = (
    '{"summary": "remember the build tool", "rationale": "the user said make", '
    '"expected_outcome": "no questions about building", "edits": [{"action": "create", '
    '"kind": "memory", "title": "Build tool", "content": "use make", "reason": "said so"}]}'
)
REFINE_SCRIPT: Final = f"""
repeat forever:
    when "<current_harness_state>": text: {PLAN}
    when "first task": text: first done
    when "second task": text: second done
    when "third task": text: third done
"""


@pytest.fixture
def planner(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelServer]:
    monkeypatch.setenv("PRIME_AGENT_DAEMON_AUTOSTART", "1")
    with FakeModelServer(REFINE_SCRIPT) as srv:
        write_config(
            "retry_base_delay_s = 0.01\nmodel_max_retries = 1\n"
            f'[models."openai/fake"]\napi_base = "{srv.url}"\n'
            "[harness]\noutcome_turns = 1\n"
        )
        yield srv
    stop_daemons(os.environ["XDG_RUNTIME_DIR"])


def test_refine_from_the_cli_applies_measures_and_rolls_back(planner: FakeModelServer) -> None:
    first = cli(["-p", "first task", "--model", "openai/fake"])
    assert first.returncode == 0, first.stderr
    refined = cli(["refine", "first task", "note the build tool", "--wait"])
    assert refined.returncode == 0, refined.stderr
    assert " applied 1 applied, 0 rejected — remember the build tool" in refined.stdout
    ref_id = refined.stdout.split()[0]
    listed = json.loads(cli(["harness", "list", "first task", "--json"]).stdout)
    assert [(e["id"], e["source"], e["content"]) for e in listed] == [
        ("build_tool", "refine", "use make")
    ]
    again = cli(["-p", "third task", "--resume", "first task"])  # one turn after it
    assert again.returncode == 0, again.stderr
    assert "Build tool: use make" in _system(planner.requests[-1])
    undo = cli(["refine", "rollback", ref_id])
    assert undo.returncode == 0, undo.stderr
    assert f"(rollback of {ref_id})" in undo.stdout
    assert json.loads(cli(["harness", "list", "first task", "--json"]).stdout) == []
    log = cli(["harness", "log", "first task"]).stdout
    measured = [line for line in log.splitlines() if f"  refine {ref_id} " in line]
    assert len(measured) == 1, log
    assert "expected: no questions about building" in measured[0]
    assert "measured: " in measured[0] and "over 1 turn" in measured[0], measured[0]
    assert log.count("local:memory:build_tool") == 2  # created, then deleted by the rollback
    # --no-refine: that session refuses /refine in one line
    locked = cli(["-p", "second task", "--model", "openai/fake", "--no-refine"])
    assert locked.returncode == 0, locked.stderr
    refused = cli(["refine", "second task"])
    assert refused.returncode == 1
    assert refused.stdout.strip() == "not refined: refine is disabled for this session"
