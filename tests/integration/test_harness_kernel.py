# ruff: noqa: E501  (scripts below are data: long code lines are the model's cells)
"""``rlm.harness`` end to end (issue 7): a real nats-server with per-session users, real kernels
(local backend), the scripted model over real HTTP, a real DuckDB file.

A cell creates a memory, reads it, updates it with the version it read; an update with that
(now stale) version raises ``Conflict`` and changes nothing. A child session reads its root's
local entries and writes into them; a global entry (a proposal, once the user accepted it) is
visible from another root, whose own tree's local entries stay invisible to it (nor can it roll
back another tree's refinement).
A skill whose module the cell wrote is called.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Final

from orchestrator.harness.proposals import accept_proposal
from orchestrator.models.registry import ResolvedModel, resolve_model
from orchestrator.sessions.live import Inbound, LiveSession
from orchestrator.sessions.manager import Orchestrator
from orchestrator.settings import Settings
from orchestrator.store import harness as harness_store
from orchestrator.store.events import UserMessagePayload
from orchestrator.store.proposals import select_proposals
from orchestrator.testing import FakeModelServer
from tests.integration.test_compaction import orchestrator as orchestrator_for

MODEL: Final = "openai/fake"
QUIET_TIMEOUT_S: Final = 120.0
CFG: Final = Settings(retry_base_delay_s=0.01, model_max_retries=0, cell_timeout_s=60.0)

SCRIPT: Final = """
repeat forever:
    when "remember the deploy":
        code:
            from orchestrator.runtime.errors import Conflict
            made = await rlm.harness.create_memory("Deploy notes", "use make deploy", reason="learned it")
            read = await rlm.harness.get("memory", "deploy_notes")
            newer = await rlm.harness.update_memory("deploy_notes", content="use make release", version=read.version)
            try:
                await rlm.harness.update_memory("deploy_notes", content="stale edit", version=read.version)
            except Conflict as exc:
                print("CONFLICT", exc.code)
            now = await rlm.harness.get("memory", "deploy_notes")
            team = await rlm.harness.create_prompt("Team style", "tabs, not spaces", scope="global")
            listed = await rlm.harness.list()
            versions = await rlm.harness.history("memory", "deploy_notes")
            print("MADE", made.id, made.version, newer.version, now.version, repr(now.content))
            print("LISTED", [e.qualified_id for e in listed], team.owner, team.proposal[:2])
            print("VERSIONS", [(v.version, v.source, v.reason) for v in versions])
    when "MADE":
        text: remembered
    when "ask the kid":
        code: h = await rlm("check the notes", name="kid"); print("SPAWNED", h.name)
    when "SPAWNED":
        text: waiting for the kid
    when "[task from parent]":
        code:
            seen = await rlm.harness.get("memory", "deploy_notes")
            mine = await rlm.harness.create_memory("Kid finding", "the kid was here")
            r = await agent_message.send(f"KID saw {seen.content} v{seen.version} in {seen.scope}; wrote {mine.qualified_id}")
            print("KIDSENT", r.status)
    when "KIDSENT":
        text: kid done
    when "[message from child":
        text: heard the kid
    when "use the skill":
        code:
            open("harness_itest_skill.py", "w").write("def double(x):\\n    return 2 * x\\n")
            await rlm.harness.create_skill("Double", "doubles a number", reference={"type": "python", "import": "harness_itest_skill", "callable": "double"}, arguments={"x": "a number"})
            print("SKILLED", await rlm.harness.call_skill("double", x=21))
    when "SKILLED":
        text: skill works
    when "look around":
        code:
            from orchestrator.runtime.errors import NotFound
            seen = await rlm.harness.list()
            try:
                await rlm.harness.get("memory", "deploy_notes")
            except NotFound:
                print("NOTFOUND local deploy_notes")
            try:
                await refine.rollback("r-not-this-trees")
            except NotFound:
                print("NOROLLBACK")
            status = await refine.status()
            print("REFINE", status.in_flight, status.pending)
            print("OTHER", sorted(e.qualified_id for e in seen), (await rlm.harness.get("prompt", "team_style")).content)
    when "OTHER":
        text: looked
    else:
        text: unexpected
