"""The model path never reaches the internet: every socket either transport opens (the lean
OpenAI-compatible client, or litellm) is on loopback; the lean one does not import litellm."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator.testing import FakeModelServer

PROBE = r"""
import asyncio, json, sys
seen = []
def hook(event, args):
    if event in ("socket.connect", "socket.getaddrinfo"):
        seen.append([event, repr(args[1] if event == "socket.connect" else args[0])])
sys.addaudithook(hook)
from orchestrator.models.registry import resolve_model
from orchestrator.models.client import ModelClient
from orchestrator.settings import Settings
url, client = sys.argv[1], sys.argv[2]
settings = Settings(model_client=client)
model = resolve_model("openai/fake", settings, api_base=url, env={})
reply = asyncio.run(ModelClient(model, settings).complete([{"role": "user", "content": "hi"}]))
print(json.dumps({"text": reply.text, "seen": seen, "litellm": "litellm" in sys.modules}))
"""


@pytest.mark.parametrize("client", ["auto", "litellm"])
def test_model_calls_touch_only_loopback(client: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITELLM_")}
    with FakeModelServer("text: hello") as srv:
        out = subprocess.run(
            [sys.executable, "-c", PROBE, srv.url, client],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=True,
        )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["text"] == "hello"
    assert result["litellm"] is (client == "litellm")
    assert result["seen"], "the audit hook saw no socket at all"
    for _event, target in result["seen"]:
        assert "127.0.0.1" in target or "localhost" in target, target
