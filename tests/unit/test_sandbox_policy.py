"""Sandbox policy without an engine: image names, limits merging, settings, pool fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ConfigError, UserError
from orchestrator.sandbox.base import ResourceLimits, SandboxSpec
from orchestrator.sandbox.docker import DockerBackend
from orchestrator.sandbox.images import (
    SESSION_IMAGE,
    image_hint,
    image_tag,
    resolve_image,
    source_hash,
)
from orchestrator.settings import (
    SANDBOX_MEMORY_MIB,
    SANDBOX_PIDS_LIMIT,
    SandboxSettings,
    Settings,
    load_settings,
)

MIB = 1024**2


def test_image_names_resolve_to_tags_and_tags_pass_through() -> None:
    assert resolve_image("session") == SESSION_IMAGE
    assert resolve_image("rust") == image_tag("rust") == "prime-agent/session-rust:latest"
    assert resolve_image("my/image:1") == "my/image:1"
    assert "images build rust" in image_hint(image_tag("rust"))
    with pytest.raises(UserError):
        resolve_image("two words")


def test_variant_hashes_cover_their_dockerfile() -> None:
    assert len({source_hash("session"), source_hash("rust"), source_hash("cuda")}) == 3


def test_limits_merge_field_by_field() -> None:
    default = ResourceLimits(memory_bytes=2 * MIB, cpus=1.0, pids=256)
    assert ResourceLimits(pids=64).over(default) == ResourceLimits(2 * MIB, 1.0, 64)
    assert ResourceLimits().over(default) == default


def test_sandbox_settings_from_config(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[sandbox]\nimage = "rust"\nworkspace = "copy"\nmemory_mib = 512\n')
    sandbox = load_settings(config).sandbox
    assert (sandbox.image, sandbox.workspace, sandbox.memory_bytes) == ("rust", "copy", 512 * MIB)
    assert sandbox.pids_limit == SANDBOX_PIDS_LIMIT
    config.write_text('[sandbox]\nworkspace = "rwx"\n')
    with pytest.raises(ConfigError, match=r"sandbox\.workspace"):
        load_settings(config)
    config.write_text("[sandbox]\nmemory_mib = 1\n")
    with pytest.raises(ConfigError, match=r"sandbox\.memory_mib"):
        load_settings(config)


def test_backend_from_settings_and_per_session_policy(tmp_path: Path) -> None:
    settings = Settings(sandbox=SandboxSettings(image="rust", memory_mib=300, cpus=0.5))
    backend = DockerBackend.from_settings(settings, docker=object())
    spec = SandboxSpec(session_id="s", cwd=tmp_path, artifacts_dir=tmp_path)
    assert backend.image_for(spec) == "prime-agent/session-rust:latest"
    assert backend.workspace_for(spec) == "rw"
    assert backend.limits_for(spec) == ResourceLimits(300 * MIB, 0.5, SANDBOX_PIDS_LIMIT)
    child = SandboxSpec(
        session_id="c",
        cwd=tmp_path,
        artifacts_dir=tmp_path,
        image="session",
        workspace="ro",
        limits=ResourceLimits(pids=50),
    )
    assert backend.image_for(child) == SESSION_IMAGE
    assert backend.workspace_for(child) == "ro"
    assert backend.limits_for(child) == ResourceLimits(300 * MIB, 0.5, 50)


def test_pool_fits_only_sessions_with_the_backend_policy(tmp_path: Path) -> None:
    backend = DockerBackend(docker=object())
    snapshots = tmp_path / "snapshots"
    backend._pool_for = (tmp_path, snapshots)
    plain = SandboxSpec(session_id="s", cwd=tmp_path, artifacts_dir=tmp_path)
    assert backend._pool_fits(plain)  # no snapshots: its slot is dropped
    kept = SandboxSpec(
        session_id="s", cwd=tmp_path, artifacts_dir=tmp_path, snapshot_dir=snapshots / "s"
    )
    assert backend._pool_fits(kept)  # its snapshots under the pool's root: the slot is handed over
    elsewhere = SandboxSpec(
        session_id="s", cwd=tmp_path, artifacts_dir=tmp_path, snapshot_dir=tmp_path / "x" / "s"
    )
    assert not backend._pool_fits(elsewhere)
    for other in (
        SandboxSpec(session_id="s", cwd=tmp_path, artifacts_dir=tmp_path, image="rust"),
        SandboxSpec(session_id="s", cwd=tmp_path, artifacts_dir=tmp_path, workspace="copy"),
        SandboxSpec(
            session_id="s",
            cwd=tmp_path,
            artifacts_dir=tmp_path,
            limits=ResourceLimits(memory_bytes=SANDBOX_MEMORY_MIB * MIB // 2),
        ),
    ):
        assert not backend._pool_fits(other)


def test_the_session_dockerfile_installs_every_image_requirement() -> None:
    """``IMAGE_REQUIREMENTS`` are the wheels gathered on the host; the Dockerfile must install
    each (pytest is the usual autonomous gate, and the sandbox has no network)."""
    from orchestrator.sandbox.images import IMAGE_REQUIREMENTS, IMAGES_DIR

    text = (IMAGES_DIR / "session" / "Dockerfile").read_text()
    line = next(part for part in text.split("\\\n") if "--find-links /wheels" in part)
    assert set(IMAGE_REQUIREMENTS) <= set(line.split()), line
