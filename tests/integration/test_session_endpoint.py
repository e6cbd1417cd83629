"""A session's model endpoint and sandbox policy belong to the session (issue 15, item 1).

Real daemons (``prime-agent daemon start``, ``kill -9``), the CLI as a user runs it, the DuckDB
file, local kernel gateways and two scripted models over real HTTP on the loopback:

- a session created with ``--api-base A`` (and the key in ``OPENAI_API_KEY``) keeps talking to
  A after a ``kill -9`` and a restart whose environment points ``OPENAI_BASE_URL`` at B: its
  resumed turn (``-r SID``), a child ``rlm()`` spawns without a model, and the turn after an
  idle unload and wake all go to A; B gets no request (so no key). The key is nowhere in the
  database file; the row stores the variable's name;
- naming another endpoint on resume is an explicit switch (a ``model_change`` event naming
  both endpoints, then stored); a stored endpoint that is down is an error naming it, not a
  fallback to the daemon's ``OPENAI_BASE_URL``;
- the sandbox policy (workspace mode, image, limits) a session was created with is what its
  sandbox gets after the daemon restarts with another ``[sandbox]``;
- a row stored before migration 0007 (no spec) still loads, and its endpoint is stored then.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api.client import ControlClient
from orchestrator.ids import new_session_id
from orchestrator.models.registry import ResolvedModel, resolve_model
from orchestrator.paths import Paths
from orchestrator.sandbox.local import LocalBackend
from orchestrator.sessions.manager import Orchestrator, SessionNotLoadable
from orchestrator.settings import Settings
from orchestrator.store.db import SessionRecord, Store
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, kill_9, need, write_config
from tests.integration.test_daemon import _daemon_pids, daemon_cli

pytestmark = pytest.mark.timeout(600)

POLL_TIMEOUT_S = 120.0
POLL_INTERVAL_S = 0.1
STOP_TIMEOUT_S = 30.0
IDLE_UNLOAD_S = 1.0
# What a user keeps in OPENAI_API_KEY: it must reach only the endpoint the session names.
SECRET_KEY = "sk-test-8f3c1d9e2b7a4c6d0e5f1a2b3c4d5e6f"
BASE_CONFIG = (
    f"retry_base_delay_s = 0.01\nmodel_max_retries = 1\nidle_unload_seconds = {IDLE_UNLOAD_S}\n"
)

SCRIPT = """
repeat forever:
    when "finished without messaging you":
        text: the child finished
    when "spawned":
        text: waiting for the child
    when "child task":
        text: child done
    when "spawn a child":
        code: h = await rlm("child task: answer done"); print("spawned", h.name)
    when "where":
        code: import os; print("cwd", os.getcwd())
    when "cwd ":
        text: located
    when "hello":
        text: hi there
