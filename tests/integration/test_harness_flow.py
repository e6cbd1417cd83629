# ruff: noqa: E501  (scripts below are data: long lines are the model's cells and replies)
"""The Continual Harness end to end (issue 7): real kernels, NATS, DuckDB and the scripted model.

- a memory the kernel writes shows in its own next prompt; a new session of another tree never
  sees it; a global one is a proposal and reaches no prompt (tests/e2e/test_cli_harness.py
  accepts one);
- ``refine.run()`` from a cell plans in the background and applies at the turn boundary
  (creating, updating and deleting entries as the scripted planner says); the next turn's
  prompt has the result; ``rollback`` restores the exact earlier versions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from orchestrator.store import harness as harness_store
from orchestrator.store.harness_entry import GLOBAL_OWNER, HarnessEntry
from orchestrator.store.refinements import select_refinements
from orchestrator.testing import FakeModelServer
from tests.integration.test_harness_kernel import fake_model, orchestrator, turn

PLAN: Final = (
    '{"summary": "keep the build tool, tighten style, drop the stale fact", '
    '"rationale": "the user said make twice; the old fact was wrong", '
    '"expected_outcome": "no more questions about the build", "edits": ['
    '{"action": "create", "kind": "memory", "title": "Build tool", "content": "use make", "reason": "said twice"}, '
    '{"action": "update", "kind": "prompt", "id": "be_brief", "title": "Be brief", "content": "one line, no preamble", "reason": "tighter"}, '
    '{"action": "delete", "kind": "memory", "id": "old_fact", "reason": "wrong"}]}'
)

SCRIPT: Final = f"""
repeat forever:
    when "<current_harness_state>":
        text: {PLAN}
    when "WROTE":
        text: written
    when "write notes":
        code:
            await rlm.harness.create_memory("Local fact", "the local one")
            await rlm.harness.create_memory("Old fact", "stale")
            await rlm.harness.create_prompt("Be brief", "short answers")
            await rlm.harness.create_memory("Global fact", "the global one", scope="global")
            print("WROTE")
    when "REFINE":
        text: refine asked
    when "please refine":
        code: r = await refine.run("look at the build"); print("REFINE", r.scheduled)
    else:
        text: ok
"""


def _system(request: dict[str, Any]) -> str:
    return str(request["messages"][0]["content"])


def _heads(entries: list[HarnessEntry]) -> dict[str, tuple[int, str]]:
    return {e.id: (e.version, e.content) for e in entries}


async def test_kernel_writes_reach_prompts_by_scope_and_refine_applies_and_rolls_back(
    tmp_path: Path,
) -> None:
    async with orchestrator() as orch:
        with FakeModelServer(SCRIPT) as srv:
            root = await orch.create_session(model=fake_model(srv), cwd=tmp_path, name="root")
            await turn(orch, root, "write notes")
            await turn(orch, root, "hello again")
            own_prompt = _system(srv.requests[-1])
            other_cwd = tmp_path / "other"
            other_cwd.mkdir()
            other = await orch.create_session(model=fake_model(srv), cwd=other_cwd, name="other")
            await turn(orch, other, "hello from elsewhere")
            other_prompt = _system(srv.requests[-1])

            before = await orch.store.read(lambda con: harness_store.select_entries(con, [root.id]))
            out = await turn(orch, root, "please refine")
            assert "REFINE True" in out
            await orch.refiner.wait_planning()
            await turn(orch, root, "after refine")
            refined_prompt = _system(srv.requests[-1])
            planner = [r for r in srv.requests if "<current_harness_state>" in str(r["messages"])]
            after = await orch.store.read(lambda con: harness_store.select_entries(con, [root.id]))
            rows = await orch.store.read(
                lambda con: select_refinements(con, session_id=root.id, limit=5)
            )
            applied = rows[0]
            undo = await orch.refiner.rollback(applied.id, session_id=None, source="user")
            orch.harness_changed(root.id)
            restored = await orch.store.read(
                lambda con: harness_store.select_entries(con, [root.id])
            )
            await turn(orch, root, "after rollback")
            rolled_prompt = _system(srv.requests[-1])

    # scope: the own tree sees its local entries, another tree none; the global memory is a
    # proposal nobody accepted, so no prompt has it
    assert "Local fact: the local one" in own_prompt and "Global fact" not in own_prompt
    assert "Global fact" not in other_prompt and "Local fact" not in other_prompt

    # refine: one planning call over the conversation, edits applied at the boundary
    assert len(planner) == 1 and "look at the build" in str(planner[0]["messages"])
    assert applied.status == "applied" and applied.summary is not None
    assert [e["applied"] for e in applied.edits] == [True, True, True]
    assert _heads(after) == {
        "local_fact": (1, "the local one"),
        "be_brief": (2, "one line, no preamble"),
        "build_tool": (1, "use make"),
    }
    assert {e.source for e in after if e.id in ("be_brief", "build_tool")} == {"refine"}
    assert "Build tool: use make" in refined_prompt and "one line, no preamble" in refined_prompt
    assert "Old fact" not in refined_prompt

    # rollback: every head back to its exact earlier content (as new versions), recorded
    assert undo.rollback_of == applied.id and undo.status == "applied"
    assert {k: v[1] for k, v in _heads(restored).items()} == {
        k: v[1] for k, v in _heads(before).items()
    }
    assert _heads(restored)["be_brief"] == (3, "short answers")
    assert _heads(restored)["old_fact"] == (3, "stale")
    assert "Build tool" not in rolled_prompt and "Old fact: stale" in rolled_prompt
    assert GLOBAL_OWNER not in {e.owner for e in restored}
