"""The CLI as a daemon client, as a user drives it: real ``prime-agent`` processes, a real daemon
(started by the CLI itself), real sandboxes, the scripted model over HTTP.

Autostart is off in the test suite (tests/conftest.py); these tests turn it on and leave the
daemon to the conftest teardown (plus their own ``daemon stop`` where they check it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.paths import Paths
from orchestrator.store.db import Store
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, daemon_pids, stop_daemons, wait_until, write_config
from tests.integration.test_family import THREE_CHILDREN

# Bounds, not expectations: a loaded machine starts a daemon and a kernel in several seconds.
TURN_TIMEOUT_S = 90.0
DETACH_TIMEOUT_S = 15.0
# The CLI with the interpreter listing every module it imports (on stderr).
IMPORT_TIMES = (sys.executable, "-X", "importtime", "-m", "orchestrator")
FAST_RETRIES = "retry_base_delay_s = 0.01\nmodel_max_retries = 1\n"

SESSION_SCRIPT = """
repeat forever:
    when "first task": text: first answer
    when "hello there": text: hi back
    when "nap please":
        code:
            import time
            time.sleep(4)
            print("slept")
    when "also this": text: steered
    when "slept": text: woke up
    when "remember 7": text: noted 7
    when "what number": text: it was 7
    when "and again": text: 7 again
"""


def _configure(srv: FakeModelServer) -> None:
    """The daemon resolves a woken session's model from its config: point openai/fake here."""
    write_config(FAST_RETRIES + f'[models."openai/fake"]\napi_base = "{srv.url}"\n')


@pytest.fixture
def autostart(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PRIME_AGENT_DAEMON_AUTOSTART", "1")
    yield
    stop_daemons(os.environ["XDG_RUNTIME_DIR"])


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer(SESSION_SCRIPT) as srv:
        _configure(srv)
        yield srv


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Attached:
    """``prime-agent ARGS`` (attach, --resume) running in the background, output collected."""

    def __init__(self, args: list[str], cwd: Path | None = None, sigint_ignored: bool = False):
        # sigint_ignored: started as a parent that ignores SIGINT starts it (a child inherits
        # the ignored disposition); Ctrl-C must detach all the same.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
            cwd=cwd,
            preexec_fn=_ignore_sigint if sigint_ignored else None,
        )
        self.out: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.out.append(line)

    @property
    def text(self) -> str:
        return "".join(self.out)

    def wait_for(self, needle: str, timeout: float = TURN_TIMEOUT_S) -> bool:
        return wait_until(lambda: needle in self.text, timeout=timeout)

    def detach(self) -> tuple[int, str]:
        """Ctrl-C, as a user presses it."""
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=DETACH_TIMEOUT_S)
        self._reader.join(timeout=DETACH_TIMEOUT_S)
        assert self.proc.stderr is not None
        return code, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _observe(selector: str, last: int = 30) -> dict[str, Any]:
    proc = cli(["observe", selector, "--json", "--last", str(last)])
    assert proc.returncode == 0, proc.stderr
    view: dict[str, Any] = json.loads(proc.stdout)
    return view


def _said(selector: str, text: str) -> bool:
    return any(
        e["type"] == "assistant_message" and text in e["payload"]["text"]
        for e in _observe(selector)["events"]
    )


def _stored_events() -> dict[str, list[tuple[str, Any]]]:
    """Every session's events from the database (no daemon may hold it)."""

    async def read() -> dict[str, list[tuple[str, Any]]]:
        store = await Store.open(Paths.from_env().database_file, read_only=True)
        try:
            out = {}
            for rec in await store.list_sessions():
                out[rec.id] = [(e.type, e.payload) for e in await store.events(rec.id)]
            return out
        finally:
            await store.close()

    return asyncio.run(read())


def _names() -> dict[str, str]:
    async def read() -> dict[str, str]:
        store = await Store.open(Paths.from_env().database_file, read_only=True)
        try:
            return {rec.id: rec.name or rec.id for rec in await store.list_sessions()}
        finally:
            await store.close()

    return asyncio.run(read())


