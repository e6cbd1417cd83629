"""The bwrap backend's policy and bookkeeping, without starting a sandbox
(orchestrator/sandbox/bwrap.py, bwrap_launch.py, bwrap_owned.py; the real sandboxes:
tests/integration/test_bwrap_backend.py)."""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

import pytest

from orchestrator.errors import SandboxStartError
from orchestrator.sandbox import bwrap, bwrap_owned
from orchestrator.sandbox.base import ResourceLimits, SandboxSpec
from orchestrator.sandbox.bwrap import BwrapBackend
from orchestrator.sandbox.bwrap_launch import interpreter_binds
from orchestrator.sandbox.bwrap_owned import RUNTIME_DIR_PREFIX
from orchestrator.settings import SandboxSettings, Settings

TEMP = Path(tempfile.gettempdir())


def _spec(tmp: Path, **changes: object) -> SandboxSpec:
    return SandboxSpec(session_id="s", cwd=tmp, artifacts_dir=tmp, **changes)  # type: ignore[arg-type]


def test_a_spec_policy_overrides_the_backend_default(tmp_path: Path) -> None:
    b = BwrapBackend(memory_bytes=1 << 30, cpus=2.0, pids_limit=100, network=False)
    plain = _spec(tmp_path)
    assert b.limits_for(plain) == ResourceLimits(1 << 30, 2.0, 100)
    assert b.workspace_for(plain) == "rw" and b.network_for(plain) is False
    own = _spec(tmp_path, limits=ResourceLimits(pids=50), workspace="copy", network=True)
    assert b.limits_for(own) == ResourceLimits(1 << 30, 2.0, 50)
    assert b.workspace_for(own) == "copy" and b.network_for(own) is True


def test_from_settings_takes_the_sandbox_policy() -> None:
    settings = Settings(sandbox=SandboxSettings(workspace="ro", cpus=0.5, pids_limit=64))
    b = BwrapBackend.from_settings(settings, network=True, owner="/run/x.sock")
    assert b.name == bwrap.BACKEND_NAME == "bwrap"
    assert (b.workspace_mode, b.cpus, b.pids_limit) == ("ro", 0.5, 64)
    assert b.memory_bytes == settings.sandbox.memory_bytes
    assert b.network is True and b.owner == "/run/x.sock" and b.pool_size == 0


async def test_missing_bubblewrap_is_one_line_naming_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bwrap, "bwrap_path", lambda: None)
    b = BwrapBackend()
    with pytest.raises(SandboxStartError) as caught:
        await b.create(_spec(tmp_path))
    message = str(caught.value)
    assert "bubblewrap" in message and "apt-get install bubblewrap" in message
    assert "\n" not in message


def test_a_confinement_warning_is_logged_once_per_backend(
    caplog: pytest.LogCaptureFixture,
) -> None:
    b = BwrapBackend()
    with caplog.at_level(logging.WARNING, logger=bwrap.__name__):
        b._warn_once("")
        b._warn_once("prime-agent: no cgroup here; memory is not limited")
        b._warn_once("prime-agent: no cgroup here; memory is not limited")
    assert [r.getMessage() for r in caplog.records] == [
        "prime-agent: no cgroup here; memory is not limited"
    ]


def test_only_our_runtime_dirs_are_ever_removed() -> None:
    ours = TEMP / f"{RUNTIME_DIR_PREFIX}abc"
    assert bwrap_owned.own_runtime_dir(str(ours)) == ours
    assert bwrap_owned.own_runtime_dir("") is None
    assert bwrap_owned.own_runtime_dir("/home/user/project") is None
    assert bwrap_owned.own_runtime_dir(str(TEMP / "prime-agent-sbx-abc")) is None
    assert bwrap_owned.own_runtime_dir(str(ours / "outputs")) is None


def test_the_runtime_dir_is_read_from_a_bwrap_command_line() -> None:
    ours = TEMP / f"{RUNTIME_DIR_PREFIX}abc"
    argv = [b"bwrap", b"--bind", str(ours / "outputs").encode(), str(ours / "outputs").encode()]
    assert bwrap_owned._runtime_dir_of(argv) == str(ours)
    other = [b"bwrap", b"--bind", b"/tmp/x/outputs", b"/tmp/x/outputs"]
    assert bwrap_owned._runtime_dir_of(other) is None


def test_the_interpreter_environment_is_bound_read_only() -> None:
    binds = interpreter_binds()
    assert binds and all(not b.writable and b.source == b.dest for b in binds)
    assert any(Path(sys.prefix).resolve() == Path(b.source) for b in binds)