"""


def orchestrator() -> contextlib.AbstractAsyncContextManager[Orchestrator]:
    """An orchestrator with the NATS bus and the host handlers (as print mode builds it)."""
    return orchestrator_for(CFG)


def fake_model(srv: FakeModelServer) -> ResolvedModel:
    return resolve_model(MODEL, CFG, api_base=srv.url, env={})


async def turn(orch: Orchestrator, live: LiveSession, text: str) -> str:
    """Run one turn of ``live``'s tree to quiet; return the text of its cells' output."""
    before = len(await orch.store.events(live.id))
    orch.submit(live, Inbound(UserMessagePayload(text=text)))
    await orch.wait_quiet(live.record.root_id, QUIET_TIMEOUT_S)
    events = (await orch.store.events(live.id))[before:]
    return "\n".join(str(e.payload["text"]) for e in events if e.type == "tool_result")


async def test_a_cell_edits_its_harness_and_a_stale_version_changes_nothing(
    tmp_path: Path,
) -> None:
    async with orchestrator() as orch:
        with FakeModelServer(SCRIPT) as srv:
            root = await orch.create_session(model=fake_model(srv), cwd=tmp_path, name="root")
            out = await turn(orch, root, "remember the deploy command")
            assert root.last_outcome is not None
            assert root.last_outcome.final_text == "remembered", out
            skill_out = await turn(orch, root, "use the skill")
        versions = await orch.store.read(
            lambda con: harness_store.select_versions(con, root.id, "memory", "deploy_notes")
        )
    lines = dict(line.split(" ", 1) for line in out.strip().splitlines())
    assert lines["CONFLICT"] == "conflict"
    assert lines["MADE"] == "deploy_notes 1 2 2 'use make release'"
    # the global prompt is a proposal: not listed (nor in any prompt) until the user accepts it
    assert lines["LISTED"] == "['local:deploy_notes'] global p-"
    assert lines["VERSIONS"] == "[(1, 'agent', 'learned it'), (2, 'agent', '')]"
    # the refused write left nothing behind: two versions, both by the root's own session
    assert [(v.version, v.content) for v in versions] == [
        (1, "use make deploy"),
        (2, "use make release"),
    ]
    assert {(v.owner, v.session_id, v.source) for v in versions} == {(root.id, root.id, "agent")}
    assert skill_out.strip() == "SKILLED 42"


async def test_a_child_shares_its_roots_local_entries_and_globals_cross_trees(
    tmp_path: Path,
) -> None:
    async with orchestrator() as orch:
        with FakeModelServer(SCRIPT) as srv:
            root = await orch.create_session(model=fake_model(srv), cwd=tmp_path, name="root")
            await turn(orch, root, "remember the deploy command")
            await turn(orch, root, "ask the kid to check")
            pending = await orch.store.read(
                lambda con: select_proposals(con, status="pending", limit=5)
            )
            assert [(p.target, p.session_id) for p in pending] == [
                ("global:prompt:team_style", root.id)
            ]
            await orch.store.transaction(lambda con: accept_proposal(con, pending[0].id))
            other_cwd = tmp_path / "other"
            other_cwd.mkdir()
            other = await orch.create_session(model=fake_model(srv), cwd=other_cwd, name="other")
            other_out = await turn(orch, other, "look around")
        kid = next(s for s in orch.family(root.id) if s.name == "kid")
        root_messages = [
            str(e.payload["text"])
            for e in await orch.store.events(root.id)
            if e.type == "user_message"
        ]
        local = await orch.store.read(
            lambda con: harness_store.select_entries(con, [root.id], "memory")
        )
    heard = [m for m in root_messages if "KID saw" in m]
    assert len(heard) == 1, root_messages
    assert "KID saw use make release v2 in local; wrote local:kid_finding" in heard[0]
    # the child wrote into its root's tree, recorded as its own write
    finding = next(e for e in local if e.id == "kid_finding")
    assert (finding.owner, finding.session_id) == (root.id, kid.id)
    assert sorted(e.id for e in local) == ["deploy_notes", "kid_finding"]
    # another root: the global entry, none of the first tree's local ones
    assert "NOTFOUND local deploy_notes" in other_out
    assert "OTHER ['global:team_style'] tabs, not spaces" in other_out
    # refine.* reach the orchestrator's refiner: nothing in flight, no other tree's rollback
    assert "NOROLLBACK" in other_out and "REFINE None []" in other_out
