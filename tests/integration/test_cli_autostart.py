"""Starting the daemon from the CLI (orchestrator/cli/autostart.py): the early spawn's switch,
the wait (connect tries, then ``ping {wait_ready}``), and a daemon that dies while starting."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from orchestrator.api.client import request_sync
from orchestrator.cli.autostart import (
    AUTOSTART_ENV,
    DaemonStartError,
    spawn_early,
    start_daemon,
)
from orchestrator.errors import ConfigError
from orchestrator.paths import Paths, ensure_private_dir
from orchestrator.settings import load_settings
from tests.helpers import cli, write_config

DAEMON_STOP_TIMEOUT_S = 60.0


def test_no_early_spawn_when_something_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(AUTOSTART_ENV, "1")
    paths = Paths.from_env()
    ensure_private_dir(paths.runtime_dir)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(paths.control_socket))
        listener.listen()
        assert spawn_early(paths) is None


@pytest.mark.parametrize(
    ("env", "config"),
    [
        ("0", None),  # the environment says off
        ("maybe", None),  # not a switch: the ordinary check says what is wrong
        ("", "[daemon]\nautostart = false\n"),
        ("", "[daemon\n"),  # unparsable: the settings loader says what is wrong
    ],
)
def test_no_early_spawn_unless_autostart_is_surely_on(
    monkeypatch: pytest.MonkeyPatch, env: str, config: str | None
) -> None:
    monkeypatch.setenv(AUTOSTART_ENV, env)
    if config is not None:
        write_config(config)
    assert spawn_early(Paths.from_env()) is None


def test_a_daemon_that_cannot_start_is_one_line_from_its_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write_config("warm_pool_size = -1\n")  # the daemon refuses its config and exits
    with pytest.raises(DaemonStartError) as failed:
        start_daemon()
    message = str(failed.value)
    assert message.startswith("the daemon did not start: ")
    assert "warm_pool_size" in message and "\n" not in message


def test_print_mode_reports_a_bad_config_as_the_settings_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The lean -p client peeks at config.toml without the settings models; the daemon it
    spawns refuses a file bad elsewhere, and the run says so in the settings loader's line."""
    monkeypatch.setenv(AUTOSTART_ENV, "1")
    path = write_config("warm_pool_size = -1\n")
    with pytest.raises(ConfigError) as expected:
        load_settings(path)
    run = cli(
        ["-p", "hi", "--model", "openai/x", "--api-base", "http://127.0.0.1:9/v1"], cwd=tmp_path
    )
    assert (run.returncode, run.stderr) == (2, f"prime-agent: error: {expected.value}\n")


def test_start_waits_for_ready_and_a_second_start_finds_it(tmp_path: Path) -> None:
    write_config("warm_pool_size = 0\n")
    info, started = start_daemon()
    try:
        assert started and info["ready"] is True
        again, started_again = start_daemon()
        assert not started_again and again["pid"] == info["pid"]
    finally:
        request_sync("shutdown", force=True, timeout=DAEMON_STOP_TIMEOUT_S)
