"""Shared fixtures: every test runs with private XDG dirs and no provider keys."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

PROVIDER_KEY_VARS = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_API_BASE",
    "ANTHROPIC_API_KEY",
    "OPENROUTER_API_KEY",
    "GROQ_API_KEY",
    "DEEPSEEK_API_KEY",
    "MISTRAL_API_KEY",
    "GEMINI_API_KEY",
    "XAI_API_KEY",
)

# Signals whose disposition a child inherits when it is ignored: a test that sets one (an
# in-process gateway app ignores SIGINT) must not leave later tests' CLI children deaf to it.
RESTORED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)


@pytest.fixture(autouse=True)
def restored_signals() -> Iterator[None]:
    """Each test ends with the signal dispositions it started with."""
    before = {sig: signal.getsignal(sig) for sig in RESTORED_SIGNALS}
    yield
    for sig, handler in before.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Private config/data/cache/runtime dirs; provider keys removed (tests never reach one)."""
    home = tmp_path / "xdg"
    for var, sub in (
        ("XDG_CONFIG_HOME", "config"),
        ("XDG_DATA_HOME", "data"),
        ("XDG_RUNTIME_DIR", "run"),
    ):
        path = home / sub
        path.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(var, str(path))
    # The assembled embedded model (491 MB) is shared across tests: keep the real cache dir
    # unless a test overrides it.
    monkeypatch.setenv(
        "XDG_CACHE_HOME", os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    )
    for var in PROVIDER_KEY_VARS:
        monkeypatch.delenv(var, raising=False)
    # Tests run on the local backend unless they ask for docker (its own tests do): the local
    # process tree is what the signal tests inspect, and it starts in a second, not three.
    monkeypatch.setenv("PRIME_AGENT_BACKEND", "local")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    monkeypatch.setenv("LITELLM_MODE", "PRODUCTION")
    # CLI commands do not start a daemon behind a test's back; tests that want one start it or
    # set PRIME_AGENT_DAEMON_AUTOSTART=1 (docs/cli.md).
    monkeypatch.setenv("PRIME_AGENT_DAEMON_AUTOSTART", "0")
    yield home
    # Whatever a test started, no daemon (or its NATS server) outlives it.
    from tests.helpers import stop_daemons

    stop_daemons(str(home / "run"))
