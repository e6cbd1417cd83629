"""The kernel's ``rlm.harness`` and ``refine`` without NATS, and their host handlers on a real
store without kernels.

Kernel side: argument checks before any request, id slugs and scope prefixes, the exact wire
args, reply decoding, the ``conflict`` error class, skills loaded from a module on ``sys.path``.
Host side: ``HarnessService`` against a real DuckDB store (the caller's tree owns its local
entries, stale versions are refused, answers are bounded, refine without a refiner)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from orchestrator.bus.router import HostRequestError
from orchestrator.errors import HarnessConflict, HarnessInvalid, HarnessNotFound
from orchestrator.harness import proposals as proposals_module
from orchestrator.harness import service as service_module
from orchestrator.harness.proposals import accept_proposal, reject_proposal
from orchestrator.harness.refine import Refiner
from orchestrator.harness.service import HarnessService
from orchestrator.runtime import LAZY_HELPERS, RUNTIME_NAMES
from orchestrator.runtime.errors import (
    ERROR_CLASSES,
    Conflict,
    InternalHostError,
    InvalidArgument,
    error_from_reply,
)
from orchestrator.runtime.harness import Harness, HarnessEntries, HarnessEntry, slugify
from orchestrator.runtime.refine import Refine, Refinement, RefineRequest
from orchestrator.runtime.rlm import Rlm
from orchestrator.store import harness as harness_store
from orchestrator.store import harness_entry as host_entries
from orchestrator.store.db import Store
from orchestrator.store.proposals import select_proposals
from orchestrator.store.refinements import (
    RefinementRow,
    insert_refinement,
    new_refinement_id,
    select_refinements,
)
from tests.unit.test_runtime_api import RecordingClient


def wire_entry(**changes: Any) -> dict[str, Any]:
    entry = {
        "owner": "s-root",
        "scope": "local",
        "kind": "memory",
        "id": "deploy_notes",
        "version": 2,
        "title": "Deploy notes",
        "content": "use make release",
        "path": "general",
        "reference": {},
        "arguments": {},
        "metadata": {"k": 1},
        "deleted": False,
        "source": "agent",
        "reason": "learned",
        "session_id": "s-root",
        "refinement_id": None,
        "created_at": "2025-01-01T00:00:00+00:00",
        "updated_at": "2025-01-02T00:00:00+00:00",
    }
    entry.update(changes)
    return entry


# --- one set of rules, two ways to refuse ------------------------------------------------------


@pytest.mark.parametrize(
    ("kernel_call", "host_check", "kernel_exc"),
    [
        (lambda h: h.create("fact", "t", "c"), lambda: host_entries.check_kind("fact"), None),
        (
            lambda h: h.create_memory("t", "c", id="Bad-Id"),
            lambda: host_entries.check_entry_id("Bad-Id"),
            None,
        ),
        (
            lambda h: h.create_prompt("t", "c", id="base_system_prompt"),
            lambda: host_entries.check_entry_id("base_system_prompt"),
            None,
        ),
        (
            lambda h: h.create_memory("t" * 201, "c"),
            lambda: host_entries.check_title("t" * 201),
            None,
        ),
        (
            lambda h: h.create_memory("t", "c", path="a\nb"),
            lambda: host_entries.check_path("a\nb"),
            None,
        ),
        (
            lambda h: h.create_skill(
                "t", "c", reference={**GOOD_REF, "type": "js"}, arguments={"a": "x"}
            ),
            lambda: host_entries.check_skill_contract({**GOOD_REF, "type": "js"}, {"a": "x"}),
            None,
        ),
        (
            lambda h: h.create_skill("t", "c", reference=GOOD_REF, arguments={"a b": "x"}),
            lambda: host_entries.check_skill_contract(GOOD_REF, {"a b": "x"}),
            None,
        ),
        (
            lambda h: h.create_memory("t", "c", reason=5),
            lambda: host_entries.check_reason(5),
            TypeError,
        ),
    ],
)
def test_the_kernel_refuses_what_the_host_refuses_with_the_same_words(
    kernel_call: Any, host_check: Any, kernel_exc: type[Exception] | None
) -> None:
    """Both sides apply ``runtime/entry_rules.py``: the kernel says ``harness.<call>: <rule>``
    as ``InvalidArgument`` (``TypeError`` for a wrong type), the host says ``<rule>`` as
    ``HarnessInvalid`` (code ``invalid_argument``), so a refusal reads the same everywhere."""
    with pytest.raises(HarnessInvalid) as host:
        host_check()
    assert host.value.code == "invalid_argument"
    with pytest.raises(kernel_exc or InvalidArgument) as kernel:
        kernel_call(Harness(RecordingClient()))
    where, _, said = str(kernel.value).partition(": ")
    assert where.startswith("harness.") and said == str(host.value)


def test_slugify_is_the_hosts_default_id() -> None:
    assert slugify("  Ünïcode — tést!! ") == host_entries.slugify("  Ünïcode — tést!! ")
    assert slugify("!!!") == ""  # the kernel then asks for id=; the host refuses outright
    with pytest.raises(HarnessInvalid, match="no letters or digits"):
        host_entries.slugify("!!!")


def test_conflict_is_the_runtime_class_for_code_conflict() -> None:
    assert ERROR_CLASSES["conflict"] is Conflict
    error = error_from_reply({"code": "conflict", "message": "changed: expected version 1"})
    assert isinstance(error, Conflict) and error.code == "conflict"


def test_refine_is_a_lazy_runtime_name_and_rlm_harness_shares_the_client() -> None:
    assert "refine" in RUNTIME_NAMES and LAZY_HELPERS["refine"][1] == "refine"
    client = RecordingClient()
    harness = Rlm(client).harness
    assert isinstance(harness, Harness) and harness._client() is client
    assert "create_<kind>" in repr(harness) and "refine.run" in repr(Refine(client))


# --- writes -------------------------------------------------------------------------------------


async def test_create_slugs_the_title_and_defaults_to_local() -> None:
    client = RecordingClient({"harness.create": wire_entry(version=1)})
    entry = await Harness(client).create_memory("Deploy notes", "use make deploy", reason="r")
    assert client.requests[0][:2] == (
        "harness.create",
        {
            "kind": "memory",
            "title": "Deploy notes",
            "content": "use make deploy",
            "id": "deploy_notes",
            "scope": "local",
            "reason": "r",
        },
    )
    assert entry.version == 1 and entry.qualified_id == "local:deploy_notes"
    assert entry.metadata == {"k": 1} and entry.created_at == "2025-01-01T00:00:00+00:00"


async def test_scope_prefixes_route_the_call() -> None:
    client = RecordingClient(
        {name: wire_entry(scope="global") for name in ("harness.create", "harness.update")}
    )
    harness = Harness(client)
    await harness.create_prompt("Style", "tabs", id="global:team_style")
    await harness.update_prompt("global:team_style", content="spaces", version=3)
    await harness.create("subagent", "Reviewer", "reads diffs", scope="global")
    assert [args for _, args, _ in client.requests] == [
        {
            "kind": "prompt",
            "title": "Style",
            "content": "tabs",
            "id": "team_style",
            "scope": "global",
        },
        {
            "kind": "prompt",
            "id": "team_style",
            "scope": "global",
            "content": "spaces",
            "version": 3,
        },
        {
            "kind": "subagent",
            "title": "Reviewer",
            "content": "reads diffs",
            "id": "reviewer",
            "scope": "global",
        },
    ]


async def test_an_entry_names_its_own_target() -> None:
    client = RecordingClient({"harness.delete": wire_entry(deleted=True, version=3)})
    read = HarnessEntry.from_wire(wire_entry(scope="global"), "harness.get")
    tombstone = await Harness(client).delete_memory(read, version=read.version, reason="stale")
    assert client.requests[0][1] == {
        "kind": "memory",
        "id": "deploy_notes",
        "scope": "global",
        "version": 2,
        "reason": "stale",
    }
    assert tombstone.deleted and "deleted" in repr(tombstone)


async def test_skills_need_a_python_reference_and_an_argument_contract() -> None:
    reference = {"type": "python", "import": "tools.files", "callable": "read_head"}
    client = RecordingClient({"harness.create": wire_entry(kind="skill", reference=reference)})
    await Harness(client).create_skill(
        "Read head", "first lines of a file", reference=reference, arguments={"path": "a file"}
    )
    sent = client.requests[0][1]
    assert sent["reference"] == reference and sent["arguments"] == {"path": "a file"}


async def test_a_stale_version_raises_conflict() -> None:
    stale = error_from_reply({"code": "conflict", "message": "expected version 1, store has 2"})
    client = RecordingClient({"harness.update": stale})
    with pytest.raises(Conflict, match="expected version 1"):
        await Harness(client).update_memory("deploy_notes", content="x", version=1)


GOOD_REF = {"type": "python", "import": "m", "callable": "f"}


@pytest.mark.parametrize(
    ("call", "exc"),
    [
        (lambda h: h.create("fact", "t", "c"), InvalidArgument),
        (lambda h: h.create_memory("!!!", "c"), InvalidArgument),  # no slug
        (lambda h: h.create_memory("t", "   "), InvalidArgument),
        (lambda h: h.create_memory("t" * 201, "c"), InvalidArgument),
        (lambda h: h.create_memory("t", "c" * 16_001), InvalidArgument),
        (lambda h: h.create_memory("t", "c", id="Bad-Id"), InvalidArgument),
        (lambda h: h.create_prompt("t", "c", id="base_system_prompt"), InvalidArgument),
        (lambda h: h.create_memory("t", "c", id="global:x", scope="local"), InvalidArgument),
        (lambda h: h.create_memory("t", "c", scope="team"), InvalidArgument),
        (lambda h: h.create_memory("t", "c", reference=GOOD_REF), TypeError),
        (lambda h: h.create_memory("t", "c", metadata={"x": object()}), InvalidArgument),
        (lambda h: h.create_memory("t", "c", metadata=[1]), TypeError),
        (lambda h: h.create_memory("t", "c", colour="red"), TypeError),
        (lambda h: h.create_memory("t", "c", reason="r" * 1001), InvalidArgument),
        (lambda h: h.create_memory("t", "c", path="a\nb"), InvalidArgument),
        (lambda h: h.create_skill("t", "c", reference=GOOD_REF, arguments={}), InvalidArgument),
        (
            lambda h: h.create_skill(
                "t", "c", reference={**GOOD_REF, "type": "js"}, arguments={"a": "x"}
            ),
            InvalidArgument,
        ),
        (
            lambda h: h.create_skill(
                "t", "c", reference={**GOOD_REF, "callable": "a.b"}, arguments={"a": "x"}
            ),
            InvalidArgument,
        ),
        (
            lambda h: h.create_skill("t", "c", reference=GOOD_REF, arguments={"not valid": "x"}),
            InvalidArgument,
        ),
        (lambda h: h.update_memory("x"), InvalidArgument),  # nothing to update
        (lambda h: h.update_memory("x", content="c", version=0), InvalidArgument),
        (lambda h: h.update_memory("x", content="c", version=True), TypeError),
        (lambda h: h.update_memory(7, content="c"), TypeError),
        (lambda h: h.delete_memory("x", version="2"), TypeError),
        (lambda h: h.list(kind="memories"), InvalidArgument),
        (lambda h: h.get("memory", "local:"), InvalidArgument),
        (lambda h: h.history("memory", "x", scope="here"), InvalidArgument),
    ],
)
def test_arguments_are_checked_before_any_request(call: Any, exc: type) -> None:
    client = RecordingClient()
    with pytest.raises(exc):
        call(Harness(client))
    assert client.requests == []


# --- reads --------------------------------------------------------------------------------------


async def test_list_get_and_history_decode_entries() -> None:
    client = RecordingClient(
        {
            "harness.list": {"entries": [wire_entry(), wire_entry(id="b", scope="global")]},
            "harness.get": wire_entry(),
            "harness.history": {"entries": [wire_entry(version=1), wire_entry()], "more": True},
        }
    )
    harness = Harness(client)
    listed = await harness.list()
    assert isinstance(listed, HarnessEntries) and listed.more is False
    assert [e.qualified_id for e in listed] == ["local:deploy_notes", "global:b"]
    assert "HarnessEntry(memory local:deploy_notes v2 'Deploy notes'" in repr(listed)
    got = await harness.get("memory", "global:deploy_notes")
    assert got.content == "use make release"
    assert str(got).endswith("\nuse make release") and "learned" in str(got)
    versions = await harness.history("memory", "deploy_notes")
    assert [v.version for v in versions] == [1, 2] and versions.more
    await harness.list("skill", scope="global")
    assert [(t, a) for t, a, _ in client.requests] == [
        ("harness.list", {}),
        ("harness.get", {"kind": "memory", "id": "deploy_notes", "scope": "global"}),
        ("harness.history", {"kind": "memory", "id": "deploy_notes"}),
        ("harness.list", {"kind": "skill", "scope": "global"}),
    ]
    assert hash(got) == hash(HarnessEntry.from_wire(wire_entry(), "x"))


@pytest.mark.parametrize("bad", [wire_entry(version=None), wire_entry(title=None), [1], "x"])
async def test_a_malformed_entry_is_an_internal_error(bad: Any) -> None:
    with pytest.raises(InternalHostError):
        await Harness(RecordingClient({"harness.get": bad})).get("memory", "x")


# --- skills -------------------------------------------------------------------------------------

SKILL_MODULE = """
import asyncio

