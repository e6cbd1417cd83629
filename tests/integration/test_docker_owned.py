"""Listing our containers while others come and go (CI failure of
test_cli_signals.py::test_shutdown_removes_containers_a_killed_run_left): the Docker SDK lists
ids, then inspects each; a container removed in between made the whole listing fail."""

from __future__ import annotations

import os
from typing import Any

from tests.helpers import need
from tests.integration.test_sandbox_conformance import docker_ready

DEAD_PID = 2**22 + 1  # above the default pid_max: never a live process


def test_a_container_removed_while_listing_is_left_out_not_an_error() -> None:
    why = docker_ready()
    if why is not None:
        need("docker", why)
    from orchestrator.sandbox.docker import (
        LABEL_HOST_PID,
        LABEL_OWNER,
        LABEL_SESSION,
        list_owned,
        remove_containers,
    )
    from orchestrator.sandbox.images import SESSION_IMAGE, docker_client

    client = docker_client()
    labels = {LABEL_OWNER: str(os.getuid()), LABEL_HOST_PID: str(DEAD_PID)}
    kept = client.containers.create(
        SESSION_IMAGE, ["true"], labels={**labels, LABEL_SESSION: "s-keptkeptkept"}
    )
    vanishing = client.containers.create(
        SESSION_IMAGE, ["true"], labels={**labels, LABEL_SESSION: "s-gonegonegone"}
    )
    real_list = client.api.containers

    def list_then_remove_one(*args: Any, **kwargs: Any) -> Any:
        listed = real_list(*args, **kwargs)
        assert vanishing.id in {c["Id"] for c in listed}
        vanishing.remove(force=True)  # between the listing and its inspections
        return listed

    try:
        client.api.containers = list_then_remove_one
        found = {c.id for c in list_owned(client)}
        assert kept.id in found and vanishing.id not in found
    finally:
        client.api.containers = real_list
        remove_containers([kept.id, vanishing.id])
