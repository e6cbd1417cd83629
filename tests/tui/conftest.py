"""Fixtures for the TUI tests: a real daemon (started as a user starts it) whose sessions talk
to the scripted model over HTTP. A test module overrides ``model_script`` to script its turns.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.api.server import default_socket_path
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, daemon_pids, write_config

DAEMON_CLI_TIMEOUT_S = 120.0

DEFAULT_SCRIPT = """
text: Let me compute.
code: print(6 * 7)
usage in=120 out=12
---
text: The answer is **42**.
usage in=150 out=6
"""


@pytest.fixture(autouse=True)
def plain_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the screens look like must not depend on the CI's environment (Textual honours
    NO_COLOR when an app is created)."""
    monkeypatch.delenv("NO_COLOR", raising=False)


@pytest.fixture
def model_script() -> str:
    return DEFAULT_SCRIPT


@pytest.fixture
def extra_config() -> str:
    """Top-level config.toml lines a test module adds (e.g. ``max_depth = 2``)."""
    return ""


@pytest.fixture
def fake_model(model_script: str, extra_config: str) -> Iterator[FakeModelServer]:
    srv = FakeModelServer(model_script).start()
    write_config(
        extra_config + "retry_base_delay_s = 0.01\nmodel_max_retries = 1\n"
        'default_model = "openai/fake"\n'
        f'[models."openai/fake"]\napi_base = "{srv.url}"\n'
        "input_cost_per_mtok = 1.0\noutput_cost_per_mtok = 2.0\n"
    )
    yield srv
    srv.close()


@pytest.fixture
def daemon(fake_model: FakeModelServer) -> Iterator[Path]:
    """A running daemon; yields its socket path. Stopped (then killed) afterwards."""
    proc = cli(["daemon", "start"], timeout=DAEMON_CLI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    yield default_socket_path()
    runtime = os.environ["XDG_RUNTIME_DIR"]
    if daemon_pids(runtime):
        cli(["daemon", "stop", "--force"], timeout=DAEMON_CLI_TIMEOUT_S)
    for pid in daemon_pids(runtime):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The directory the TUI runs in (a session's cwd)."""
    path = tmp_path / "project"
    path.mkdir()
    return path
