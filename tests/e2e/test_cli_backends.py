"""Which sandbox a session gets, as a user sees it (``orchestrator/sandbox/choice.py``): real
``prime-agent`` processes, real bubblewrap, a real daemon, the scripted model over HTTP.

- ``--backend local`` works, and says on stderr, once, that the session is not isolated: in
  print mode (in the CLI's process) and through the daemon (the create-session reply's
  ``warning``, printed by the CLI).
- ``--backend bwrap`` (and ``auto`` without docker) runs the session in a bwrap sandbox, with no
  warning, in print mode and through the daemon.
- ``prime-agent import --backend local`` says it too, without and with a daemon.
- ``auto`` with neither docker nor bubblewrap refuses in one line naming both fixes, before
  anything is asked of the model; an explicit ``bwrap`` that cannot run says why.

Docker is made unusable by pointing ``DOCKER_HOST`` at a socket that does not exist, bubblewrap
by a ``PATH`` without it: the CLI's own lookups, nothing of the host is changed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.sandbox.bwrap_probe import bwrap_usable
from orchestrator.sandbox.choice import LOCAL_WARNING
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, daemon_pids, need, write_config

CLI_TIMEOUT_S = 120.0
WARNING_LINE = f"prime-agent: warning: {LOCAL_WARNING}"
NO_DOCKER = "unix:///nonexistent/prime-agent-test/docker.sock"
SESSION_FILE = Path(__file__).resolve().parents[1] / "fixtures" / "jsonl" / "v3_tree.jsonl"

COMPUTE = """
repeat forever:
    when "compute":
        code: print(6 * 7)
    when "42":
        text: The answer is 42.
"""


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer(COMPUTE) as srv:
        # The daemon resolves the model from its config; print mode takes --api-base too.
        write_config(f'retry_base_delay_s = 0.01\n[models."openai/fake"]\napi_base = "{srv.url}"\n')
        yield srv


def run(backend: str, model: FakeModelServer) -> tuple[int, str, list[str]]:
    proc = cli(
        ["-p", "compute", "--backend", backend, "--model", "openai/fake", "--api-base", model.url],
        timeout=CLI_TIMEOUT_S,
    )
    return proc.returncode, proc.stdout, proc.stderr.splitlines()


def backends_of_sessions() -> list[str]:
    listing = cli(["agents", "--json"], timeout=CLI_TIMEOUT_S)
    assert listing.returncode == 0, listing.stderr
    return [row["backend"] for row in json.loads(listing.stdout)]


def needs_bwrap() -> None:
    usable, why = bwrap_usable()
    if not usable:
        need("bwrap", why)


def test_local_in_print_mode_warns_once_that_the_session_is_not_isolated(
    model: FakeModelServer,
) -> None:
    code, out, err = run("local", model)
    assert code == 0, err
    assert out == "The answer is 42.\n"
    assert err.count(WARNING_LINE) == 1, err


def test_bwrap_in_print_mode_runs_the_session_without_a_warning(model: FakeModelServer) -> None:
    needs_bwrap()
    code, out, err = run("bwrap", model)
    assert code == 0, err
    assert out == "The answer is 42.\n"
    assert not any("warning" in line for line in err), err
    assert backends_of_sessions() == ["bwrap"]


def test_auto_without_docker_is_bwrap(
    model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs_bwrap()
    monkeypatch.setenv("DOCKER_HOST", NO_DOCKER)
    code, out, err = run("auto", model)
    assert code == 0, err
    assert out == "The answer is 42.\n" and WARNING_LINE not in err
    assert backends_of_sessions() == ["bwrap"]


def test_auto_without_docker_or_bubblewrap_refuses_in_one_line(
    model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", NO_DOCKER)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # the venv: no bwrap there
    code, out, err = run("auto", model)
    assert code == 2 and out == "" and len(err) == 1, err
    assert err[0].startswith("prime-agent: error: no sandbox backend is usable here")
    assert "make images" in err[0] and "install bubblewrap" in err[0]
    assert "--backend local" in err[0]
    code, _, err = run("bwrap", model)
    assert code == 2 and err == [
        "prime-agent: error: the bwrap backend is not usable: bubblewrap is not installed "
        "(apt-get install bubblewrap)"
    ], err
    assert model.requests == []  # refused before the first model call


def test_through_the_daemon_local_warns_the_cli_user_and_bwrap_does_not(
    model: FakeModelServer,
) -> None:
    started = cli(["daemon", "start"], timeout=CLI_TIMEOUT_S)
    assert started.returncode == 0, started.stderr
    assert daemon_pids()  # a running daemon: print mode goes through it
    code, out, err = run("local", model)
    assert code == 0, err
    assert out == "The answer is 42.\n"
    assert err.count(WARNING_LINE) == 1, err
    usable, _ = bwrap_usable()
    if usable:
        code, out, err = run("bwrap", model)
        assert code == 0, err
        assert out == "The answer is 42.\n" and WARNING_LINE not in err
    stopped = cli(["daemon", "stop"], timeout=CLI_TIMEOUT_S)
    assert stopped.returncode == 0, stopped.stderr
    assert sorted(backends_of_sessions()) == (["bwrap", "local"] if usable else ["local"])
    if not usable:
        need("bwrap", "the daemon's bwrap sessions were not run")


def test_import_with_the_local_backend_warns_without_and_with_a_daemon(
    model: FakeModelServer,  # its config names openai/fake's endpoint
) -> None:
    def imported(backend: str) -> list[str]:
        proc = cli(
            ["import", str(SESSION_FILE), "--model", "openai/fake", "--backend", backend],
            timeout=CLI_TIMEOUT_S,
        )
        assert proc.returncode == 0 and proc.stdout.startswith("s-"), proc.stderr
        return proc.stderr.splitlines()

    assert imported("local").count(WARNING_LINE) == 1  # straight into the database
    started = cli(["daemon", "start"], timeout=CLI_TIMEOUT_S)
    assert started.returncode == 0, started.stderr
    assert imported("local").count(WARNING_LINE) == 1  # the daemon's reply
    usable, _ = bwrap_usable()
    if usable:
        assert WARNING_LINE not in imported("bwrap")
    stopped = cli(["daemon", "stop"], timeout=CLI_TIMEOUT_S)
    assert stopped.returncode == 0, stopped.stderr
    assert sorted(backends_of_sessions()) == (
        ["bwrap", "local", "local"] if usable else ["local", "local"]
    )
    if not usable:
        need("bwrap", "the bwrap import was not run")


WRITE_PROBE = """
repeat forever:
    when "probe":
        code:
            try:
                open("probe.txt", "w").write("x")
                print("WROTE")
            except OSError as exc:
                import errno
                print("REFUSED", errno.errorcode.get(exc.errno or 0))
    when "WROTE": text: wrote
    when "EROFS": text: read-only
    when "REFUSED": text: refused
