"""Issue 5 figures, against a real daemon process and the scripted model in its own process:

- ``-p`` through a running daemon (spawn → exit of the CLI), against the reference's 1.73 s;
- daemon RSS with N idle sessions (each with its sandbox started), and the whole tree's PSS;
- events/s sustained to three attached clients while N sessions take prompts back to back
  (each prompt commits user_message, assistant_message and usage: three pushed events);
- attach latency for a session with 100,000 events: a few missed events (replay) and cursor 0
  (snapshot); the session is inactive, so the first attach also loads it (context assembly).

The 100,000-event session is written before the daemon starts (it owns the file afterwards):
one session row and one bulk INSERT, the same rows the store would have written.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import (
    PYTHON,
    FakeServerProcess,
    cli_argv,
    cli_env,
    fake_model_config,
    private_xdg,
    row,
    time_command,
)
from orchestrator.api.client import ControlClient
from orchestrator.api.messages import Event
from orchestrator.errors import ApiError

__all__ = ["run"]

PRINT_REPEATS = 7
QUICK_PRINT_REPEATS = 3
PRINT_REFERENCE_S = 1.73
PRINT_TARGET_S = 0.3 * PRINT_REFERENCE_S
SESSIONS = 50
QUICK_SESSIONS = 10
PROMPTS_PER_SESSION = 20
QUICK_PROMPTS_PER_SESSION = 5
EVENTS_PER_PROMPT = 3  # user_message, assistant_message, usage
CLIENTS = 3
HISTORY_EVENTS = 100_000
QUICK_HISTORY_EVENTS = 20_000
ATTACH_MISSED = 10
ATTACH_REPEATS = 5
DAEMON_READY_TIMEOUT_S = 180.0
SANDBOXES_READY_TIMEOUT_S = 600.0
EVENTS_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60.0
POLL_S = 0.1
KIB_PER_MIB = 1024
# Issue 18 item 5: each further idle session costs the daemon at most this much (15 MB).
IDLE_SESSION_TARGET_MIB = 15e6 / (1024 * 1024)

SCRIPT = """
repeat forever:
    text: ok
    usage in=100 out=2
