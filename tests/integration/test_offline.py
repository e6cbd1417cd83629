"""litellm never reaches the internet: every socket the model path opens is on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
url = sys.argv[1]
model = resolve_model("openai/fake", Settings(), api_base=url, env={})
reply = asyncio.run(ModelClient(model, Settings()).complete([{"role": "user", "content": "hi"}]))
print(json.dumps({"text": reply.text, "seen": seen}))
"""


def test_model_calls_touch_only_loopback() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITELLM_")}
    with FakeModelServer("text: hello") as srv:
        out = subprocess.run(
            [sys.executable, "-c", PROBE, srv.url],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=True,
        )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["text"] == "hello"
    assert result["seen"], "the audit hook saw no socket at all"
    for _event, target in result["seen"]:
        assert "127.0.0.1" in target or "localhost" in target, target
