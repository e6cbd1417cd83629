"""Extra mounts (sandbox/mounts.py): a host directory at one more path inside a sandbox, for
Harbor tasks' /app, /tests and /logs — never over what the sandbox itself needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.api import protocol
from orchestrator.errors import SandboxStartError
from orchestrator.sandbox.base import SandboxSpec
from orchestrator.sandbox.local import check_spec
from orchestrator.sandbox.mounts import MAX_MOUNTS, RESERVED_TARGETS, ExtraMount, check_mounts
from orchestrator.session_specs import StoredMount, StoredSandboxPolicy
from orchestrator.sessions.sandbox_policy import apply_policy


@pytest.fixture
def source(tmp_path: Path) -> Path:
    made = tmp_path / "src"
    made.mkdir()
    return made


def test_mounts_that_keep_out_of_the_sandboxs_own_paths_pass(source: Path, tmp_path: Path) -> None:
    asked = (ExtraMount(source, "/app"), ExtraMount(source, "/tests", read_only=True))
    assert check_mounts(asked, tmp_path / "workspace") == asked


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("app", "absolute"),
        ("/app/../etc", "normalised"),
        ("/", "other than /"),
        *[(reserved, "overlaps") for reserved in RESERVED_TARGETS],
        ("/opt/prime-agent/bin", "overlaps /opt/prime-agent"),
        ("/opt", "overlaps /opt/prime-agent"),
        ("/var/lib/prime-agent/snapshot", "overlaps"),
    ],
)
def test_a_mount_over_what_the_sandbox_needs_is_refused(
    source: Path, tmp_path: Path, target: str, said: str
) -> None:
    with pytest.raises(SandboxStartError, match=said):
        check_mounts([ExtraMount(source, target)], tmp_path / "workspace")


def test_a_mount_over_the_workspace_a_shared_target_or_a_missing_source_is_refused(
    source: Path, tmp_path: Path
) -> None:
    workspace = Path("/srv/project")  # as the sandbox shows it (at the host's path)
    with pytest.raises(SandboxStartError, match="overlaps the workspace"):
        check_mounts([ExtraMount(source, "/srv/project/sub")], workspace)
    with pytest.raises(SandboxStartError, match="overlaps the workspace"):
        check_mounts([ExtraMount(source, "/srv")], workspace)
    with pytest.raises(SandboxStartError, match="share the target /app"):
        check_mounts([ExtraMount(source, "/app"), ExtraMount(source, "/app")], workspace)
    with pytest.raises(SandboxStartError, match="not an existing directory"):
        check_mounts([ExtraMount(tmp_path / "gone", "/app")], workspace)
    many = [ExtraMount(source, f"/m{i}") for i in range(MAX_MOUNTS + 1)]
    with pytest.raises(SandboxStartError, match=f"a sandbox may have {MAX_MOUNTS}"):
        check_mounts(many, workspace)


def test_the_protocol_bounds_mounts_as_the_sandbox_does() -> None:
    assert protocol.MAX_MOUNTS == MAX_MOUNTS


def test_a_stored_policy_brings_its_mounts_into_every_sandbox_spec(
    source: Path, tmp_path: Path
) -> None:
    policy = StoredSandboxPolicy(
        backend="docker",
        image="session",
        workspace="rw",
        memory_bytes=1 << 30,
        cpus=1.0,
        pids=256,
        mounts=(StoredMount(source=str(source), target="/app", read_only=True),),
    )
    spec = SandboxSpec(session_id="s", cwd=tmp_path, artifacts_dir=tmp_path)
    assert apply_policy(spec, policy).mounts == (ExtraMount(source, "/app", read_only=True),)
    # A row written before mounts existed reads as none.
    old = StoredSandboxPolicy.model_validate(
        {k: v for k, v in policy.model_dump().items() if k != "mounts"}
    )
    assert apply_policy(spec, old).mounts == ()


def test_a_backend_without_containers_refuses_mounts_in_one_line(
    source: Path, tmp_path: Path
) -> None:
    spec = SandboxSpec(
        session_id="s", cwd=tmp_path, artifacts_dir=tmp_path, mounts=(ExtraMount(source, "/app"),)
    )
    with pytest.raises(SandboxStartError, match="need the docker backend"):
        check_spec(spec)