"""


@contextmanager
def _daemon(env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [PYTHON, "-m", "orchestrator.daemon"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            asyncio.run(_shutdown(_socket(env)))
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _socket(env: dict[str, str]) -> Path:
    return Path(env["XDG_RUNTIME_DIR"]) / "prime-agent" / "orchestrator.sock"


async def _client(socket: Path) -> ControlClient:
    async with asyncio.timeout(DAEMON_READY_TIMEOUT_S):
        while True:
            try:
                client = await ControlClient.connect(socket)
            except ApiError:
                await asyncio.sleep(POLL_S)
                continue
            if (await client.call("ping"))["ready"]:
                return client
            await client.close()
            await asyncio.sleep(POLL_S)


async def _shutdown(socket: Path) -> None:
    try:
        client = await ControlClient.connect(socket)
    except ApiError:
        return
    try:
        await client.call("shutdown", force=True)
    finally:
        await client.close()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _kernels_under(pid: int) -> int:
    from orchestrator.sandbox.proctree import descendants

    count = 0
    for p in descendants(pid):
        try:
            cmd = Path(f"/proc/{p.pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"ipykernel" in cmd:
            count += 1
    return count


def _tree_pss_kib(pid: int) -> int:
    from orchestrator.sandbox.proctree import descendants

    total = 0
    for p in [pid, *(d.pid for d in descendants(pid))]:
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total


async def _sessions_and_events(
    socket: Path, daemon_pid: int, cwd: Path, sessions: int, prompts: int
) -> dict[str, Any]:
    admin = await _client(socket)
    try:
        before_kib = _rss_kib(daemon_pid)
        ids = []
        for i in range(sessions):
            created = await admin.call(
                "create_session", cwd=str(cwd), model="openai/fake", name=f"bench-{i}"
            )
            ids.append(created["session"])
        # Idle sessions with their sandboxes up (bounded): then the daemon's own memory.
        async with asyncio.timeout(SANDBOXES_READY_TIMEOUT_S):
            while _kernels_under(daemon_pid) < sessions:
                await asyncio.sleep(POLL_S)
        rss_kib = _rss_kib(daemon_pid)
        idle = {
            "daemon_rss_kib": rss_kib,
            "per_idle_session_kib": (rss_kib - before_kib) / sessions,
            "tree_pss_kib": _tree_pss_kib(daemon_pid),
        }

        clients = [await _client(socket) for _ in range(CLIENTS)]
        expected = sessions * prompts * EVENTS_PER_PROMPT
        counts = [0] * CLIENTS
        done = [asyncio.Event() for _ in range(CLIENTS)]

        async def consume(index: int, client: ControlClient) -> None:
            seen: set[tuple[str, int]] = set()
            async for message in client.events():
                if isinstance(message, Event) and (message.session, message.cursor) not in seen:
                    seen.add((message.session, message.cursor))
                    counts[index] += 1
                    if counts[index] >= expected:
                        done[index].set()
                        return

        for client in clients:
            for sid in ids:
                await client.call("attach", session=sid, cursor=0)
        consumers = [asyncio.create_task(consume(i, c)) for i, c in enumerate(clients)]
        start = time.perf_counter()
        for _ in range(prompts):
            for sid in ids:
                await admin.call("prompt", session=sid, text="go")
        async with asyncio.timeout(EVENTS_TIMEOUT_S):
            for event in done:
                await event.wait()
        elapsed = time.perf_counter() - start
        for task in consumers:
            task.cancel()
        for client in clients:
            await client.close()
        return {**idle, "events": expected, "elapsed_s": elapsed}
    finally:
        await admin.close()


def _write_history(env: dict[str, str], count: int) -> str:
    """One inactive session with ``count`` chained notice events, written before the daemon
    starts (the daemon is the only writer while it runs)."""
    import duckdb

    from orchestrator.ids import new_session_id
    from orchestrator.paths import Paths
    from orchestrator.store.db import SessionRecord, Store
    from orchestrator.store.events import NoticePayload

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        paths = Paths.from_env()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    sid = new_session_id()

    async def first_event() -> str:
        paths.data_dir.mkdir(parents=True, exist_ok=True)
        store = await Store.open(paths.database_file)
        try:
            await store.create_session(
                SessionRecord(
                    id=sid,
                    root_id=sid,
                    cwd="/",
                    model="openai/fake",
                    backend="local",
                    status="inactive",
                    name="history",
                )
            )
            rec = await store.append(sid, "notice", NoticePayload(text="start"))
            return rec.id
        finally:
            await store.close()

    first = asyncio.run(first_event())
    con = duckdb.connect(str(paths.database_file))
    try:
        con.execute(
            """
            INSERT INTO events (session_id, seq, id, parent_event_id, type, ts, payload)
            SELECT ?, i, 'e-bench-' || i,
                   CASE WHEN i = 2 THEN ? ELSE 'e-bench-' || (i - 1) END,
                   'notice', now()::TIMESTAMP, json_object('text', 'history line ' || i)
            FROM range(2, ? + 1) t(i)
            """,
            [sid, first, count],
        )
        con.execute("UPDATE sessions SET leaf_event_id = ? WHERE id = ?", [f"e-bench-{count}", sid])
    finally:
        con.close()
    return sid


async def _attach_latency(socket: Path, sid: str, count: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"first": [], "missed": [], "snapshot": []}
    client = await _client(socket)
    try:
        for kind, cursor in (
            ("first", count - ATTACH_MISSED),
            *(("missed", count - ATTACH_MISSED) for _ in range(ATTACH_REPEATS)),
            *(("snapshot", 0) for _ in range(ATTACH_REPEATS)),
        ):
            start = time.perf_counter()
            answer = await client.call("attach", session=sid, cursor=cursor)
            out[kind].append(time.perf_counter() - start)
            assert answer["snapshot"] == (cursor == 0), answer["snapshot"]
            await client.call("detach", session=sid)
    finally:
        await client.close()
    return out


def run(quick: bool = False) -> dict[str, Any]:
    sessions = QUICK_SESSIONS if quick else SESSIONS
    prompts = QUICK_PROMPTS_PER_SESSION if quick else PROMPTS_PER_SESSION
    history = QUICK_HISTORY_EVENTS if quick else HISTORY_EVENTS
    repeats = QUICK_PRINT_REPEATS if quick else PRINT_REPEATS
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-daemon-") as tmp,
        FakeServerProcess(SCRIPT, Path(tmp)) as fake,
        private_xdg(Path(tmp)) as xdg,
    ):
        env = cli_env(xdg)
        env["PRIME_AGENT_BACKEND"] = "local"
        fake_model_config(xdg, fake.url)
        history_sid = _write_history(env, history)
        socket = _socket(env)
        with _daemon(env) as daemon:
            asyncio.run(_wait_ready(socket))
            latency = asyncio.run(_attach_latency(socket, history_sid, history))
            print_s = time_command(cli_argv("hi", fake.url), repeats, env=env)
            load = asyncio.run(
                _sessions_and_events(socket, daemon.pid, Path(tmp), sessions, prompts)
            )
    rows.append(
        row(
            "-p through a running daemon (spawn → exit)",
            "s",
            print_s,
            reference=PRINT_REFERENCE_S,
            target=PRINT_TARGET_S,
        )
    )
    rows.append(
        row(
            f"attach, session of {history:,} events: first (wakes it)",
            "ms",
            [s * 1000 for s in latency["first"]],
        )
    )
    rows.append(
        row(f"attach, {ATTACH_MISSED} missed events", "ms", [s * 1000 for s in latency["missed"]])
    )
    rows.append(row("attach, cursor 0 (snapshot)", "ms", [s * 1000 for s in latency["snapshot"]]))
    rows.append(
        row(
            f"events/s to {CLIENTS} attached clients, {sessions} busy sessions",
            "events/s",
            [load["events"] / load["elapsed_s"]],
            higher_is_better=True,
        )
    )
    rows.append(
        row(
            f"daemon RSS with {sessions} idle sessions",
            "MiB",
            [load["daemon_rss_kib"] / KIB_PER_MIB],
        )
    )
    rows.append(
        row(
            "  daemon RSS per further idle session",
            "MiB",
            [load["per_idle_session_kib"] / KIB_PER_MIB],
            target=IDLE_SESSION_TARGET_MIB,
        )
    )
    rows.append(
        row(
            f"whole tree PSS with {sessions} idle sessions (sandboxes included)",
            "MiB",
            [load["tree_pss_kib"] / KIB_PER_MIB],
        )
    )
    notes.append(
        f"{load['events']} events per client in {load['elapsed_s']:.1f} s; every session's "
        "sandbox is a local Kernel Gateway + kernel"
    )
    return {"rows": rows, "notes": notes}


async def _wait_ready(socket: Path) -> None:
    """Returns once the daemon answers ping with ready."""
    client = await _client(socket)
    await client.close()