def head(text, n=1):
    return text.splitlines()[:n]

async def shout(word):
    await asyncio.sleep(0)
    return word.upper()

NOT_CALLABLE = 3
"""


@pytest.fixture
def skill_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"harness_skill_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(SKILL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def skill_client(module: str, callable_name: str) -> RecordingClient:
    reference = {"type": "python", "import": module, "callable": callable_name}
    entry = wire_entry(kind="skill", id="s", reference=reference, arguments={"text": "t"})
    return RecordingClient({"harness.get": entry})


async def test_load_skill_and_call_skill_sync_and_async(skill_module: str) -> None:
    client = skill_client(skill_module, "head")
    head = await Harness(client).load_skill("s")
    assert head("a\nb\nc", n=2) == ["a", "b"]
    assert await Harness(client).call_skill("s", text="x\ny") == ["x"]
    assert client.requests[0][:2] == ("harness.get", {"kind": "skill", "id": "s"})
    shout = skill_client(skill_module, "shout")
    assert await Harness(shout).call_skill("global:s", word="hi") == "HI"
    assert shout.requests[0][1] == {"kind": "skill", "id": "s", "scope": "global"}


async def test_a_broken_skill_reference_names_the_skill(skill_module: str) -> None:
    with pytest.raises(ImportError, match="skill local:s: cannot import"):
        await Harness(skill_client(skill_module + "_missing", "head")).load_skill("s")
    with pytest.raises(AttributeError, match="has no 'nothing'"):
        await Harness(skill_client(skill_module, "nothing")).load_skill("s")
    with pytest.raises(TypeError, match="not a callable"):
        await Harness(skill_client(skill_module, "NOT_CALLABLE")).load_skill("s")


# --- refine -------------------------------------------------------------------------------------


async def test_refine_run_status_and_rollback() -> None:
    client = RecordingClient(
        {
            "refine.run": {"scheduled": True, "id": "r-1"},
            "refine.status": {"pending": ["r-1"], "in_flight": None, "last": {"id": "r-0"}},
            "refine.rollback": {
                "id": "r-2",
                "status": "applied",
                "scope": "local",
                "rollback_of": "r-1",
                "edits": [{"action": "update", "kind": "memory", "id": "a", "applied": True}],
                "trigger": "rollback",
            },
        }
    )
    refine = Refine(client)
    assert await refine.run("  look at the failing tests ") == RefineRequest(True, "r-1")
    status = await refine.status()
    assert status.pending == ["r-1"] and status.in_flight is None and status.last == {"id": "r-0"}
    done = await refine.rollback("r-1")
    assert isinstance(done, Refinement) and done.rollback_of == "r-1"
    assert done.edits[0]["applied"] and done.record["trigger"] == "rollback"
    assert [(t, a) for t, a, _ in client.requests] == [
        ("refine.run", {"scope": "local", "instructions": "look at the failing tests"}),
        ("refine.status", {}),
        ("refine.rollback", {"id": "r-1"}),
    ]
    with pytest.raises(InvalidArgument):
        refine.run(scope="everywhere")
    with pytest.raises(InvalidArgument):
        refine.run("x" * 4001)
    with pytest.raises(TypeError):
        refine.rollback(5)  # type: ignore[arg-type]


# --- the host handlers on a real store ----------------------------------------------------------


@dataclass
class FakeRecord:
    root_id: str


@dataclass
class FakeLive:
    id: str
    record: FakeRecord
    state: str = "idle"


@dataclass
class StandInOrchestrator:
    """What the handlers use of an ``Orchestrator``: its sessions, its store, and the
    ``harness_changed`` hook (recorded)."""

    store: Store
    sessions: dict[str, FakeLive] = field(default_factory=dict)
    changed: list[str] = field(default_factory=list)

    def add(self, session_id: str, root_id: str) -> None:
        self.sessions[session_id] = FakeLive(session_id, FakeRecord(root_id))

    def harness_changed(self, owner: str) -> None:
        self.changed.append(owner)


@pytest_asyncio.fixture
async def orch(tmp_path: Path) -> AsyncIterator[StandInOrchestrator]:
    store = await Store.open(tmp_path / "store.duckdb")
    stand_in = StandInOrchestrator(store)
    stand_in.add("s-root", "s-root")
    stand_in.add("s-child", "s-root")
    stand_in.add("s-other", "s-other")
    try:
        yield stand_in
    finally:
        await store.close()


def handlers(orch: StandInOrchestrator) -> dict[str, Any]:
    return HarnessService(orch).handlers()  # type: ignore[arg-type]


async def test_local_entries_belong_to_the_callers_tree(orch: StandInOrchestrator) -> None:
    h = handlers(orch)
    made = await h["harness.create"](
        "s-child", {"kind": "memory", "title": "Deploy notes", "content": "make deploy"}
    )
    assert (made["owner"], made["id"], made["version"]) == ("s-root", "deploy_notes", 1)
    assert made["session_id"] == "s-child" and made["source"] == "agent"
    got = await h["harness.get"]("s-root", {"kind": "memory", "id": "deploy_notes"})
    assert got["content"] == "make deploy"
    with pytest.raises(HostRequestError) as missing:
        await h["harness.get"]("s-other", {"kind": "memory", "id": "deploy_notes"})
    assert missing.value.code == "not_found"
    proposed = await h["harness.create"](
        "s-other", {"kind": "memory", "title": "Style", "content": "tabs", "scope": "global"}
    )
    assert proposed["proposal"].startswith("p-") and proposed["proposal_status"] == "pending"
    seen = await h["harness.list"]("s-root", {})
    assert [(e["scope"], e["id"]) for e in seen["entries"]] == [("local", "deploy_notes")]
    assert seen["more"] is False
    assert orch.changed == ["s-root"]  # a proposal changes no prompt
    await orch.store.transaction(lambda con: accept_proposal(con, proposed["proposal"]))
    seen = await h["harness.list"]("s-root", {})
    assert [(e["scope"], e["id"], e["source"]) for e in seen["entries"]] == [
        ("local", "deploy_notes", "agent"),
        ("global", "style", "agent"),
    ]


async def _global_heads(orch: StandInOrchestrator) -> dict[str, tuple[int, str, bool]]:
    entries = await orch.store.read(
        lambda con: harness_store.select_entries(con, [host_entries.GLOBAL_OWNER])
    )
    return {e.id: (e.version, e.content, e.deleted) for e in entries}


async def test_every_global_write_from_a_kernel_is_a_proposal(orch: StandInOrchestrator) -> None:
    """Create, update and delete of a global entry, of every kind: nothing is written until
    the user accepts; accepting writes against the version it was proposed on."""
    h = handlers(orch)

    def user_write(con: Any) -> Any:
        write = host_entries.EntryWrite(kind="prompt", id="style", title="Style", content="tabs")
        return harness_store.write_entry(
            con,
            owner=host_entries.GLOBAL_OWNER,
            action="create",
            write=write,
            expected_version=None,
            source="user",
            reason="",
            session_id=None,
        )

    await orch.store.transaction(user_write)
    target = {"kind": "prompt", "id": "global:style"}
    update = await h["harness.update"]("s-root", {**target, "content": "spaces, always"})
    delete = await h["harness.delete"]("s-child", {**target, "version": 1})
    made = {}
    for kind in host_entries.KINDS:
        extra: dict[str, Any] = {}
        if kind == "skill":
            extra = {
                "reference": {"type": "python", "import": "m", "callable": "f"},
                "arguments": {"x": "a number"},
            }
        made[kind] = await h["harness.create"](
            "s-root",
            {"kind": kind, "title": f"New {kind}", "content": "c", "scope": "global"} | extra,
        )
    assert await _global_heads(orch) == {"style": (1, "tabs", False)}
    assert update["version"] == 2 and update["content"] == "spaces, always"
    assert delete["deleted"] is True and orch.changed == []
    # A refused write is refused when proposed: a stale version, a live id, a missing entry.
    for name, args, code in (
        ("harness.update", {**target, "content": "x", "version": 7}, "conflict"),
        (
            "harness.create",
            {"kind": "prompt", "title": "Style", "content": "x", "scope": "global"},
            "conflict",
        ),
        ("harness.delete", {"kind": "memory", "id": "global:nothing"}, "not_found"),
    ):
        with pytest.raises(HostRequestError) as refused:
            await h[name]("s-root", args)
        assert refused.value.code == code, name
    pending = await orch.store.read(lambda con: select_proposals(con, status="pending", limit=50))
    assert len(pending) == 2 + len(host_entries.KINDS)
    assert {p.proposer for p in pending} == {"s-root"}  # the child's is its tree's
    # Accept the update: written against v1, source agent, the proposer's session.
    accepted, written = await orch.store.transaction(
        lambda con: accept_proposal(con, update["proposal"], note="fine")
    )
    assert (written.version, written.content, written.source) == (2, "spaces, always", "agent")
    assert written.session_id == "s-root"
    assert (accepted.status, accepted.decided_by, accepted.result_version) == (
        "accepted",
        "user",
        2,
    )
    # The delete was proposed on v1: the head moved on, so accepting it is a conflict and it
    # stays pending; rejecting it writes nothing.
    with pytest.raises(HarnessConflict):
        await orch.store.transaction(lambda con: accept_proposal(con, delete["proposal"]))
    rejected = await orch.store.transaction(lambda con: reject_proposal(con, delete["proposal"]))
    assert rejected.status == "rejected"
    with pytest.raises(HarnessInvalid, match="already rejected"):
        await orch.store.transaction(lambda con: accept_proposal(con, delete["proposal"]))
    with pytest.raises(HarnessNotFound, match="no harness proposal 'p-nope'"):
        await orch.store.transaction(lambda con: accept_proposal(con, "p-nope"))
    assert await _global_heads(orch) == {"style": (2, "spaces, always", False)}


async def test_pending_proposals_are_bounded_per_tree(
    orch: StandInOrchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(proposals_module, "PROPOSALS_PENDING_MAX", 2)
    h = handlers(orch)
    for n in range(2):
        await h["harness.create"](
            "s-root", {"kind": "memory", "title": f"G{n}", "content": "c", "scope": "global"}
        )
    with pytest.raises(HostRequestError) as full:
        await h["harness.create"](
            "s-child", {"kind": "memory", "title": "G9", "content": "c", "scope": "global"}
        )
    assert full.value.code == "quota_exceeded" and "local scope" in full.value.message
    other = await h["harness.create"](
        "s-other", {"kind": "memory", "title": "G9", "content": "c", "scope": "global"}
    )
    assert other["proposal"].startswith("p-")


async def test_a_stale_version_is_refused_and_nothing_changes(orch: StandInOrchestrator) -> None:
    h = handlers(orch)
    target = {"kind": "memory", "id": "m"}
    await h["harness.create"]("s-root", {**target, "title": "M", "content": "one"})
    await h["harness.update"]("s-root", {**target, "content": "two", "version": 1})
    with pytest.raises(HostRequestError) as stale:
        await h["harness.update"]("s-root", {**target, "content": "three", "version": 1})
    assert stale.value.code == "conflict"
    history = await h["harness.history"]("s-root", target)
    assert [(v["version"], v["content"]) for v in history["entries"]] == [(1, "one"), (2, "two")]
    deleted = await h["harness.delete"]("s-root", {**target, "version": 2, "reason": "done"})
    assert deleted["deleted"] is True and deleted["reason"] == "done"
    with pytest.raises(HostRequestError) as gone:
        await h["harness.update"]("s-root", {**target, "content": "four"})
    assert gone.value.code == "not_found"


@pytest.mark.parametrize(
    "args",
    [
        {"kind": "memory", "title": "T", "content": "c", "owner": "s-other"},  # no identity field
        {"kind": "fact", "title": "T", "content": "c"},
        {"kind": "memory", "title": "T", "content": 5},
        {"kind": "memory", "title": "T", "content": "c", "id": "base_system_prompt"},
        {"kind": "memory", "title": "T", "content": "c", "id": "global:x", "scope": "local"},
        {"kind": "skill", "title": "T", "content": "c"},  # no reference / arguments
        {"kind": "memory", "title": "T", "content": "c" * 16_001},
    ],
)
async def test_bad_writes_are_invalid_arguments(orch: StandInOrchestrator, args: Any) -> None:
    with pytest.raises(HostRequestError) as refused:
        await handlers(orch)["harness.create"]("s-root", args)
    assert refused.value.code == "invalid_argument"
    assert await orch.store.read(lambda con: harness_store.select_log(con, None, limit=10)) == []


async def test_answers_are_bounded(
    orch: StandInOrchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_module, "HARNESS_LIST_MAX_PER_KIND", 2)
    monkeypatch.setattr(service_module, "HARNESS_HISTORY_MAX_VERSIONS", 3)
    h = handlers(orch)
    for n in range(3):
        await h["harness.create"]("s-root", {"kind": "memory", "title": f"M{n}", "content": "c"})
    listed = await h["harness.list"]("s-root", {"kind": "memory"})
    assert [e["id"] for e in listed["entries"]] == ["m2", "m1"] and listed["more"] is True
    for n in range(4):
        await h["harness.update"]("s-root", {"kind": "memory", "id": "m0", "content": f"v{n}"})
    history = await h["harness.history"]("s-root", {"kind": "memory", "id": "m0"})
    assert [v["version"] for v in history["entries"]] == [3, 4, 5] and history["more"] is True
    monkeypatch.setattr(service_module, "HARNESS_REPLY_MAX_BYTES", 10)
    one = await h["harness.list"]("s-root", {"kind": "memory"})
    assert len(one["entries"]) == 1 and one["more"] is True
    assert len(json.dumps(one)) < 10_000


async def test_refine_without_a_refiner_is_an_unknown_request(orch: StandInOrchestrator) -> None:
    h = handlers(orch)
    for name, args in (("refine.run", {}), ("refine.status", {}), ("refine.rollback", {"id": "r"})):
        with pytest.raises(HostRequestError) as refused:
            await h[name]("s-root", args)
        assert refused.value.code == "unknown_request"
    with pytest.raises(HostRequestError) as unknown:
        await h["harness.list"]("s-nobody", {})
    assert unknown.value.code == "not_found"


async def test_a_kernel_cannot_roll_back_a_global_refinement(orch: StandInOrchestrator) -> None:
    """Rolling back a refinement of the global harness writes global entries: from a kernel it
    is refused (the user's `prime-agent refine rollback ID` can); a local one still works."""
    refiner = Refiner(orch.store)
    orch.refiner = refiner  # type: ignore[attr-defined]
    rows = [
        RefinementRow(
            id=new_refinement_id(),
            session_id="s-root",
            owner=owner,
            scope=scope,
            trigger="user",
            status="applied",
        )
        for owner, scope in ((host_entries.GLOBAL_OWNER, "global"), ("s-root", "local"))
    ]
    for row in rows:
        await orch.store.transaction(lambda con, row=row: insert_refinement(con, row))
    h = handlers(orch)
    try:
        with pytest.raises(HostRequestError) as refused:
            await h["refine.rollback"]("s-child", {"id": rows[0].id})
        assert refused.value.code == "invalid_argument"
        assert f"prime-agent refine rollback {rows[0].id}" in refused.value.message
        done = await h["refine.rollback"]("s-child", {"id": rows[1].id})
        assert done["rollback_of"] == rows[1].id
        undone = await orch.store.read(
            lambda con: select_refinements(con, owners=[host_entries.GLOBAL_OWNER], limit=5)
        )
        assert [r.id for r in undone] == [rows[0].id]  # no rollback row of the global one
    finally:
        await refiner.close()
