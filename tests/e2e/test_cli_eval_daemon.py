# ruff: noqa: E501  (scripts below are data: long lines are the model's cells)
"""``prime-agent run --config`` through the user's daemon (issue 18): real ``prime-agent``
processes, a real daemon (started by the CLI or by ``daemon start``), a real nats-server and
DuckDB file, the scripted model over HTTP. What the config chooses applies to its session only;
the key travels from the client's environment and is written nowhere; the settings stay with the
session across a daemon restart; the daemon writes the result row and the CLI the JSON file."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from orchestrator.cli.common import EXIT_ABORTED
from orchestrator.paths import Paths
from orchestrator.settings import MIB, SANDBOX_CPUS, SANDBOX_MEMORY_MIB
from orchestrator.store.db import SessionRecord, Store
from orchestrator.store.eval_results import EvalResultRow, select_recent_eval_results
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, daemon_pids, stop_daemons, wait_until, write_config

RUN_TIMEOUT_S: Final = 120.0
START_TIMEOUT_S: Final = 60.0
# The daemon's own config: no retries, so a session that retries does so by its own settings.
DAEMON_CONFIG: Final = "retry_base_delay_s = 0.01\nmodel_max_retries = 0\n"
KEY_VAR: Final = "PRIME_EVAL_TEST_KEY"
KEY_VALUE: Final = "sk-eval-9f3c1d2e7a6b5c4d"


@pytest.fixture
def autostart(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PRIME_AGENT_DAEMON_AUTOSTART", "1")
    write_config(DAEMON_CONFIG)
    yield
    stop_daemons(os.environ["XDG_RUNTIME_DIR"])


def _config(where: Path, name: str, url: str, task: str, **sections: Any) -> Path:
    data: dict[str, Any] = {
        "name": name,
        "task": task,
        "model": {"name": "openai/fake", "api_base": url, **sections.pop("model", {})},
        **sections,
    }
    path = where / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _result(where: Path, name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((where / f"{name}.result.json").read_text())
    return loaded


def _stored() -> tuple[list[SessionRecord], list[EvalResultRow]]:
    """Sessions and results from the database (no daemon may hold it)."""

    async def read() -> tuple[list[SessionRecord], list[EvalResultRow]]:
        async with await Store.open(Paths.from_env().database_file, read_only=True) as store:
            rows = await store.read(lambda con: select_recent_eval_results(con, 10))
            return await store.list_sessions(), rows

    return asyncio.run(read())


def _by_name(sessions: list[SessionRecord]) -> dict[str, SessionRecord]:
    return {s.name or s.id: s for s in sessions}


def _stop_daemon() -> None:
    stopped = cli(["daemon", "stop"])
    assert stopped.returncode == 0, stopped.stderr
    assert daemon_pids() == []


def test_run_config_starts_the_daemon_and_records_its_result(
    autostart: None, tmp_path: Path
) -> None:
    """No daemon runs: `run --config` starts one, runs through it (no "stop it first"), and
    ends with the in-process path's summary line, exit code, JSON file and result row."""
    assert daemon_pids() == []
    script = 'repeat forever:\n    when "EDITED": text: fixed it\n    when "Gate failed (attempt 1)":\n        code: import pathlib; pathlib.Path("ok").write_text("1"); print("EDITED")\n    else: text: looks fine to me\n'
    with FakeModelServer(script) as srv:
        path = _config(
            tmp_path,
            "gated",
            srv.url,
            "make the gate pass",
            model={"input_cost_per_mtok": 0.15, "output_cost_per_mtok": 0.6},
            autonomous={"gates": ["test -f ok"], "max_turns": 4},
        )
        proc = cli(["run", "--config", str(path)], timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert len(daemon_pids()) == 1  # it ran in the daemon it started, which stays
    assert proc.stdout.count("\n") == 1, proc.stdout
    assert proc.stdout.startswith("gated: gate_passed (exit 0) in "), proc.stdout
    assert proc.stdout.rstrip().endswith(f"result {tmp_path / 'gated.result.json'}")
    result = _result(tmp_path, "gated")
    assert result["stop_reason"] == "gate_passed" and result["exit_code"] == 0
    assert [g["passed"] for g in result["gates"]] == [False, True]
    assert result["tokens_input"] > 0 and result["sessions"] == 1
    assert result["cost_known"] is True and result["cost_usd"] > 0
    assert result["config"]["name"] == "gated" and result["config_path"] == str(path)
    assert oct((tmp_path / "gated.result.json").stat().st_mode & 0o777) == "0o600"
    _stop_daemon()
    sessions, rows = _stored()
    assert [r.to_wire() for r in rows] == [result]  # the file says what the row says
    assert rows[0].session_id == _by_name(sessions)["gated"].id


def _barrier_script(mine: Path, other: Path) -> str:
    """A cell that says it runs and waits (bounded) for the other run's cell: both cells can
    only finish "together" when both sessions run at the same time."""
    return (
        'repeat forever:\n    when "together": text: done together\n    when "alone": text: done alone\n'
        "    else:\n        code:\n"
        f"            import pathlib, time; pathlib.Path({str(mine)!r}).touch(); end = time.time() + 60\n"
        f"            while not pathlib.Path({str(other)!r}).exists() and time.time() < end: time.sleep(0.05)\n"
        f"            print('together' if pathlib.Path({str(other)!r}).exists() else 'alone')\n"
    )


def test_two_run_configs_at_once_through_one_daemon(autostart: None, tmp_path: Path) -> None:
    started = cli(["daemon", "start"])
    assert started.returncode == 0, started.stderr
    flags = (tmp_path / "a.flag", tmp_path / "b.flag")
    with (
        FakeModelServer(_barrier_script(flags[0], flags[1])) as one,
        FakeModelServer(_barrier_script(flags[1], flags[0])) as two,
    ):
        paths = [
            _config(tmp_path, "one", one.url, "meet the other run"),
            _config(tmp_path, "two", two.url, "meet the other run"),
        ]
        runs = [
            subprocess.Popen(
                [sys.executable, "-m", "orchestrator", "run", "--config", str(p)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for p in paths
        ]
        outputs = [run.communicate(timeout=RUN_TIMEOUT_S) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err for _, err in outputs]
    assert outputs[0][0].startswith("one: completed (exit 0)"), outputs[0]
    assert outputs[1][0].startswith("two: completed (exit 0)"), outputs[1]
    assert len(daemon_pids()) == 1
    _stop_daemon()
    sessions, rows = _stored()
    named = _by_name(sessions)
    assert {r.session_id for r in rows} == {named["one"].id, named["two"].id}
    for name in ("one", "two"):
        assert _result(tmp_path, name)["stop_reason"] == "completed"

    async def said() -> list[str]:
        async with await Store.open(Paths.from_env().database_file, read_only=True) as store:
            texts = []
            for name in ("one", "two"):
                events = await store.events(named[name].id)
                texts += [e.payload["text"] for e in events if e.type == "assistant_message"]
            return texts

    assert [t for t in asyncio.run(said()) if t.startswith("done")] == ["done together"] * 2


def test_a_configs_settings_apply_to_its_session_and_not_to_another(
    autostart: None, tmp_path: Path
) -> None:
    """The daemon's config retries nothing; the config's session retries (its own retry
    section) and gets its budget, depth limit, compaction and sandbox limits; a `-p` session
    of the same daemon, run after it, has the daemon's: its first server error ends it."""
    flaky = "500\n---\ntext: survived"
    with FakeModelServer(flaky) as mine, FakeModelServer(flaky) as other:
        path = _config(
            tmp_path,
            "chosen",
            mine.url,
            "say something",
            retry={"max_retries": 2, "base_delay_s": 0.01},
            compaction={"enabled": False, "reserve_tokens": 1234},
            sandbox={"memory_mib": 1024, "cpus": 0.5},
            limits={"session_token_budget": 77777, "max_depth": 0},
        )
        proc = cli(["run", "--config", str(path)], timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("chosen: completed (exit 0)"), proc.stdout
        assert len(mine.requests) == 2  # the 500, retried
        plain = cli(
            ["-p", "say something", "--model", "openai/fake", "--api-base", other.url],
            cwd=tmp_path,
            timeout=RUN_TIMEOUT_S,
        )
        assert plain.returncode != 0, plain.stdout
        assert len(other.requests) == 1  # the daemon's config: no retry
    assert len(daemon_pids()) == 1
    _stop_daemon()
    named = _by_name(_stored()[0])
    chosen, ordinary = named["chosen"], named["say something"]
    assert chosen.budget_tokens == 77777
    assert chosen.run_settings is not None
    assert chosen.run_settings.model_max_retries == 2 and chosen.run_settings.max_depth == 0
    assert chosen.run_settings.compaction is not None
    assert chosen.run_settings.compaction.enabled is False
    assert chosen.sandbox_policy is not None and ordinary.sandbox_policy is not None
    assert (chosen.sandbox_policy.memory_bytes, chosen.sandbox_policy.cpus) == (1024 * MIB, 0.5)
    assert ordinary.run_settings is None and ordinary.budget_tokens is None
    assert (ordinary.sandbox_policy.memory_bytes, ordinary.sandbox_policy.cpus) == (
        SANDBOX_MEMORY_MIB * MIB,
        SANDBOX_CPUS,
    )


def test_the_key_comes_from_the_client_and_is_written_nowhere(
    autostart: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_env: Path
) -> None:
    """The daemon is started without the key; the config names its variable; the run's shell
    has it. The model gets it as the bearer token; no file of the daemon holds it."""
    started = cli(["daemon", "start"])  # this environment has no key
    assert started.returncode == 0, started.stderr
    with FakeModelServer("text: authorised") as srv:
        path = _config(tmp_path, "keyed", srv.url, "who am I", model={"api_key_env": KEY_VAR})
        missing = cli(["run", "--config", str(path)], timeout=RUN_TIMEOUT_S)
        assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
        assert KEY_VAR in missing.stderr and not srv.requests
        monkeypatch.setenv(KEY_VAR, KEY_VALUE)
        proc = cli(["run", "--config", str(path)], timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 0, proc.stderr
        assert [h.get("authorization") for h in srv.request_headers] == [f"Bearer {KEY_VALUE}"]
    _stop_daemon()
    (session,) = [s for s in _stored()[0] if s.name == "keyed"]
    assert session.model_spec is not None and session.model_spec.api_key_env == KEY_VAR
    secret = KEY_VALUE.encode()
    written = [p for p in isolated_env.rglob("*") if p.is_file() and secret in p.read_bytes()]
    assert written == []  # not the database, not the journal, not a log
    assert Paths.from_env().database_file.is_file()

    async def anywhere_in_the_database() -> int:
        async with await Store.open(Paths.from_env().database_file, read_only=True) as store:

            def count(con: Any) -> int:
                found = 0
                for (table,) in con.execute("SHOW TABLES").fetchall():
                    row = con.execute(
                        f'SELECT count(*) FROM "{table}" t WHERE CAST(t AS VARCHAR) LIKE $1',
                        [f"%{KEY_VALUE}%"],
                    ).fetchone()
                    found += int(row[0])
                return found

            return await store.read(count)

    assert asyncio.run(anywhere_in_the_database()) == 0


def test_a_sessions_settings_survive_a_daemon_restart(autostart: None, tmp_path: Path) -> None:
    """The config's retry setting is stored with its session: a follow-up under a new daemon
    (whose config retries nothing) still retries that session's server error."""
    script = "text: first\n---\n500\n---\ntext: second"
    with FakeModelServer(script) as srv:
        path = _config(
            tmp_path, "lasting", srv.url, "begin", retry={"max_retries": 1, "base_delay_s": 0.01}
        )
        proc = cli(["run", "--config", str(path)], timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 0, proc.stderr
        _stop_daemon()
        again = cli(["-p", "once more", "--resume", "lasting"], timeout=RUN_TIMEOUT_S)
        assert again.returncode == 0, again.stderr
        assert again.stdout == "second\n"
        assert len(srv.requests) == 3  # first, the 500, and its retry


def test_no_daemon_runs_in_this_process(autostart: None, tmp_path: Path) -> None:
    with FakeModelServer("repeat forever:\n    text: here") as srv:
        path = _config(tmp_path, "local", srv.url, "run here")
        proc = cli(["run", "--config", str(path), "--no-daemon"], timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("local: completed (exit 0)"), proc.stdout
        assert daemon_pids() == []  # autostart is on, and still none was started
        assert _result(tmp_path, "local")["stop_reason"] == "completed"
        assert [r.stop_reason for r in _stored()[1]] == ["completed"]
        assert cli(["daemon", "start"]).returncode == 0
        refused = cli(["run", "--config", str(path), "--no-daemon"])
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "--no-daemon" in refused.stderr and "daemon stop" in refused.stderr


def test_ctrl_c_aborts_the_run_in_the_daemon_and_records_nothing(
    autostart: None, tmp_path: Path
) -> None:
    marker = tmp_path / "cell-runs"
    script = f"code: import pathlib, time; pathlib.Path({str(marker)!r}).touch(); time.sleep(120)"
    with FakeModelServer(script) as srv:
        path = _config(tmp_path, "stopped", srv.url, "take long")
        run = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "run", "--config", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert wait_until(marker.exists, timeout=START_TIMEOUT_S)
            run.send_signal(signal.SIGINT)
            out, err = run.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    assert run.returncode == EXIT_ABORTED, err
    assert "interrupted; the session history is kept" in err and "Traceback" not in err
    assert out == "" and not (tmp_path / "stopped.result.json").exists()
    _stop_daemon()
    sessions, rows = _stored()
    assert rows == []
    (session,) = [s for s in sessions if s.name == "stopped"]

    async def events() -> list[tuple[str, Any]]:
        async with await Store.open(Paths.from_env().database_file, read_only=True) as store:
            return [(e.type, e.payload) for e in await store.events(session.id)]

    recorded = asyncio.run(events())
    assert "aborted" in [t for t, _ in recorded]  # the daemon aborted its turn
    assert recorded[-1][0] == "run_end" and recorded[-1][1]["reason"] == "aborted"
