"""Heartbeats: the kernel's ``rlm_heartbeat`` without NATS, the host's ``rlm_heartbeat.*``
handlers and the ``/heartbeat`` / ``schedule`` functions on a real store
(``orchestrator/runtime/heartbeat.py``, ``orchestrator/control/schedule_service.py``).

Kernel side: argument checks before any request, the exact wire args, reply decoding, typed
errors, and the kernel API end to end against the real handlers (a bridge in place of NATS).

Host side: the caller sees and changes only its own heartbeats; intervals take every spec form
with the 10 s minimum; labels are unique and name a heartbeat; the per-session cap; bounded
answers; each change pokes the scheduler. ``/heartbeat``: one per session, replaced by the next,
pause / resume / stop, ``--follow-up``."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from orchestrator.bus.router import HostRequestError
from orchestrator.control import schedule_service as service_module
from orchestrator.control.schedule_service import (
    MAX_LIVE_HEARTBEATS,
    ScheduleService,
    add_schedule,
    cancel_schedule,
    heartbeat_command,
    interval_spec,
    list_schedules,
    pause_schedule,
)
from orchestrator.errors import ScheduleSpecError
from orchestrator.runtime import heartbeat as kernel
from orchestrator.runtime.errors import (
    InternalHostError,
    InvalidArgument,
    NotFound,
    QuotaExceeded,
    error_from_reply,
)
from orchestrator.runtime.heartbeat import RlmHeartbeat, rlm_heartbeat
from orchestrator.runtime.wire import REQUEST_TYPES
from orchestrator.store import schedules as ss
from orchestrator.store.db import Store
from orchestrator.store.timespec import MINIMUM_INTERVAL_S
from tests.unit.test_runtime_api import RecordingClient

T0 = dt.datetime(2026, 5, 9, 12, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


# --- host side ----------------------------------------------------------------------------------


@dataclass
class FakeLive:
    id: str
    state: str = "idle"


@dataclass
class FakeScheduler:
    pokes: int = 0

    def poke(self) -> None:
        self.pokes += 1


@dataclass
class StandInOrchestrator:
    """What the handlers use of an ``Orchestrator``: its sessions, store and scheduler."""

    store: Store
    sessions: dict[str, FakeLive] = field(default_factory=dict)
    scheduler: FakeScheduler = field(default_factory=FakeScheduler)


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await Store.open(tmp_path / "store.duckdb")
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def orch(store: Store) -> StandInOrchestrator:
    stand_in = StandInOrchestrator(store)
    for sid in ("s-a", "s-b"):
        stand_in.sessions[sid] = FakeLive(sid)
    return stand_in


def handlers(orch: StandInOrchestrator, now: dt.datetime = T0) -> dict[str, Any]:
    return ScheduleService(orch, clock=lambda: now).handlers()  # type: ignore[arg-type]


def test_every_handler_is_a_protocol_request_type(orch: StandInOrchestrator) -> None:
    assert set(handlers(orch)) <= REQUEST_TYPES
    assert {name for name in REQUEST_TYPES if name.startswith("rlm_heartbeat.")} == set(
        handlers(orch)
    )


@pytest.mark.parametrize(
    ("interval", "spec"),
    [
        ("5m", "every 5m"),
        ("1h30m", "every 1h30m"),
        ("every 30s", "every 30s"),
        ("in 10m", "in 10m"),
        ("*/15 * * * *", "*/15 * * * *"),
        ("cron 0 9 * * 1", "cron 0 9 * * 1"),
        (" 10s ", "every 10s"),
    ],
)
def test_an_interval_is_a_bare_duration_or_any_spec(interval: str, spec: str) -> None:
    assert interval_spec(interval) == spec


async def test_create_makes_an_rlm_heartbeat_of_the_caller(orch: StandInOrchestrator) -> None:
    h = handlers(orch)
    made = await h["rlm_heartbeat.create"](
        "s-a", {"instruction": "  check CI  ", "label": "ci", "delivery": "follow_up"}
    )
    assert (made["instruction"], made["interval"], made["label"]) == ("check CI", "every 5m", "ci")
    assert (made["delivery"], made["status"], made["run_count"]) == ("follow_up", "active", 0)
    assert made["next_run_at"] == at(300).isoformat()
    assert orch.scheduler.pokes == 1
    row = await orch.store.read(lambda con: ss.select_schedule(con, made["id"]))
    assert row is not None and (row.session_id, row.source) == ("s-a", "rlm_heartbeat")
    once = await h["rlm_heartbeat.create"]("s-a", {"instruction": "x", "interval": "in 90s"})
    assert once["interval"] == f"at {at(90).isoformat()}" and once["delivery"] == "steer"


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"instruction": "x", "interval": "5s"}, "shortest interval is 10s"),
        ({"instruction": "x", "interval": "every 9s"}, "shortest interval is 10s"),
        ({"instruction": "x", "interval": "soon"}, "not understood"),
        ({"instruction": "   "}, "empty"),
        ({"instruction": "x", "delivery": "later"}, "delivery"),
        ({"instruction": "x", "interval": 300}, "interval"),
        ({"instruction": "x", "label": "a\x00b"}, "control character"),
        ({"instruction": "x", "label": "l" * 65}, "label"),
        ({"instruction": "x" * (service_module.PROMPT_MAX_CHARS + 1)}, "instruction"),
        ({"instruction": "x", "every": "5m"}, "every"),
    ],
)
async def test_create_refuses_bad_arguments(
    orch: StandInOrchestrator, args: dict[str, Any], match: str
) -> None:
    with pytest.raises(HostRequestError, match=match) as refused:
        await handlers(orch)["rlm_heartbeat.create"]("s-a", args)
    assert refused.value.code == "invalid_argument"
    assert await list_schedules(orch.store, include_inactive=True) == []


async def test_an_unknown_or_deleted_caller_is_refused(orch: StandInOrchestrator) -> None:
    orch.sessions["s-gone"] = FakeLive("s-gone", state="deleted")
    for caller in ("s-gone", "s-nobody"):
        with pytest.raises(HostRequestError) as refused:
            await handlers(orch)["rlm_heartbeat.list"](caller, {})
        assert refused.value.code == "not_found"


async def test_a_session_sees_and_changes_only_its_own_heartbeats(
    orch: StandInOrchestrator,
) -> None:
    h = handlers(orch)
    mine = await h["rlm_heartbeat.create"]("s-a", {"instruction": "mine", "label": "ci"})
    await h["rlm_heartbeat.create"]("s-b", {"instruction": "theirs", "label": "ci"})
    # A user's schedule of the same session is not the agent's heartbeat.
    await add_schedule(orch.store, "s-a", "every 1m", "user's", now=T0)
    listed = await h["rlm_heartbeat.list"]("s-a", {})
    assert [hb["instruction"] for hb in listed["heartbeats"]] == ["mine"]
    assert listed["more"] is False
    theirs = (await h["rlm_heartbeat.list"]("s-b", {}))["heartbeats"][0]
    for request, args in (
        ("rlm_heartbeat.update", {"id": theirs["id"], "instruction": "hijacked"}),
        ("rlm_heartbeat.delete", {"id": theirs["id"]}),
    ):
        with pytest.raises(HostRequestError) as refused:
            await h[request]("s-a", args)
        assert refused.value.code == "not_found"
    # "ci" names the caller's own heartbeat, not s-b's.
    deleted = await h["rlm_heartbeat.delete"]("s-a", {"id": "ci"})
    assert (deleted["id"], deleted["status"]) == (mine["id"], "cancelled")
    assert (await h["rlm_heartbeat.list"]("s-b", {}))["heartbeats"][0]["status"] == "active"


async def test_update_changes_pauses_and_resumes(orch: StandInOrchestrator) -> None:
    made = await handlers(orch)["rlm_heartbeat.create"](
        "s-a", {"instruction": "check", "interval": "every 30s", "label": "ci"}
    )
    later = handlers(orch, now=at(45))
    changed = await later["rlm_heartbeat.update"](
        "s-a", {"id": made["id"], "interval": "1m", "instruction": "check again", "label": "b"}
    )
    assert (changed["interval"], changed["next_run_at"]) == ("every 1m", at(105).isoformat())
    assert (changed["instruction"], changed["label"]) == ("check again", "b")
    paused = await later["rlm_heartbeat.update"]("s-a", {"id": "b", "paused": True})
    assert paused["status"] == "paused"
    resumed = await handlers(orch, now=at(200))["rlm_heartbeat.update"](
        "s-a", {"id": made["id"], "paused": False, "label": None}
    )
    assert (resumed["status"], resumed["label"]) == ("active", None)
    assert resumed["next_run_at"] == at(225).isoformat()  # the grid of the 1m spec set at 45
    assert orch.scheduler.pokes == 4
    with pytest.raises(HostRequestError, match="shortest interval"):
        await later["rlm_heartbeat.update"]("s-a", {"id": made["id"], "interval": "1s"})


async def test_labels_are_unique_among_live_heartbeats(orch: StandInOrchestrator) -> None:
    h = handlers(orch)
    first = await h["rlm_heartbeat.create"]("s-a", {"instruction": "a", "label": "ci"})
    with pytest.raises(HostRequestError, match="taken") as refused:
        await h["rlm_heartbeat.create"]("s-a", {"instruction": "b", "label": "ci"})
    assert refused.value.code == "invalid_argument"
    other = await h["rlm_heartbeat.create"]("s-a", {"instruction": "b", "label": "lint"})
    with pytest.raises(HostRequestError, match="taken"):
        await h["rlm_heartbeat.update"]("s-a", {"id": other["id"], "label": "ci"})
    await h["rlm_heartbeat.delete"]("s-a", {"id": first["id"]})
    again = await h["rlm_heartbeat.create"]("s-a", {"instruction": "c", "label": "ci"})
    assert again["label"] == "ci"


async def test_delete_twice_is_not_an_error_and_a_finished_one_cannot_change(
    orch: StandInOrchestrator,
) -> None:
    h = handlers(orch)
    made = await h["rlm_heartbeat.create"]("s-a", {"instruction": "a"})
    await h["rlm_heartbeat.delete"]("s-a", {"id": made["id"]})
    again = await h["rlm_heartbeat.delete"]("s-a", {"id": made["id"]})
    assert again["status"] == "cancelled"
    with pytest.raises(HostRequestError, match="cancelled") as refused:
        await h["rlm_heartbeat.update"]("s-a", {"id": made["id"], "instruction": "b"})
    assert refused.value.code == "invalid_argument"
    listed = await h["rlm_heartbeat.list"]("s-a", {})
    assert listed["heartbeats"] == []
    everything = await h["rlm_heartbeat.list"]("s-a", {"include_inactive": True})
    assert [hb["status"] for hb in everything["heartbeats"]] == ["cancelled"]


async def test_the_per_session_cap(orch: StandInOrchestrator) -> None:
    h = handlers(orch)
    made = [
        await h["rlm_heartbeat.create"]("s-a", {"instruction": f"n{i}"})
        for i in range(MAX_LIVE_HEARTBEATS)
    ]
    with pytest.raises(HostRequestError, match="limit") as refused:
        await h["rlm_heartbeat.create"]("s-a", {"instruction": "one too many"})
    assert refused.value.code == "quota_exceeded"
    await h["rlm_heartbeat.create"]("s-b", {"instruction": "another session"})
    await h["rlm_heartbeat.delete"]("s-a", {"id": made[0]["id"]})
    await h["rlm_heartbeat.create"]("s-a", {"instruction": "room again"})


async def test_list_answers_are_bounded(
    orch: StandInOrchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = handlers(orch)
    for i in range(5):
        await h["rlm_heartbeat.create"]("s-a", {"instruction": f"n{i} " + "x" * 1000})
    monkeypatch.setattr(service_module, "HEARTBEAT_LIST_MAX_ITEMS", 3)
    listed = await h["rlm_heartbeat.list"]("s-a", {})
    assert [hb["instruction"][:2] for hb in listed["heartbeats"]] == ["n2", "n3", "n4"]
    assert listed["more"] is True
    monkeypatch.setattr(service_module, "HEARTBEAT_REPLY_MAX_BYTES", 3000)
    listed = await h["rlm_heartbeat.list"]("s-a", {})
    assert [hb["instruction"][:2] for hb in listed["heartbeats"]] == ["n3", "n4"]
    assert listed["more"] is True


# --- prime-agent schedule -----------------------------------------------------------------------


async def test_add_list_pause_and_cancel_schedules(store: Store) -> None:
    pokes: list[int] = []

    def poke() -> None:
        pokes.append(1)

    row = await add_schedule(store, "s-a", "every 30s", "run tests", now=T0, poke=poke)
    assert (row.source, row.spec, row.next_run_at) == ("user", "every 30s", at(30))
    cron = await add_schedule(store, "s-b", "0 9 * * *", "standup", now=T0)
    assert [r.id for r in await list_schedules(store)] == [row.id, cron.id]
    assert [r.id for r in await list_schedules(store, session_id="s-b")] == [cron.id]
    paused = await pause_schedule(store, row.id, True, now=at(1), poke=poke)
    assert paused.status == "paused"
    resumed = await pause_schedule(store, row.id, False, now=at(100), poke=poke)
    assert (resumed.status, resumed.next_run_at) == ("active", at(120))
    # A unique id prefix is enough; another session's id is not found for a session.
    with pytest.raises(ss.ScheduleNotFound):
        await cancel_schedule(store, row.id, session_id="s-b")
    cancelled = await cancel_schedule(store, row.id[:-2], now=at(101), poke=poke)
    assert cancelled.status == "cancelled"
    assert [r.id for r in await list_schedules(store)] == [cron.id]
    assert len(await list_schedules(store, include_inactive=True)) == 2
    assert len(pokes) == 4
    with pytest.raises(ss.ScheduleError, match="cancelled"):
        await cancel_schedule(store, row.id)
    with pytest.raises(ss.ScheduleNotFound):
        await cancel_schedule(store, "sch-nothing")


async def test_add_schedule_refuses_bad_input(store: Store) -> None:
    with pytest.raises(ScheduleSpecError, match="shortest interval"):
        await add_schedule(store, "s-a", "every 5s", "x", now=T0)
    with pytest.raises(ScheduleSpecError, match="in the past"):
        await add_schedule(store, "s-a", "at 2020-01-01T00:00Z", "x", now=T0)
    with pytest.raises(ss.ScheduleError, match="empty"):
        await add_schedule(store, "s-a", "in 10m", "  ", now=T0)
    with pytest.raises(ss.ScheduleError, match="delivery"):
        await add_schedule(store, "s-a", "in 10m", "x", delivery="now", now=T0)
    with pytest.raises(ScheduleSpecError, match="limit"):
        await add_schedule(store, "s-a", "x" * 300, "x", now=T0)


async def test_an_ambiguous_id_prefix_is_refused(store: Store) -> None:
    rows = [await add_schedule(store, "s-a", "in 10m", f"n{i}", now=T0) for i in range(2)]
    with pytest.raises(ss.ScheduleError, match="matches 2"):
        await cancel_schedule(store, ss.SCHEDULE_ID_PREFIX)
    assert {r.status for r in await list_schedules(store)} == {"active"}
    assert len(rows) == 2


# --- /heartbeat ----------------------------------------------------------------------------------


async def test_heartbeat_sets_one_per_session_and_replaces_it(store: Store) -> None:
    first = await heartbeat_command(store, "s-a", "/heartbeat every 10m check the build", now=T0)
    assert first.action == "set" and first.schedule is not None
    assert (first.schedule.source, first.schedule.spec) == ("heartbeat", "every 10m")
    assert (first.schedule.prompt, first.schedule.delivery) == ("check the build", "steer")
    assert "every 10m" in first.message and "\n" not in first.message
    second = await heartbeat_command(
        store, "s-a", "/heartbeat --follow-up 15m look at\n  the logs", now=at(5)
    )
    assert second.schedule is not None
    assert (second.schedule.spec, second.schedule.delivery) == ("every 15m", "follow_up")
    assert second.schedule.prompt == "look at\n  the logs"
    live = await list_schedules(store, session_id="s-a", include_inactive=True)
    assert [(r.id, r.status) for r in live] == [
        (first.schedule.id, "cancelled"),
        (second.schedule.id, "active"),
    ]
    cron = await heartbeat_command(store, "s-b", '/heartbeat cron "*/5 * * * *" ping', now=T0)
    assert cron.schedule is not None and cron.schedule.spec == "*/5 * * * *"


async def test_heartbeat_status_pause_resume_and_stop(store: Store) -> None:
    none = await heartbeat_command(store, "s-a", "/heartbeat", now=T0)
    assert (none.action, none.schedule) == ("status", None) and "/heartbeat every" in none.message
    await heartbeat_command(store, "s-a", "/heartbeat every 1m tick", now=T0)
    shown = await heartbeat_command(store, "s-a", "/heartbeat status", now=T0)
    assert shown.action == "status" and shown.schedule is not None
    paused = await heartbeat_command(store, "s-a", "/heartbeat pause", now=at(10))
    assert paused.schedule is not None and paused.schedule.status == "paused"
    resumed = await heartbeat_command(store, "s-a", "/heartbeat RESUME", now=at(130))
    assert resumed.schedule is not None
    assert (resumed.schedule.status, resumed.schedule.next_run_at) == ("active", at(180))
    stopped = await heartbeat_command(store, "s-a", "/heartbeat stop", now=at(131))
    assert stopped.action == "stopped" and stopped.schedule is not None
    assert stopped.schedule.status == "cancelled"
    after = await heartbeat_command(store, "s-a", "/heartbeat clear", now=at(132))
    assert after.schedule is None


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("/heartbeat every 5s x", "shortest interval"),
        ("/heartbeat every 10m", "no instruction"),
        ("/heartbeat sometimes x", "not understood"),
        ("/beat every 10m x", "not a heartbeat command"),
    ],
)
async def test_heartbeat_refuses_what_it_cannot_read(store: Store, text: str, match: str) -> None:
    with pytest.raises(ScheduleSpecError, match=match):
        await heartbeat_command(store, "s-a", text, now=T0)
    assert await list_schedules(store, include_inactive=True) == []


# --- kernel side ----------------------------------------------------------------------------------


def wire_heartbeat(**changes: Any) -> dict[str, Any]:
    heartbeat: dict[str, Any] = {
        "id": "sch-01",
        "label": "ci",
        "instruction": "check CI",
        "interval": "every 5m",
        "delivery": "steer",
        "status": "active",
        "next_run_at": "2026-05-09T12:05:00+00:00",
        "last_run_at": None,
        "run_count": 0,
        "last_error": None,
        "created_at": "2026-05-09T12:00:00+00:00",
        "updated_at": "2026-05-09T12:00:00+00:00",
    }
    heartbeat.update(changes)
    return heartbeat


def test_mirrored_constants_equal_the_hosts() -> None:
    assert kernel.INSTRUCTION_MAX_CHARS == service_module.PROMPT_MAX_CHARS
    assert kernel.LABEL_MAX_CHARS == service_module.LABEL_MAX_CHARS
    assert kernel.SPEC_MAX_CHARS == service_module.SPEC_MAX_CHARS
    assert kernel.REF_MAX_CHARS == service_module.REF_MAX_CHARS
    assert kernel.DEFAULT_INTERVAL == service_module.DEFAULT_HEARTBEAT_INTERVAL
    assert kernel.DEFAULT_DELIVERY == service_module.DEFAULT_DELIVERY
    assert kernel.DELIVERIES == ss.DELIVERIES
    assert kernel.MINIMUM_INTERVAL_S == MINIMUM_INTERVAL_S


async def test_create_sends_the_wire_args_and_decodes_the_heartbeat() -> None:
    client = RecordingClient({"rlm_heartbeat.create": wire_heartbeat()})
    hb = await RlmHeartbeat(client).create("  check CI ", label=" ci ")
    assert client.requests[0][:2] == (
        "rlm_heartbeat.create",
        {"instruction": "check CI", "interval": "5m", "delivery": "steer", "label": "ci"},
    )
    assert (hb.id, hb.label, hb.interval, hb.status, hb.active, hb.paused) == (
        "sch-01",
        "ci",
        "every 5m",
        "active",
        True,
        False,
    )
    assert hb.record["next_run_at"] == "2026-05-09T12:05:00+00:00"
    assert "every 5m" in repr(hb) and "check CI" in repr(hb)
    await RlmHeartbeat(client).create("x", 300, delivery="follow_up")
    await RlmHeartbeat(client).create("x", dt.timedelta(minutes=2))
    await RlmHeartbeat(client).create("x", interval="*/15 * * * *")
    sent = [args for _, args, _ in client.requests[1:]]
    assert [a["interval"] for a in sent] == ["300s", "120s", "*/15 * * * *"]
    assert sent[0]["delivery"] == "follow_up" and "label" not in sent[0]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"instruction": "x", "interval": 5}, InvalidArgument),
        ({"instruction": "x", "interval": True}, TypeError),
        ({"instruction": "x", "interval": 1.5}, TypeError),
        ({"instruction": "x", "interval": dt.timedelta(seconds=10.5)}, InvalidArgument),
        ({"instruction": "x", "interval": "  "}, InvalidArgument),
        ({"instruction": "x", "interval": "x" * 201}, InvalidArgument),
        ({"instruction": "   "}, InvalidArgument),
        ({"instruction": 5}, TypeError),
        ({"instruction": "x" * (16 * 1024 + 1)}, InvalidArgument),
        ({"instruction": "x", "label": "l" * 65}, InvalidArgument),
        ({"instruction": "x", "label": "a\nb"}, InvalidArgument),
        ({"instruction": "x", "label": 3}, TypeError),
        ({"instruction": "x", "delivery": "later"}, InvalidArgument),
        ({"instruction": "x", "every": "5m"}, TypeError),
    ],
)
def test_create_checks_arguments_before_sending(kwargs: dict[str, Any], error: type) -> None:
    client = RecordingClient()
    with pytest.raises(error):
        RlmHeartbeat(client).create(**kwargs)
    assert client.requests == []


async def test_list_update_pause_resume_delete() -> None:
    client = RecordingClient(
        {
            "rlm_heartbeat.list": {"heartbeats": [wire_heartbeat()], "more": True},
            "rlm_heartbeat.update": wire_heartbeat(status="paused"),
            "rlm_heartbeat.delete": wire_heartbeat(status="cancelled"),
        }
    )
    api = RlmHeartbeat(client)
    listed = await api.list()
    assert [hb.id for hb in listed] == ["sch-01"] and listed.more is True
    assert "more" in repr(listed)
    await api.list(include_inactive=True)
    hb = listed[0]
    paused = await api.update(hb, interval="10m", label=None, paused=True)
    assert paused.paused
    await api.update("ci", instruction=" new ", delivery="follow_up")
    await api.pause("ci")
    await api.resume(hb)
    gone = await api.delete(hb)
    assert gone.status == "cancelled"
    assert [(t, a) for t, a, _ in client.requests] == [
        ("rlm_heartbeat.list", {"include_inactive": False}),
        ("rlm_heartbeat.list", {"include_inactive": True}),
        (
            "rlm_heartbeat.update",
            {"id": "sch-01", "interval": "10m", "label": None, "paused": True},
        ),
        ("rlm_heartbeat.update", {"id": "ci", "instruction": "new", "delivery": "follow_up"}),
        ("rlm_heartbeat.update", {"id": "ci", "paused": True}),
        ("rlm_heartbeat.update", {"id": "sch-01", "paused": False}),
        ("rlm_heartbeat.delete", {"id": "sch-01"}),
    ]


def test_update_and_delete_check_arguments_before_sending() -> None:
    client = RecordingClient()
    api = RlmHeartbeat(client)
    with pytest.raises(InvalidArgument, match="nothing to change"):
        api.update("ci")
    with pytest.raises(TypeError):
        api.update("ci", paused="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        api.update(5, paused=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        api.delete("  ")
    with pytest.raises(TypeError):
        api.delete("ci", force=True)
    with pytest.raises(TypeError):
        api.list(include_inactive="yes")  # type: ignore[arg-type]
    assert client.requests == []


async def test_malformed_replies_and_host_errors_are_typed() -> None:
    api = RlmHeartbeat(RecordingClient({"rlm_heartbeat.create": {"id": "x"}}))
    with pytest.raises(InternalHostError):
        await api.create("x")
    api = RlmHeartbeat(RecordingClient({"rlm_heartbeat.list": [1]}))
    with pytest.raises(InternalHostError):
        await api.list()
    refused = error_from_reply({"code": "quota_exceeded", "message": "16 heartbeats already"})
    api = RlmHeartbeat(RecordingClient({"rlm_heartbeat.create": refused}))
    with pytest.raises(QuotaExceeded, match="16 heartbeats"):
        await api.create("x")


def test_the_object_describes_itself() -> None:
    assert "create(instruction, interval='5m'" in repr(rlm_heartbeat)
    assert isinstance(rlm_heartbeat, RlmHeartbeat)


class HostBridge(RecordingClient):
    """A client that answers with the real host handlers (JSON both ways, errors mapped the
    way the router and the kernel's client map them): the kernel API end to end, minus NATS."""

    def __init__(self, orch: StandInOrchestrator, caller: str) -> None:
        super().__init__()
        self.handlers = handlers(orch)
        self.caller = caller

    async def request(
        self, request_type: str, args: Any = None, *, timeout: float | None = None
    ) -> Any:
        payload = json.loads(json.dumps(dict(args or {})))
        try:
            result = await self.handlers[request_type](self.caller, payload)
        except HostRequestError as exc:
            raise error_from_reply({"code": exc.code, "message": exc.message}) from None
        return json.loads(json.dumps(result))


async def test_the_kernel_api_against_the_host_handlers(orch: StandInOrchestrator) -> None:
    api = RlmHeartbeat(HostBridge(orch, "s-a"))
    made = await api.create("check CI", interval=30, label="ci", delivery="follow_up")
    assert (made.interval, made.delivery, made.next_run_at) == (
        "every 30s",
        "follow_up",
        at(30).isoformat(),
    )
    other = await RlmHeartbeat(HostBridge(orch, "s-b")).create("theirs", label="ci")
    with pytest.raises(InvalidArgument, match="shortest interval"):
        await api.create("too fast", interval="5s")
    with pytest.raises(InvalidArgument, match="taken"):
        await api.create("again", label="ci")
    with pytest.raises(NotFound):
        await api.delete(other.id)
    paused = await api.pause("ci")
    assert paused.paused and paused.id == made.id
    assert [hb.status for hb in await api.list()] == ["paused"]
    gone = await api.delete("ci")
    assert gone.status == "cancelled"
    assert list(await api.list()) == []
    assert [hb.id for hb in await api.list(include_inactive=True)] == [made.id]
