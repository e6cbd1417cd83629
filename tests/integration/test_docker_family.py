# ruff: noqa: E501  (the script below is data: long lines are the model's cells)
"""Issue 4: a three-level family, every session in its own container, talking over NATS
(the containers have no network: the bus reaches them through the per-container relay)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.models.registry import resolve_model
from orchestrator.paths import Paths
from orchestrator.sessions.runner import RunOptions, run_session
from orchestrator.settings import Settings
from orchestrator.store.db import Store
from orchestrator.testing import FakeModelServer
from tests.helpers import need

THREE_LEVELS = """
repeat forever:
    when "[message from child leaf":
        code: await agent_message.send("mid heard leaf"); print("forwarded")
    when "[message from child mid":
        text: root heard mid
    when "be the leaf":
        code: import os; r = await agent_message.send(f"leaf in container {os.path.exists('/.dockerenv')}"); print("leaf sent", r.status)
    when "be the middle":
        code: await rlm("be the leaf", name="leaf"); print("leaf spawned")
    when "three levels":
        code: await rlm("be the middle", name="mid"); print("mid spawned")
    else:
        text: ok
"""


async def test_three_level_family_across_containers(tmp_path: Path) -> None:
    from orchestrator.sandbox.docker import docker_usable

    usable, why = docker_usable()
    if not usable:
        need("docker", why)
    # The sandbox user must be able to write the workspace (docs/docker.md).
    tmp_path.chmod(0o777)
    settings = Settings(max_depth=2, retry_base_delay_s=0.01)
    paths = Paths.from_env()
    with FakeModelServer(THREE_LEVELS) as srv:
        model = resolve_model("openai/fake", settings, api_base=srv.url, env={})
        result = await run_session(
            RunOptions(task="three levels", cwd=tmp_path, backend="docker"), model, settings, paths
        )
    assert result.outcome.final_text == "root heard mid"
    store = await Store.open(paths.database_file, read_only=True)
    try:
        by_name = {s.name: s for s in await store.list_sessions()}
        mid_in = [
            e.payload["text"]
            for e in await store.events(by_name["mid"].id)
            if e.type == "user_message" and e.payload["source"] == "agent"
        ]
        root_in = [
            e.payload["text"]
            for e in await store.events(by_name["three levels"].id)
            if e.type == "user_message" and e.payload["source"] == "agent"
        ]
    finally:
        await store.close()
    assert mid_in == ["leaf in container True"]
    assert root_in == ["mid heard leaf"]
    assert all(s.backend == "docker" for s in by_name.values())
