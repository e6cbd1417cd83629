"""The gateway as a Kubernetes session pod runs it (orchestrator/sandbox/k8s_manifests.py): its
token read from a file of the session's Secret (``--token-file``), listening on a fixed TCP
port. A real gateway process and a real kernel; a wrong token is refused."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator.sandbox.gateway import KernelGatewayClient
from orchestrator.sandbox.gateway_main import TOKEN_ENV, read_token
from tests.helpers import pod_gateway

TOKEN = "token-from-the-secret"
UNAUTHORIZED = 401
OK = 200


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[str]:
    """A gateway started as the pod's command starts it (minus the pod): its base URL."""
    token_file = tmp_path / "secret" / "gateway-token"
    token_file.parent.mkdir()
    token_file.write_text(TOKEN + "\n")
    with pod_gateway(tmp_path, token_file) as url:
        yield url


async def test_a_kernel_starts_with_the_token_from_the_file(gateway: str, tmp_path: Path) -> None:
    client = KernelGatewayClient(gateway, TOKEN)
    try:
        await client.start_kernel(env={"HOME": str(tmp_path)}, path=str(tmp_path).lstrip("/"))
        await client.connect()
        reply = await client.wait_ready()
        assert reply["status"] == "ok"
    finally:
        await client.delete_kernel()
        await client.close()


async def test_another_token_is_refused(gateway: str) -> None:
    async with httpx.AsyncClient() as http:
        refused = await http.get(
            f"{gateway}/api/kernels", headers={"Authorization": "token not-the-token"}
        )
        allowed = await http.get(
            f"{gateway}/api/kernels", headers={"Authorization": f"token {TOKEN}"}
        )
    assert (refused.status_code, allowed.status_code) == (UNAUTHORIZED, OK)


def test_read_token_prefers_the_file_and_clears_the_variable(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\nignored\n")
    environ = {TOKEN_ENV: "from-env", "PATH": os.defpath}
    assert read_token(token_file, environ) == "from-file"
    assert TOKEN_ENV not in environ
    assert read_token(None, {TOKEN_ENV: "from-env"}) == "from-env"
    assert read_token(tmp_path / "missing", {}) == ""
    (tmp_path / "empty").write_text("")
    assert read_token(tmp_path / "empty", {}) == ""
