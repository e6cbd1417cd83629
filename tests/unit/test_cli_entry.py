"""The lean pre-dispatch of ``prime-agent`` (orchestrator/cli/entry.py): which command lines it
takes itself, which it leaves to typer, and what the print-mode client path does NOT import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.client_config import ClientConfig, load_client_config
from orchestrator.cli.entry import SUBCOMMANDS, PlainRun, parse_plain_run
from orchestrator.errors import ConfigError
from orchestrator.settings import load_settings

# What a plain `-p` run through the daemon must never load (issue 18: cold start).
NOT_ON_CLIENT_PATH = (
    # The settings and protocol models: the daemon validates what the client sends (and
    # config.toml); the client reads the few values it needs without them (issue 18: <= 0.5 s).
    "pydantic",
    "pydantic_core",
    "litellm",
    "duckdb",
    "typer",
    "click",
    "rich",
    "httpx",
    "nats",
    "aiohttp",
    "docker",
    "orchestrator.cli.app",
    "orchestrator.daemon.service",
    "orchestrator.sessions",
    "orchestrator.store",
    "orchestrator.sandbox",
    "orchestrator.agent",
)
# Every module the path imports on its way to the daemon: the entry point, the run, the link.
CLIENT_PATH_MODULES = (
    "orchestrator.cli.entry",
    "orchestrator.cli.autostart",
    "orchestrator.cli.client_config",
    "orchestrator.cli.print_run",
    "orchestrator.cli.via_daemon",
    "orchestrator.cli.connect",
    "orchestrator.cli.follow",
    "orchestrator.cli.interrupts",
    "orchestrator.cli.progress",
    "orchestrator.cli.controls",
    "orchestrator.api.client",
    "orchestrator.api.framing",
    "orchestrator.api.wire",
    "orchestrator.model_names",
)
PROBE = f"""
import importlib, json, sys
for name in {CLIENT_PATH_MODULES!r}:
    importlib.import_module(name)
from orchestrator.cli.entry import parse_plain_run
assert parse_plain_run(["-p", "hi"], {{}}) is not None
print(json.dumps(sorted(m for m in {NOT_ON_CLIENT_PATH!r} if m in sys.modules)))
"""


def test_client_path_imports_neither_litellm_nor_duckdb_nor_typer() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], check=True, capture_output=True, text=True, timeout=60
    )
    assert json.loads(out.stdout) == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-p", "hi"], PlainRun(task=["hi"], print_mode=True)),
        (["hi", "there"], PlainRun(task=["hi", "there"])),
        (
            ["-p", "hi", "--model", "openai/x", "--api-base=http://h/v1", "--mode", "json"],
            PlainRun(
                task=["hi"],
                print_mode=True,
                model="openai/x",
                api_base="http://h/v1",
                mode="json",
            ),
        ),
        (
            ["--backend", "local", "--network", "task", "--no-refine", "--debug", "--cwd", "/"],
            PlainRun(
                task=["task"], backend="local", network=True, no_refine=True, debug=True, cwd="/"
            ),
        ),
        (
            ["--workspace", "copy", "--image", "rust", "--no-network", "x"],
            PlainRun(task=["x"], workspace="copy", image="rust"),
        ),
        (["-p"], PlainRun(print_mode=True)),
    ],
)
def test_plain_runs_are_taken(args: list[str], expected: PlainRun) -> None:
    assert parse_plain_run(args, {}) == expected


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["-h"],
        ["help"],
        ["--help-commands"],
        ["-p", "hi", "--help"],
        ["--resume", "abc", "more"],
        ["-c", "more"],
        ["-p", "hi", "--no-daemon"],
        ["-p", "hi", "--nats-url", "nats://x"],
        ["-p", "hi", "--autonomous"],
        ["-p", "hi", "--goal", "g"],
        ["-p", "hi", "--mode", "yaml"],  # typer says what is wrong with the value
        ["-p", "hi", "--backend", "vm"],
        ["-p", "hi", "--model"],  # a missing value
        ["-p", "hi", "--model", "--debug"],
        ["-p", "--", "hi"],
        ["-p", "-"],
        ["-pv", "hi"],
        ["-p", "hi", "--modle", "x"],
    ],
)
def test_everything_else_goes_to_typer(args: list[str]) -> None:
    assert parse_plain_run(args, {}) is None


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_subcommands_go_to_typer(name: str) -> None:
    assert parse_plain_run([name, "x"], {}) is None


def test_backend_from_the_environment_as_typer_reads_it() -> None:
    env = {"PRIME_AGENT_BACKEND": "bwrap"}
    assert parse_plain_run(["hi"], env) == PlainRun(task=["hi"], backend="bwrap")
    given = parse_plain_run(["hi", "--backend", "local"], env)
    assert given is not None and given.backend == "local"  # the option wins
    assert parse_plain_run(["hi"], {"PRIME_AGENT_BACKEND": "vm"}) is None  # typer's error
    assert parse_plain_run(["hi"], {"PRIME_AGENT_BACKEND": ""}) == PlainRun(task=["hi"])


# The client path's own work, in a fresh interpreter: read config.toml, find the variables to
# send, build and frame commands, read the daemon's lines. Still no pydantic.
RUNTIME_PROBE = f"""
import asyncio, json, sys
from pathlib import Path
from orchestrator.api.client import ControlClient
from orchestrator.api.framing import decode_line, encode_object
from orchestrator.api.messages import decode_server_message
from orchestrator.cli.client_config import load_client_config
from orchestrator.model_names import client_env_names

