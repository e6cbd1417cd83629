"""``prime-agent compact ID [INSTRUCTIONS]`` as a user runs it: a real daemon (started by the
CLI), a real kernel, the scripted model; the answer line, the exit status, the summary call
carrying the instructions, the recorded compaction."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Final

import pytest

from orchestrator.cli.compact import describe
from orchestrator.paths import Paths
from orchestrator.store.db import Store
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, stop_daemons, write_config

SCRIPT: Final = """
repeat forever:
    when "Write the notes in Markdown": text: ## Goal\\nnotes from the summariser
    when "big task": code: print("alpha " + "x" * 6000)
    when "alpha ": code: print("beta " + "x" * 6000)
    when "beta ": text: done
"""


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelServer]:
    monkeypatch.setenv("PRIME_AGENT_DAEMON_AUTOSTART", "1")
    with FakeModelServer(SCRIPT) as srv:
        write_config(
            "retry_base_delay_s = 0.01\nmodel_max_retries = 1\n"
            f'[models."openai/fake"]\napi_base = "{srv.url}"\n'
            "[compaction]\nkeep_recent_tokens = 500\n"
        )
        yield srv
    stop_daemons(os.environ["XDG_RUNTIME_DIR"])


def test_compact_through_the_daemon(model: FakeModelServer) -> None:
    run = cli(["-p", "big task", "--model", "openai/fake"])
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "done"
    done = cli(["compact", "big task", "keep the alpha numbers"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("compacted s-") and "tokens" in done.stdout
    summary_requests = [
        r for r in model.requests if "Write the notes" in str(r["messages"][-1]["content"])
    ]
    assert len(summary_requests) == 1
    assert "keep the alpha numbers" in summary_requests[0]["messages"][-1]["content"]
    again = cli(["compact", "big task"])  # only the kept span is left: nothing to do
    assert again.returncode == 0 and "not compacted (nothing_to_compact)" in again.stdout
    cli(["daemon", "stop"])

    async def recorded() -> list[str]:
        store = await Store.open(Paths.from_env().database_file, read_only=True)
        try:
            found = await store.find_session("big task")
            assert found is not None
            return [
                e.payload["reason"] for e in await store.events(found.id) if e.type == "compaction"
            ]
        finally:
            await store.close()

    assert asyncio.run(recorded()) == ["manual"]


def test_describe_maps_answers_to_lines_and_exit_codes() -> None:
    assert describe({"session": "s", "compacted": True, "tokens_before": 9, "tokens_after": 3}) == (
        "compacted s: 9 -> 3 tokens",
        0,
    )
    assert describe({"session": "s", "scheduled": True, "message": "m"})[1] == 0
    assert describe({"reason": "nothing_to_compact", "message": "short"})[1] == 0
    assert describe({"reason": "summary_failed", "message": "boom"}) == (
        "not compacted (summary_failed): boom",
        1,
    )
