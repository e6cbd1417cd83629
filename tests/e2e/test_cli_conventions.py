"""The command line as other tools and users expect it (issue 20, CLI conventions): --version,
help that lists the subcommands, a mistyped command refused before anything runs, and
--max-turns / --system-prompt / --append-system-prompt reaching the session on both paths
(in this process and through the daemon)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from orchestrator.cli.dispatch_names import SUBCOMMANDS
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, stop_daemons, write_config

# Never answers: every reply runs more code, so only a step limit ends the turn.
LOOPER = """
repeat forever:
    code: print("again")
"""
BASE_PROMPT_OPENING = "You are Prime Agent, an autonomous agent"


@pytest.fixture
def looper() -> Iterator[FakeModelServer]:
    write_config("retry_base_delay_s = 0.01\nmodel_max_retries = 1\n")
    with FakeModelServer(LOOPER) as srv:
        yield srv


def test_version_is_one_line_with_the_installed_version() -> None:
    shown = cli(["--version"])
    assert (shown.returncode, shown.stdout) == (0, f"prime-agent {version('prime-agent')}\n")


def test_help_lists_every_subcommand() -> None:
    shown = cli(["--help"])
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.replace("│", " ").split())
    missing = [name for name in SUBCOMMANDS if f" {name}," not in text and f" {name}." not in text]
    assert not missing


def test_a_bare_first_word_that_is_no_command_is_refused_before_anything_runs(
    looper: FakeModelServer,
) -> None:
    refused = cli(["exec", "hi", "--model", "openai/fake", "--api-base", looper.url])
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1
    assert 'to run it as a task: prime-agent -p "exec hi"' in refused.stderr
    assert looper.requests == []  # no model call, no session
    close = cli(["agent"])
    assert "did you mean `prime-agent agents`?" in close.stderr and close.returncode == 2
    # With -p the words are a task by intent: it runs (here until its one allowed step).
    task = ["-p", "exec", "hi", "--max-turns", "1"]
    ran = cli([*task, "--model", "openai/fake", "--api-base", looper.url])
    assert ran.returncode == 1, ran.stderr
    assert len(looper.requests) == 1


@pytest.fixture(params=["in-process", "daemon"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "daemon":
        monkeypatch.setenv("PRIME_AGENT_DAEMON_AUTOSTART", "1")
        yield request.param
        stop_daemons(os.environ["XDG_RUNTIME_DIR"])
    else:
        yield request.param


def test_max_turns_and_the_system_prompt_flags_reach_the_session(
    looper: FakeModelServer, path: str, tmp_path: Path
) -> None:
    appended = tmp_path / "extra.md"
    appended.write_text("Always answer in French.\n")
    # --skill: one skill by its SKILL.md, and a directory of skills.
    doubler, shelf = tmp_path / "doubler", tmp_path / "shelf"
    for folder, name in ((doubler, "doubler"), (shelf / "tripler", "tripler")):
        folder.mkdir(parents=True)
        (folder / "SKILL.md").write_text(
            f"---\nname: {name}\ndescription: The {name} test skill.\n---\nUse it.\n"
        )
    args = ["-p", "loop forever", "--model", "openai/fake", "--api-base", looper.url]
    args += ["--max-turns", "3", "--system-prompt", "You are a careful tester."]
    args += ["--append-system-prompt", str(appended)]
    args += ["--skill", str(doubler / "SKILL.md"), "--skill", str(shelf)]
    if path == "in-process":
        args.append("--no-daemon")
    ran = cli(args)
    # Three model calls, then the turn stops (max_steps), whatever the config's limit is.
    assert ran.returncode == 1, ran.stderr
    assert "max_steps" in ran.stderr
    assert len(looper.requests) == 3
    system = looper.requests[0]["messages"][0]
    assert system["role"] == "system"
    assert system["content"].startswith("You are a careful tester.")
    assert system["content"].rstrip().endswith("Always answer in French.")
    assert BASE_PROMPT_OPENING not in system["content"]
    for name in ("doubler", "tripler"):
        assert f"The {name} test skill." in system["content"], name


def test_an_empty_system_prompt_is_one_line() -> None:
    refused = cli(["-p", "hi", "--system-prompt", "  ", "--model", "openai/x"])
    assert refused.returncode == 2
    assert refused.stderr.strip() == "prime-agent: error: --system-prompt is empty"


def test_the_protocol_only_flags_are_refused_in_a_plain_run_not_ignored() -> None:
    refused = cli(["-p", "hi", "--provider", "local", "--model", "qwen"])
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1
    assert "--provider and --daemon-socket are for --mode acp" in refused.stderr
    missing = cli(["-p", "hi", "--skill", "/nonexistent/skill", "--model", "openai/x"])
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "--skill /nonexistent/skill: not a skill" in missing.stderr