"""


def _stored_policies() -> dict[str, dict[str, object]]:
    """Each session's stored sandbox policy, read from the database (no daemon running)."""
    import duckdb

    from orchestrator.paths import Paths

    con = duckdb.connect(str(Paths.from_env().database_file), read_only=True)
    try:
        rows = con.execute("SELECT name, sandbox_policy FROM sessions").fetchall()
    finally:
        con.close()
    return {str(name): json.loads(policy) for name, policy in rows}


def test_through_the_daemon_a_run_keeps_its_own_sandbox_choices(tmp_path: Path) -> None:
    """--image, --workspace and --network travel with the session to a running daemon (they
    were refused there): stored in its policy, and the sandbox is started with them."""
    needs_bwrap()
    project = tmp_path / "project"
    project.mkdir()
    project.chmod(0o777)  # whoever the sandbox runs as may write here, unless mounted read-only
    with FakeModelServer(WRITE_PROBE) as srv:
        write_config("retry_base_delay_s = 0.01\n")
        started = cli(["daemon", "start"], timeout=CLI_TIMEOUT_S)
        assert started.returncode == 0, started.stderr
        flags = ["--backend", "bwrap", "--model", "openai/fake", "--api-base", srv.url]
        chosen = cli(
            ["-p", "probe ro", *flags, "--workspace", "ro", "--image", "rust", "--network"],
            timeout=CLI_TIMEOUT_S,
            cwd=project,
        )
        plain = cli(["-p", "probe rw", *flags], timeout=CLI_TIMEOUT_S, cwd=project)
        stopped = cli(["daemon", "stop"], timeout=CLI_TIMEOUT_S)
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout == "read-only\n", chosen.stderr  # the read-only workspace was enforced
    assert plain.returncode == 0 and plain.stdout == "wrote\n", plain.stderr
    assert stopped.returncode == 0, stopped.stderr
    policies = _stored_policies()
    assert {k: policies["probe ro"][k] for k in ("image", "workspace", "network")} == {
        "image": "rust",
        "workspace": "ro",
        "network": True,
    }
    assert {k: policies["probe rw"][k] for k in ("workspace", "network")} == {
        "workspace": "rw",
        "network": False,
    }
