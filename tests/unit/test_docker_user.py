"""Who a docker sandbox runs as, and the one line for a workspace that user cannot enter
(orchestrator/sandbox/docker_user.py). The container side: tests/integration/
test_docker_workspace_user.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.sandbox.docker_user import SANDBOX_UID, container_user, workspace_problem

HOST_UID = 4321
HOST_GID = 4322


def test_a_non_root_host_user_runs_as_itself_whoever_owns_the_workspace(tmp_path: Path) -> None:
    assert container_user(tmp_path, host_uid=HOST_UID, host_gid=HOST_GID) == (HOST_UID, HOST_GID)


@pytest.mark.skipif(os.getuid() != 0, reason="chown needs root")
def test_root_runs_as_the_workspace_owner_or_the_image_user(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, HOST_UID, HOST_GID)
    assert container_user(theirs, host_uid=0, host_gid=0) == (HOST_UID, HOST_GID)
    ours = tmp_path / "ours"
    ours.mkdir()
    assert container_user(ours, host_uid=0, host_gid=0) == (SANDBOX_UID, SANDBOX_UID)


def test_a_workspace_the_sandbox_user_cannot_enter_is_one_line_naming_copy(
    tmp_path: Path,
) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    owner = closed.stat().st_uid
    other = owner + 1
    problem = workspace_problem(closed, other, other, "rw")
    assert problem is not None and "\n" not in problem
    assert "--workspace copy" in problem and str(closed) in problem and f"uid {other}" in problem
    assert workspace_problem(closed, other, other, "ro") == problem
    assert workspace_problem(closed, other, other, "copy") is None  # the copy is made theirs
    assert workspace_problem(closed, owner, other, "rw") is None  # the owner may enter
    closed.chmod(0o750)
    assert workspace_problem(closed, other, closed.stat().st_gid, "rw") is None  # the group
    closed.chmod(0o705)
    assert workspace_problem(closed, other, other, "rw") is None  # everyone
    closed.chmod(0o701)  # enter but not list: not enough
    assert workspace_problem(closed, other, other, "rw") is not None