def _by_session(lines: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for event in lines:
        if "seq" in event:
            out.setdefault(event["session_id"], []).append(event)
    return out


# ------------------------------------------------------------------------------------- tests


def test_agents_starts_one_daemon_and_json_mode_streams_the_family(autostart: None) -> None:
    with FakeModelServer(THREE_CHILDREN) as srv:
        _configure(srv)
        first = cli(["agents"])
        assert first.returncode == 0, first.stderr
        assert first.stdout == "no sessions yet\n"
        (pid,) = daemon_pids()
        again = cli(["agents", "--json"])
        assert again.returncode == 0 and json.loads(again.stdout) == []
        assert daemon_pids() == [pid]  # reused, not a second one

        run = ["-p", "spawn three", "--mode", "json", "--model", "openai/fake"]
        proc = cli(run)
        assert proc.returncode == 0, proc.stderr
        lines = [json.loads(line) for line in proc.stdout.splitlines()]
        header, durable = lines[0], lines[1:]
        assert header["type"] == "session" and header["version"] == 3
        root = header["id"]
        streamed = _by_session(durable)
        assert len(streamed) == 4  # the root and its three children, as in-process
        for events in streamed.values():  # each session complete and in order
            assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert durable[-1]["type"] == "run_end" and durable[-1]["session_id"] == root
        assert durable[-1]["payload"]["reason"] == "completed"

        # While the daemon holds the database, agents and usage ask it.
        listing = cli(["agents", "--json"])
        assert listing.returncode == 0, listing.stderr
        (tree,) = json.loads(listing.stdout)
        assert tree["session_id"] == root and tree["name"] == "spawn three"
        assert sorted(k["name"] for k in tree["children"]) == ["a", "b", "c"]
        assert tree["total"]["calls"] == len(srv.requests)
        table = cli(["agents"])
        assert table.returncode == 0 and table.stdout.splitlines()[1].startswith("spawn three")
        usage_tree = cli(["usage", "--tree", root])
        assert usage_tree.returncode == 0, usage_tree.stderr
        rows = usage_tree.stdout.splitlines()
        assert rows[1].startswith("spawn three")
        assert sum(r.lstrip("│ ").startswith(("├─", "└─")) for r in rows) == 3
        usage = cli(["usage", root])
        assert usage.returncode == 0, usage.stderr
        (row,) = usage.stdout.splitlines()[1:]
        assert row.startswith(root) and "unknown" in row and "spawn three" in row
        assert daemon_pids() == [pid]

        stopped = cli(["daemon", "stop"])
        assert stopped.returncode == 0, stopped.stderr
        # Everything the client saw is in the database, in order, and nothing is missing.
        stored = _stored_events()
        for sid, events in streamed.items():
            assert [(e["type"], e["payload"]) for e in events] == stored[sid]

        # The same run in-process: the same sessions, and each child's stream the same.
        local = cli([*run, "--no-daemon"])
        assert local.returncode == 0, local.stderr
    local_lines = [json.loads(line) for line in local.stdout.splitlines()]
    local_streamed = _by_session(local_lines)
    names = _names()

    def children(streams: dict[str, list[dict[str, Any]]]) -> dict[str, list[str]]:
        """Each child's event types by name (the root's depend on when replies arrive)."""
        return {names[s]: [e["type"] for e in ev] for s, ev in streams.items() if s != root}

    daemon_kids = children(streamed)
    local_kids = {k: v for k, v in children(local_streamed).items() if k != "spawn three"}
    assert sorted(daemon_kids) == sorted(local_kids) == ["a", "b", "c"]
    assert daemon_kids == local_kids
    assert local_lines[-1]["type"] == "run_end"
    keys = {"type", "session_id", "seq", "id", "parent_id", "ts", "payload"}
    assert all(set(e) == keys for e in durable)
    assert all(set(e) == keys for e in local_lines if "seq" in e)


def test_send_attach_observe(autostart: None, model: FakeModelServer) -> None:
    # A session from an in-process run (--no-daemon: print mode would start the daemon) ...
    first = cli(["-p", "first task", "--model", "openai/fake", "--no-daemon"])
    assert first.returncode == 0, first.stderr
    assert first.stdout == "first answer\n"
    assert daemon_pids() == []
    # ... woken by `send`, which starts the daemon: idle, so the message starts a turn.
    sent = cli(["send", "first task", "hello there"])
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.startswith("delivered (session s-")
    assert len(daemon_pids()) == 1
    assert wait_until(lambda: _said("first task", "hi back"), timeout=TURN_TIMEOUT_S)

    attached = Attached(["attach", "first task"], sigint_ignored=True)
    try:
        # What it missed first (the whole history from cursor 0) ...
        assert attached.wait_for("hi back"), attached.text
        assert attached.text.index("first task") < attached.text.index("first answer")
        # ... then live events.
        nap = cli(["send", "first task", "nap please"])
        assert nap.returncode == 0 and nap.stdout.startswith("delivered"), nap.stderr
        assert attached.wait_for("» ipython:"), attached.text
        # Into the running turn, at its next model call.
        steer = cli(["send", "first task", "also this", "--steer"])
        assert steer.returncode == 0, steer.stderr
        assert steer.stdout.startswith("queued")
        code, err = attached.detach()
    finally:
        attached.kill()
    assert code == 0 and "detached from s-" in err
    # Detaching left the session running: the turn goes on to its answer.
    assert wait_until(
        lambda: _said("first task", "woke up") or _said("first task", "steered"),
        timeout=TURN_TIMEOUT_S,
    )
    view = _observe("first task")
    texts = [e["payload"].get("text") for e in view["events"] if e["type"] == "user_message"]
    assert "also this" in texts
    assert view["session"]["name"] == "first task" and view["usage"]["own"]["calls"] >= 4
    text_view = cli(["observe", "first task", "--last", "4"])
    assert text_view.returncode == 0 and text_view.stdout.startswith("s-")
    assert "-- newest 4 events" in text_view.stdout

    # Export while the daemon holds the database: through the daemon, to stdout and to a file.
    exported = cli(["export", "first task"])
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert lines[0]["type"] == "session"
    said = [e for e in lines if e.get("type") == "message"]
    assert any("also this" in json.dumps(e) for e in said)
    target = Path(os.environ["XDG_DATA_HOME"]) / "out.jsonl"
    to_file = cli(["export", "first task", "-o", str(target)])
    assert to_file.returncode == 0, to_file.stderr
    assert target.read_text() == exported.stdout
    assert target.stat().st_mode & 0o777 == 0o600
    assert len(daemon_pids()) == 1


def test_continue_and_resume(
    autostart: None, model: FakeModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    started = cli(["daemon", "start"])
    assert started.returncode == 0, started.stderr
    # Through the running daemon, without importing the in-process session stack (half a
    # second of the CLI's start; docs/benchmarks.md): the interpreter lists what it imported.
    first = subprocess.run(
        [*IMPORT_TIMES, "-p", "remember 7", "--model", "openai/fake"],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        cwd=project,
        timeout=TURN_TIMEOUT_S,
        check=False,
    )
    assert first.returncode == 0 and first.stdout == "noted 7\n", first.stderr
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in first.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "orchestrator.cli.via_daemon" in imported
    assert not imported & {
        "orchestrator.sessions.runner",
        "litellm",
        "duckdb",
        "orchestrator.store.db",
        "typer",  # a plain -p is parsed without it (cli/entry.py)
        "orchestrator.cli.app",
        "pydantic",  # the daemon validates; the client sends plain data (api/client.py)
        "orchestrator.settings",  # config.toml's few values are read with tomllib
    }

    # --continue: the newest session of this directory, with its history.
    cont = cli(["--continue", "-p", "what number?"], cwd=project)
    assert cont.returncode == 0, cont.stderr
    assert cont.stdout == "it was 7\n"
    history = [m.get("content") for m in model.requests[-1]["messages"] if m["role"] == "user"]
    assert history[-2:] == ["remember 7", "what number?"]

    # --resume NAME in JSON mode: only this run's events, ending with run_end.
    resumed = cli(["--resume", "remember 7", "--mode", "json", "-p", "and again"])
    assert resumed.returncode == 0, resumed.stderr
    lines = [json.loads(line) for line in resumed.stdout.splitlines()]
    sid = lines[0]["id"]
    durable = lines[1:]
    assert {e["session_id"] for e in durable} == {sid}
    assert durable[0]["type"] == "user_message" and durable[0]["payload"]["text"] == "and again"
    assert durable[-1]["type"] == "run_end" and durable[-1]["payload"]["final_text"] == "7 again"
    seqs = [e["seq"] for e in durable]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and seqs[0] > 1

    # User errors: one line, exit 2.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for args, cwd, needle in (
        (["--continue", "-p", "x"], elsewhere, "no session to continue"),
        (["--resume", "nosuch", "-p", "x"], project, "no session matches"),
        (["--resume", "remember 7", "--continue"], project, "exclude each other"),
    ):
        bad = cli(args, cwd=cwd)
        assert bad.returncode == 2, (args, bad.stderr)
        assert needle in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr

    # --resume without a task attaches.
    attached = Attached(["--resume", "remember 7"])
    try:
        assert attached.wait_for("7 again"), attached.text
        code, err = attached.detach()
    finally:
        attached.kill()
    assert code == 0 and f"detached from {sid}" in err

    # Autostart off and no daemon: commands that need one say how to get one; agents reads
    # the database itself.
    assert cli(["daemon", "stop"]).returncode == 0
    monkeypatch.setenv("PRIME_AGENT_DAEMON_AUTOSTART", "0")
    refused = cli(["attach", "remember 7"])
    assert refused.returncode == 2 and "prime-agent daemon start" in refused.stderr
    assert refused.stderr.count("\n") == 1
    listing = cli(["agents", "--json"])
    assert listing.returncode == 0, listing.stderr
    assert [r["session_id"] for r in json.loads(listing.stdout)] == [sid]
    assert daemon_pids() == []


CLIENT_ID = "test-client-1"


def test_idempotent_commands_survive_a_daemon_restart(
    model: FakeModelServer, tmp_path: Path
) -> None:
    from orchestrator.api.client import ControlClient
    from orchestrator.api.errors import ApiCommandError
    from orchestrator.api.journal import JOURNAL_FILE_MODE, JOURNAL_FILE_NAME

    async def commands() -> tuple[Any, Any]:
        async with await ControlClient.connect(client_id=CLIENT_ID) as client:
            created = await client.call(
                "create_session", command_id="create-1", cwd=str(tmp_path), model="openai/fake"
            )
            sid = created["session"]
            prompted = await client.call(
                "prompt", command_id="prompt-1", session=sid, text="remember 7"
            )
            await client.call("wait_quiet", session=sid, timeout_s=TURN_TIMEOUT_S)
            return created, prompted

    assert cli(["daemon", "start"]).returncode == 0
    created, prompted = asyncio.run(commands())
    assert prompted["status"] == "delivered"
    calls = len(model.requests)
    assert calls == 1
    first_pid = daemon_pids()
    assert cli(["daemon", "stop"]).returncode == 0
    assert cli(["daemon", "start"]).returncode == 0
    assert daemon_pids() != first_pid

    # The same client and command ids after the restart: the stored answers, nothing rerun.
    assert asyncio.run(commands()) == (created, prompted)
    assert len(model.requests) == calls

    async def listing_and_conflict() -> list[Any]:
        async with await ControlClient.connect(client_id=CLIENT_ID) as client:
            sessions = (await client.call("list_sessions"))["sessions"]
            with pytest.raises(ApiCommandError) as info:
                await client.call("create_session", command_id="create-1", cwd="/")
            assert info.value.code == "conflict"
            return list(sessions)

    assert [s["id"] for s in asyncio.run(listing_and_conflict())] == [created["session"]]
    journal = Paths.from_env().runtime_dir / JOURNAL_FILE_NAME
    assert journal.stat().st_mode & 0o777 == JOURNAL_FILE_MODE
    assert cli(["daemon", "stop"]).returncode == 0


def test_new_sessions_see_config_toml_as_it_is_now(autostart: None, tmp_path: Path) -> None:
    """An edit of config.toml reaches the next session without a restart; a section only a
    restart applies is named in one line; a file that no longer parses fails that run in one
    line and the daemon keeps serving."""
    with (
        FakeModelServer("repeat forever:\n    text: from A") as first,
        FakeModelServer("repeat forever:\n    text: from B") as second,
    ):
        _configure(first)
        started = cli(["daemon", "start"])
        assert started.returncode == 0, started.stderr
        before = cli(["-p", "hi", "--model", "openai/fake"], timeout=TURN_TIMEOUT_S)
        assert before.returncode == 0 and before.stdout == "from A\n", before.stderr

        _configure(second)  # the same model, another endpoint: no restart
        after = cli(["-p", "hi", "--model", "openai/fake"], timeout=TURN_TIMEOUT_S)
        assert after.returncode == 0 and after.stdout == "from B\n", after.stderr
        assert "daemon restart" not in after.stderr
        assert len(first.requests) == 1 and len(second.requests) == 1

        write_config(
            FAST_RETRIES
            + f'[models."openai/fake"]\napi_base = "{second.url}"\n[sandbox]\ncpus = 1.5\n'
        )
        noted = cli(["-p", "hi", "--model", "openai/fake"], timeout=TURN_TIMEOUT_S)
        assert noted.returncode == 0 and noted.stdout == "from B\n", noted.stderr
        assert "[sandbox] changed since the daemon started" in noted.stderr
        assert "prime-agent daemon restart" in noted.stderr

        write_config("this is [not toml\n")
        broken = cli(["-p", "hi", "--model", "openai/fake"], timeout=TURN_TIMEOUT_S)
        assert broken.returncode == 2
        assert "not valid TOML" in broken.stderr and "Traceback" not in broken.stderr
        assert len(daemon_pids()) == 1  # still serving


def test_print_mode_starts_the_daemon_and_concurrent_runs_share_it(
    autostart: None, model: FakeModelServer, tmp_path: Path
) -> None:
    """No daemon runs: two `-p` runs at once both start one (only one comes up), both go
    through it (no "database in use"), and it stays for the next run."""
    assert daemon_pids() == []
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "-p", task, "--model", "openai/fake"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        for task in ("first task", "hello there")
    ]
    outputs = [run.communicate(timeout=TURN_TIMEOUT_S) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err for _, err in outputs]
    assert [out for out, _ in outputs] == ["first answer\n", "hi back\n"]
    assert len(daemon_pids()) == 1
    again = cli(["-p", "remember 7", "--model", "openai/fake"], cwd=tmp_path)
    assert again.returncode == 0 and again.stdout == "noted 7\n", again.stderr
    assert len(daemon_pids()) == 1
    listing = cli(["agents", "--json"])
    assert listing.returncode == 0, listing.stderr
    assert len(json.loads(listing.stdout)) == 3  # all three in the daemon's one database


def test_sigusr1_writes_every_threads_stack_to_the_log(autostart: None) -> None:
    """A hung or spinning daemon can be read without a debugger, and keeps serving after."""
    from orchestrator.daemon.service import daemon_log_path

    started = cli(["daemon", "start"])
    assert started.returncode == 0, started.stderr
    (pid,) = daemon_pids()
    log = daemon_log_path(Paths.from_env())
    before = log.read_text(encoding="utf-8")
    os.kill(pid, signal.SIGUSR1)
    assert wait_until(
        lambda: "most recent call first" in log.read_text(encoding="utf-8")[len(before) :],
        timeout=DETACH_TIMEOUT_S,
    ), log.read_text(encoding="utf-8")[len(before) :]
    dump = log.read_text(encoding="utf-8")[len(before) :]
    assert "Current thread" in dump or "Thread 0x" in dump
    assert cli(["agents"]).returncode == 0  # still serving
    assert daemon_pids() == [pid]