"""


@pytest.fixture
def servers() -> Iterator[tuple[FakeModelServer, FakeModelServer]]:
    a = FakeModelServer(SCRIPT).start()
    b = FakeModelServer(SCRIPT).start()
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def daemons() -> Iterator[None]:
    yield
    if _daemon_pids():
        daemon_cli("stop", "--force")


def _start_daemon() -> int:
    started = daemon_cli("start")
    assert started.returncode == 0, started.stderr
    (pid,) = _daemon_pids()
    return pid


def _created(proc: Any) -> str:
    """The session id of a ``--mode json`` run (its first line)."""
    assert proc.returncode == 0, proc.stderr
    header = json.loads(proc.stdout.splitlines()[0])
    assert header["type"] == "session"
    return str(header["id"])


def _authorizations(server: FakeModelServer) -> set[str]:
    return {h.get("authorization", "") for h in server.request_headers}


def _last_texts(server: FakeModelServer) -> list[str]:
    return [str(r["messages"][-1].get("content")) for r in server.requests]


async def _rows() -> dict[str, SessionRecord]:
    async with await Store.open(Paths.from_env().database_file, read_only=True) as store:
        return {r.id: r for r in await store.list_sessions()}


async def _events(sid: str) -> list[dict[str, Any]]:
    async with await Store.open(Paths.from_env().database_file, read_only=True) as store:
        return [{"type": e.type, **e.payload} for e in await store.events(sid)]


async def _poll(what: str, probe: Any) -> Any:
    try:
        async with asyncio.timeout(POLL_TIMEOUT_S):
            while not (found := await probe()):
                await asyncio.sleep(POLL_INTERVAL_S)
            return found
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def _prompt_then_unloaded(sid: str, text: str, answer: str) -> None:
    """Prompt over the socket (waking the session), wait for ``answer``, then for the idle
    sweep to unload it (no client stays attached)."""
    client = await ControlClient.connect()
    try:
        assert (await client.call("prompt", session=sid, text=text))["status"] == "delivered"

        async def answered() -> bool:
            found = await client.call("get_session", session=sid, recent=5)
            said = any(
                e["type"] == "assistant_message" and e["payload"]["text"] == answer
                for e in found["events"]
            )
            return said and found["session"]["status"] == "idle"

        await _poll(f"{answer!r}", answered)

        async def unloaded() -> bool:
            return not (await client.call("get_session", session=sid))["session"]["live"]

        await _poll("the idle unload", unloaded)
    finally:
        await client.close()


def _database_bytes() -> bytes:
    db = Paths.from_env().database_file
    return b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*") if p.is_file())


def test_a_restarted_daemon_keeps_each_sessions_endpoint(
    servers: tuple[FakeModelServer, FakeModelServer],
    daemons: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = servers
    write_config(BASE_CONFIG)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET_KEY)
    pid = _start_daemon()
    first = cli(
        ["-p", "hello", "--mode", "json", "--model", "openai/fake", "--api-base", a.url],
        cwd=tmp_path,
    )
    sid = _created(first)
    assert len(a.requests) == 1 and _authorizations(a) == {f"Bearer {SECRET_KEY}"}

    kill_9(pid, STOP_TIMEOUT_S)
    # The restarted daemon's environment points the openai provider at B (same key).
    monkeypatch.setenv("OPENAI_BASE_URL", b.url)
    _start_daemon()

    # -r SID: the resumed turn, and the child rlm() spawns without naming a model, go to A.
    resumed = cli(["-r", sid, "-p", "spawn a child"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "the child finished"
    assert b.requests == []  # not the daemon's OPENAI_BASE_URL
    texts = _last_texts(a)
    assert any(t.endswith("spawn a child") for t in texts)
    assert any("child task" in t for t in texts), texts  # the child's own model call

    # An idle unload (the sweep, no client attached) and a wake by a prompt: still A.
    asyncio.run(_prompt_then_unloaded(sid, "hello", "hi there"))
    asked = len(a.requests)
    asyncio.run(_prompt_then_unloaded(sid, "hello", "hi there"))
    assert len(a.requests) == asked + 1

    assert b.requests == [] and b.request_headers == []  # not one call: no key, no history
    assert _authorizations(a) == {f"Bearer {SECRET_KEY}"}

    stop = daemon_cli("stop")
    assert stop.returncode == 0, stop.stderr
    rows = asyncio.run(_rows())
    child = next(r for r in rows.values() if r.parent_id == sid)
    for row in (rows[sid], child):
        assert row.model_spec is not None, row
        assert row.model_spec.api_base == a.url
        assert row.model_spec.api_key_env == "OPENAI_API_KEY"  # its name, never its value
    assert SECRET_KEY.encode() not in _database_bytes()
    assert SECRET_KEY not in repr(rows)


def test_naming_another_endpoint_on_resume_is_a_recorded_switch(
    servers: tuple[FakeModelServer, FakeModelServer],
    daemons: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = servers
    write_config(BASE_CONFIG)
    with FakeModelServer(SCRIPT) as fallback:
        # The daemon's own OPENAI_BASE_URL: never used silently for a session that names A.
        monkeypatch.setenv("OPENAI_BASE_URL", fallback.url)
        _start_daemon()
        created = cli(
            ["-p", "hello", "--mode", "json", "--model", "openai/fake", "--api-base", a.url],
            cwd=tmp_path,
        )
        sid = _created(created)

        switched = cli(["-r", sid, "--api-base", b.url, "-p", "hello"], cwd=tmp_path)
        assert switched.returncode == 0, switched.stderr
        assert switched.stdout.strip() == "hi there"
        assert f"switched to openai/fake at {b.url}" in switched.stderr
        assert (len(a.requests), len(b.requests)) == (1, 1)

        b_url = b.url
        b.close()  # the session's (new) endpoint goes down
        down = cli(["-r", sid, "-p", "hello"], cwd=tmp_path)
        assert down.returncode != 0
        assert b_url in down.stderr, down.stderr  # the error names the stored endpoint
        # Nothing fell back to the daemon's OPENAI_BASE_URL, nor to the endpoint before.
        assert fallback.requests == [] and len(a.requests) == 1

        stop = daemon_cli("stop")
        assert stop.returncode == 0, stop.stderr
    (change,) = [e for e in asyncio.run(_events(sid)) if e["type"] == "model_change"]
    assert change["api_base"] == b_url and change["previous_api_base"] == a.url
    assert change["model"] == change["previous"] == "openai/fake"
    row = asyncio.run(_rows())[sid]
    assert row.model_spec is not None and row.model_spec.api_base == b_url


def test_a_sessions_sandbox_policy_survives_a_restart_with_another_config(
    servers: tuple[FakeModelServer, FakeModelServer],
    daemons: None,
    tmp_path: Path,
) -> None:
    a, _b = servers
    project = tmp_path / "project"
    project.mkdir()
    # The model comes from the config both times: this test is about the sandbox alone.
    model = f'[models."openai/fake"]\napi_base = "{a.url}"\n'
    policy = (
        '[sandbox]\nworkspace = "copy"\nimage = "rust"\n'
        "memory_mib = 1536\ncpus = 1.5\npids_limit = 300\n"
    )
    write_config(BASE_CONFIG + model + policy)
    pid = _start_daemon()
    first = cli(["-p", "where", "--mode", "json", "--model", "openai/fake"], cwd=project)
    sid = _created(first)
    kill_9(pid, STOP_TIMEOUT_S)

    write_config(BASE_CONFIG + model)  # the restarted daemon's own policy: rw, session image
    _start_daemon()
    again = cli(["-r", sid, "-p", "where"], cwd=project)
    assert again.returncode == 0, again.stderr
    cwds = [t for t in _last_texts(a) if t.startswith("cwd ")]
    assert len(cwds) == 2
    # copy mode: the kernel works in a private copy, both times, never in the project itself.
    assert all(str(project) not in t.split()[1] for t in cwds), cwds

    stop = daemon_cli("stop")
    assert stop.returncode == 0, stop.stderr
    stored = asyncio.run(_rows())[sid].sandbox_policy
    assert stored is not None
    assert (stored.backend, stored.workspace, stored.image) == ("local", "copy", "rust")
    assert (stored.memory_bytes, stored.cpus, stored.pids) == (1536 * 1024 * 1024, 1.5, 300)


async def test_a_row_from_before_0007_loads_and_keeps_its_endpoint_from_then_on() -> None:
    paths = Paths.from_env()
    settings = Settings(retry_base_delay_s=0.01)
    with FakeModelServer("text: hi there") as srv:
        url = srv.url

        async def resolve(selector: str) -> ResolvedModel:
            return resolve_model(selector, settings, api_base=srv.url, env={})

        async with await Store.open(paths.database_file) as store:
            sid = new_session_id()
            # What migration 0007 leaves of an older row: both spec columns NULL.
            await store.create_session(
                SessionRecord(
                    id=sid,
                    root_id=sid,
                    cwd=str(paths.database_file.parent),
                    model="openai/fake",
                    backend="local",
                    status="inactive",
                )
            )
            orch = Orchestrator(
                store=store,
                backend=LocalBackend(pool_size=0),
                settings=settings,
                paths=paths,
                resolve=resolve,
            )
            try:
                live = await orch.load_session_id(sid)
                assert live.model.api_base == srv.url
            finally:
                await orch.close()
            row = await store.get_session(sid)
    assert row is not None and row.model_spec is not None and row.sandbox_policy is not None
    assert row.model_spec.api_base == url  # pinned: a later load no longer drifts
    assert row.sandbox_policy.backend == "local"


def _docker_image() -> None:
    from tests.integration.test_sandbox_conformance import docker_ready

    why = docker_ready()
    if why is not None:
        need("docker", why)


def test_a_docker_sessions_network_and_limits_survive_a_daemon_restart(
    servers: tuple[FakeModelServer, FakeModelServer], daemons: None, tmp_path: Path
) -> None:
    from orchestrator.sandbox.docker import list_owned, remove_containers
    from orchestrator.sandbox.images import docker_client
    from tests.integration.test_sandbox_conformance import workspace

    _docker_image()
    a, _b = servers
    project = workspace(tmp_path / "ws")
    model = f'[models."openai/fake"]\napi_base = "{a.url}"\n'
    limits = "[sandbox]\nmemory_mib = 768\ncpus = 1.25\npids_limit = 222\n"
    write_config(BASE_CONFIG + model + limits)
    # Created in process with outside network and its own limits (the daemon never grants
    # network itself), then resumed by a daemon whose config has the defaults.
    first = cli(
        [
            *("-p", "hello", "--mode", "json", "--model", "openai/fake"),
            *("--no-daemon", "--backend", "docker", "--network"),
        ],
        cwd=project,
    )
    sid = _created(first)
    write_config(BASE_CONFIG.replace(str(IDLE_UNLOAD_S), "600") + model)
    _start_daemon()
    try:

        async def located() -> None:
            client = await ControlClient.connect()
            try:
                sent = await client.call("prompt", session=sid, text="where")
                assert sent["status"] == "delivered"

                async def done() -> bool:
                    found = await client.call("get_session", session=sid, recent=5)
                    return any(
                        e["type"] == "assistant_message" and e["payload"]["text"] == "located"
                        for e in found["events"]
                    )

                try:
                    await _poll("the cell in the new container", done)
                except AssertionError:
                    found = await client.call("get_session", session=sid, recent=8)
                    print("EVENTS", found["events"], "A", _last_texts(a))
                    raise
            finally:
                await client.close()

        asyncio.run(located())
        (container,) = [c for c in list_owned() if c.session_id == sid]
        host = docker_client().containers.get(container.id).attrs["HostConfig"]
        assert host["NetworkMode"] == "bridge"  # the session's --network, not the daemon's none
        assert host["Memory"] == 768 * 1024 * 1024
        assert host["NanoCpus"] == int(1.25 * 1e9)
        assert host["PidsLimit"] == 222
    finally:
        log = Paths.from_env().runtime_dir / "daemon.log"
        print(log.read_text()[-6000:] if log.exists() else "no daemon log")
        shutdown = cli(["shutdown"])
        assert shutdown.returncode == 0, shutdown.stderr
        remove_containers([c.id for c in list_owned() if c.session_id == sid])


async def test_a_stored_spec_that_cannot_be_read_refuses_the_load() -> None:
    """A damaged row is not run against whatever endpoint this process would pick."""
    paths = Paths.from_env()
    settings = Settings()

    async def resolve(selector: str) -> ResolvedModel:
        raise AssertionError(f"a damaged row must not be resolved anew ({selector})")

    async with await Store.open(paths.database_file) as store:
        sid = new_session_id()
        await store.create_session(
            SessionRecord(
                id=sid,
                root_id=sid,
                cwd=str(paths.database_file.parent),
                model="openai/fake",
                backend="local",
                status="inactive",
            )
        )
        await store.transaction(
            lambda con: con.execute(
                "UPDATE sessions SET model_spec = $1 WHERE id = $2",
                ['{"selector": "openai/fake", "api_base": 7}', sid],
            )
        )
        row = await store.get_session(sid)
        assert row is not None and row.model_spec is None
        assert row.spec_problem is not None and "model_spec" in row.spec_problem
        orch = Orchestrator(
            store=store,
            backend=LocalBackend(pool_size=0),
            settings=settings,
            paths=paths,
            resolve=resolve,
        )
        try:
            with pytest.raises(SessionNotLoadable, match="stored model_spec cannot be read"):
                await orch.load_session_id(sid)
        finally:
            await orch.close()


CLIENT_KEY = "sk-client-0a1b2c3d4e5f60718293a4b5c6d7e8f9"
DAEMON_KEY = "sk-daemon-ffeeddccbbaa99887766554433221100"


def _files_under(root: Path) -> bytes:
    data = b""
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            with contextlib.suppress(OSError):
                data += path.read_bytes()
    return data


def test_a_clients_key_and_base_url_travel_with_its_session(
    servers: tuple[FakeModelServer, FakeModelServer],
    daemons: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A daemon started from another shell (its own key, its OPENAI_BASE_URL at B) calls the
    endpoint and uses the key of the shell a run came from, for that session's family, also
    after an idle unload and a wake; the key is written nowhere."""
    a, b = servers
    write_config(BASE_CONFIG)
    monkeypatch.setenv("OPENAI_API_KEY", DAEMON_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", b.url)
    _start_daemon()

    monkeypatch.setenv("OPENAI_API_KEY", CLIENT_KEY)  # this shell's
    monkeypatch.setenv("OPENAI_BASE_URL", a.url)
    first = cli(["-p", "hello", "--mode", "json", "--model", "openai/fake"], cwd=tmp_path)
    sid = _created(first)
    assert b.requests == [] and _authorizations(a) == {f"Bearer {CLIENT_KEY}"}

    # Out of memory and woken by a prompt (no client env on that path): the key this
    # session's client sent, not the daemon's.
    asyncio.run(_prompt_then_unloaded(sid, "hello", "hi there"))
    asyncio.run(_prompt_then_unloaded(sid, "hello", "hi there"))
    assert b.requests == []
    assert _authorizations(a) == {f"Bearer {CLIENT_KEY}"}

    stop = daemon_cli("stop")
    assert stop.returncode == 0, stop.stderr
    rows = asyncio.run(_rows())
    assert rows[sid].model_spec is not None and rows[sid].model_spec.api_base == a.url
    assert CLIENT_KEY.encode() not in _database_bytes()
    runtime = Path(os.environ["XDG_RUNTIME_DIR"])
    state = Path(os.environ["XDG_DATA_HOME"])
    assert CLIENT_KEY.encode() not in _files_under(runtime) + _files_under(state)