config = load_client_config(Path(sys.argv[1]))
assert client_env_names(None, config.default_model, config.models) == {{"MY_KEY"}}
client = object.__new__(ControlClient)
client._id_prefix, client._ids = "p", iter([1])
body = client.command("create_session", cwd="/", task="hi", model=None)
assert "model" not in body and body["command_id"] == "p-1"
assert decode_line(encode_object(body, "create_session").rstrip()) == body
line = b'{{"type":"response","command_id":"p-1","ok":true,"result":{{"session":"s"}}}}'
assert decode_server_message(decode_line(line)).result == {{"session": "s"}}
print(json.dumps(sorted(m for m in {NOT_ON_CLIENT_PATH!r} if m in sys.modules)))
"""
CONFIG = '[models."openai/x"]\napi_key_env = "MY_KEY"\napi_base = "http://h/v1"\n'


def test_the_client_path_does_its_work_without_pydantic(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('default_model = "openai/x"\n' + CONFIG)
    out = subprocess.run(
        [sys.executable, "-c", RUNTIME_PROBE, str(config)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(out.stdout) == []


def test_client_config_reads_what_the_settings_read(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    assert load_client_config(path) == ClientConfig()  # no file: the defaults
    path.write_text('default_model = "openai/x"\n' + CONFIG + '[sandbox]\nimage = "rust"\n')
    assert load_client_config(path) == ClientConfig.from_settings(load_settings(path))
    # A value the peek does not judge goes through the settings models.
    path.write_text("family_wait_timeout_s = 60\n")
    assert load_client_config(path).family_wait_timeout_s == 60


@pytest.mark.parametrize(
    "text",
    [
        "default_model = 3\n",
        "models = 1\n",
        '[models."openai/x"]\napi_key_env = 1\n',
        "family_wait_timeout_s = -1\n",
        "not toml [\n",
    ],
)
def test_a_config_the_peek_doubts_fails_as_the_settings_say(tmp_path: Path, text: str) -> None:
    """The same one-line ``ConfigError`` as the settings loader's, whoever reads the file."""
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as expected:
        load_settings(path)
    with pytest.raises(ConfigError) as got:
        load_client_config(path)
    assert str(got.value) == str(expected.value)
