# ruff: noqa: E501  (scripts below are data: long code lines are the model's cells)
"""The family is parent, children and siblings, not every root (issue 15, R18).

Two unrelated roots in one orchestrator, in different projects, with real NATS (per-session
users), real kernels and the scripted model over HTTP. Root A's kernel cannot observe root B
(``agent_observe.recent`` / ``get`` / ``list``) nor message it (``agent_message.send`` as a
sibling or a child), by name or by session id: every call is ``NotFamily``, B is not listed,
and B's history holds nothing of A. Siblings under one parent still observe and message each
other.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.ids import new_session_id
from orchestrator.models.registry import ResolvedModel, resolve_model
from orchestrator.paths import Paths
from orchestrator.sandbox.local import LocalBackend
from orchestrator.sessions.bus_link import NatsSessionBus
from orchestrator.sessions.family import FamilyService
from orchestrator.sessions.live import Inbound
from orchestrator.sessions.manager import Orchestrator
from orchestrator.store.db import Store
from orchestrator.store.events import UserMessagePayload
from orchestrator.testing import FakeModelServer
from tests.integration.test_family import FAST

QUIET_TIMEOUT_S = 120.0
SECRET = "PAPAYA"
B_ID = new_session_id()

SCRIPT = f"""
repeat forever:
    when "keep a secret":
        text: the secret is {SECRET}
    when "[subagent":
        text: noted
    when "probe the other root":
        code:
            out = []
            for who in ("bee", {B_ID!r}):
                calls = (
                    lambda: agent_observe.recent(who),
                    lambda: agent_observe.get(who),
                    lambda: agent_message.send("hi from ant", receiver_role="sibling", receiver_name=who),
                    lambda: agent_message.send("hi from ant", receiver_role="child", receiver_name=who),
                )
                for call in calls:
                    try:
                        got = await call()
                        out.append(f"ok {{got}}")
                    except Exception as e:
                        out.append(type(e).__name__)
            fam = await agent_message.list_agents()
            seen = await agent_observe.list()
            print("probe", out, "siblings", len(fam.siblings), "observed", len(seen))
    when "probe [":
        code:
            await rlm("wait for your sibling", name="k2")
            await rlm("watch your sibling", name="k1")
            print("spawned")
    when "spawned":
        text: waiting for k1
    when "wait for your sibling":
        text: k2 here
    when "watch your sibling":
        code:
            import asyncio
            for _ in range(400):
                texts = [m.text for m in await agent_observe.recent("k2")]
                if "k2 here" in texts:
                    break
                await asyncio.sleep(0.05)
            seen = await agent_observe.get("k2")
            r = await agent_message.send("hello k2", receiver_role="sibling", receiver_name="k2")
            print("k1 saw", texts, seen.relationship, r.status)
    when "k1 saw":
        text: k1 done
    when "hello k2":
        text: k2 got it
"""


async def test_a_root_cannot_observe_or_message_an_unrelated_root(tmp_path: Path) -> None:
    paths = Paths.from_env()
    project_a, project_b = tmp_path / "project-a", tmp_path / "project-b"
    project_a.mkdir()
    project_b.mkdir()
    with FakeModelServer(SCRIPT) as srv:

        async def resolve(selector: str) -> ResolvedModel:
            return resolve_model(selector, FAST, api_base=srv.url, env={})

        model = await resolve("openai/fake")
        async with await Store.open(paths.database_file) as store:
            bus = NatsSessionBus(paths)
            orch = Orchestrator(
                store=store,
                backend=LocalBackend(pool_size=0),
                settings=FAST,
                paths=paths,
                bus=bus,
                resolve=resolve,
            )
            try:
                await bus.start(FamilyService(orch).handlers())
                bee = await orch.create_session(
                    model=model, cwd=project_b, name="bee", session_id=B_ID, eager_sandbox=False
                )
                orch.submit(bee, Inbound(UserMessagePayload(text="keep a secret")))
                await orch.wait_quiet(bee.id, QUIET_TIMEOUT_S)
                ant = await orch.create_session(model=model, cwd=project_a, name="ant")
                assert bee.id in orch.sessions  # B is loaded: the old rule made it A's sibling
                orch.submit(ant, Inbound(UserMessagePayload(text="probe the other root")))
                await orch.wait_quiet(ant.id, QUIET_TIMEOUT_S)
            finally:
                await orch.close()
                await bus.close()
            sessions = {s.name: s for s in await store.list_sessions()}
            events = {name: await store.events(s.id) for name, s in sessions.items()}

    results = [str(e.payload["text"]) for e in events["ant"] if e.type == "tool_result"]
    refused = ["NotFamily"] * 4
    assert results[0] == f"probe {refused * 2} siblings 0 observed 0", results[0]
    assert SECRET not in " ".join(results)
    # B's history is its own: nothing of A entered it.
    bee_texts = [str(e.payload.get("text")) for e in events["bee"] if e.type == "user_message"]
    assert bee_texts == ["keep a secret"]
    # Siblings under one parent still see and reach each other.
    assert results[1] == "spawned"
    k1 = [str(e.payload["text"]) for e in events["k1"] if e.type == "tool_result"]
    assert len(k1) == 1 and k1[0].startswith("k1 saw [") and "'k2 here'" in k1[0], k1
    assert k1[0].endswith(("sibling delivered", "sibling queued")), k1
    k2_msgs = [e.payload for e in events["k2"] if e.type == "user_message"]
    assert [m["text"] for m in k2_msgs if m.get("source") == "agent"] == ["hello k2"]
    assert sessions["k1"].parent_id == sessions["k2"].parent_id == sessions["ant"].id
