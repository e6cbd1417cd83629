"""``prime-agent doctor [--fix]`` as a user runs it: which sandbox backends work (real docker
and bubblewrap, each made unusable through the CLI's own lookups: ``DOCKER_HOST``, ``PATH``),
socket, NATS, database integrity and orphaned local sandboxes, with real processes (daemon,
nats-server, gateways) and a real DuckDB file. (Orphaned containers:
tests/integration/test_docker_backend.py.)"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import duckdb
import pytest

from orchestrator.api.server import default_socket_path
from orchestrator.paths import Paths
from orchestrator.sandbox.bwrap_probe import bwrap_usable
from orchestrator.sandbox.docker import docker_usable
from orchestrator.sandbox.images import SESSION_IMAGE, resolve_image
from orchestrator.sandbox.local import owned_gateways
from orchestrator.settings import Settings
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, daemon_pids, need, pids_alive, wait_until, write_config

CLI_TIMEOUT_S = 120.0
POOL_READY_TIMEOUT_S = 90.0
GONE_TIMEOUT_S = 30.0


def doctor(*args: str) -> tuple[int, list[str]]:
    proc = cli(["doctor", *args], timeout=CLI_TIMEOUT_S)
    assert not proc.stderr.strip() or proc.returncode != 2, proc.stderr
    return proc.returncode, proc.stdout.splitlines()


def line(lines: list[str], area: str) -> str:
    return "\n".join(x for x in lines if x.startswith(f"{area}:"))


def test_each_backend_is_reported_usable_or_why_not_and_what_auto_picks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    docker_ok, docker_why = docker_usable(resolve_image(Settings().sandbox.image))
    bwrap_ok, bwrap_why = bwrap_usable()
    code, lines = doctor()
    report = line(lines, "backend").splitlines()
    assert report[0] == (
        f"backend: docker usable (session image {SESSION_IMAGE})"
        if docker_ok
        else f"backend: docker not usable: {docker_why}"
    ), report
    assert report[1] == (
        "backend: bwrap usable (bubblewrap runs a sandbox here)"
        if bwrap_ok
        else f"backend: bwrap not usable: {bwrap_why}"
    ), report
    assert report[2] == (
        "backend: local usable with --backend local only: it does NOT isolate sessions"
    )
    picked = "docker" if docker_ok else "bwrap" if bwrap_ok else None
    if picked is not None:
        assert code == 0 and report[3] == f"backend: auto picks {picked}", report
    # Neither: a problem (exit 1) and the fixes, each backend's reason on its own line.
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/prime-agent-test/docker.sock")
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # the venv: no bwrap there
    code, lines = doctor()
    report = line(lines, "backend").splitlines()
    assert code == 1, lines
    assert report[0].startswith("backend: docker not usable: Docker is not reachable"), report
    assert report[1] == (
        "backend: bwrap not usable: bubblewrap is not installed (apt-get install bubblewrap)"
    )
    assert report[3].startswith("backend: auto refuses (no sandbox here): start Docker"), report
    assert "install bubblewrap" in report[3] and "--backend local" in report[3]
    if picked is None:
        need("docker or bwrap", "this host has neither, so nothing was seen usable")


def test_database_and_socket_checks() -> None:
    code, lines = doctor()
    assert code == 0, lines
    assert "no daemon" in line(lines, "socket") and "no database yet" in line(lines, "database")

    with FakeModelServer("text: fine") as model:
        run = cli(["-p", "hi", "--model", "openai/fake", "--api-base", model.url])
    assert run.returncode == 0, run.stderr
    code, lines = doctor()
    assert code == 0 and "ok (1 sessions" in line(lines, "database"), lines

    # A broken link (written behind the store's back) is reported, and nothing is changed.
    db = Paths.from_env().database_file
    con = duckdb.connect(str(db))
    con.execute("UPDATE sessions SET leaf_event_id = 'e-nosuchevent'")
    con.close()
    code, lines = doctor("--fix")
    assert code == 1 and "1 session leaf pointing at no event" in line(lines, "database"), lines
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT leaf_event_id FROM sessions").fetchall() == [("e-nosuchevent",)]
    con.close()
    con = duckdb.connect(str(db))
    con.execute("UPDATE sessions SET leaf_event_id = NULL")  # rebuilt by the next open
    con.close()

    # A socket file nothing listens on (its daemon died): stale, removed by --fix.
    path = default_socket_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()
    code, lines = doctor()
    assert code == 1 and "stale socket" in line(lines, "socket"), lines
    code, lines = doctor("--fix")
    assert code == 0 and "(fixed)" in line(lines, "socket"), lines
    assert not path.exists()


def test_orphaned_gateways_of_a_killed_daemon_are_removed(tmp_path: Path) -> None:
    write_config("warm_pool_size = 1\n")
    started = cli(["daemon", "start"], timeout=CLI_TIMEOUT_S)
    assert started.returncode == 0, started.stderr
    (daemon,) = daemon_pids()
    owner = str(default_socket_path())
    # The warm pool's sandbox: a gateway marked with this daemon's socket.
    assert wait_until(lambda: owned_gateways(owner), timeout=POOL_READY_TIMEOUT_S)
    code, lines = doctor()
    assert code == 0 and "daemon running" in line(lines, "socket"), lines
    assert "held by the daemon" in line(lines, "database")

    os.kill(daemon, signal.SIGKILL)
    assert wait_until(lambda: not pids_alive([daemon]), timeout=GONE_TIMEOUT_S)
    gateways = [info.pid for info, _ in owned_gateways(owner)]
    assert gateways  # sandboxes outlive a daemon crash (to be adopted by the next daemon)
    code, lines = doctor()
    assert code == 1, lines
    assert f"orphaned gateway pid {gateways[0]}" in line(lines, "local sandboxes")
    assert "left by a daemon that is gone" in line(lines, "nats")
    code, lines = doctor("--fix")
    assert code == 0, lines
    assert wait_until(lambda: not pids_alive(gateways), timeout=GONE_TIMEOUT_S)
    assert owned_gateways(owner) == []
