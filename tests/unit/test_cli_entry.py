"""The lean pre-dispatch of ``prime-agent`` (orchestrator/cli/entry.py): which command lines it
takes itself, which it leaves to typer, and what the print-mode client path does NOT import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.cli.entry import SUBCOMMANDS, PlainRun, parse_plain_run

# What a plain `-p` run through the daemon must never load (issue 18: cold start).
NOT_ON_CLIENT_PATH = (
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
    "orchestrator.cli.print_run",
    "orchestrator.cli.via_daemon",
    "orchestrator.cli.connect",
    "orchestrator.cli.follow",
    "orchestrator.cli.interrupts",
    "orchestrator.settings",
    "orchestrator.models.registry",
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
