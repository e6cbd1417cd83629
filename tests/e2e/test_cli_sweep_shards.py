"""Sweeps in shards as a cluster runs them (issue 21): each shard a real ``prime-agent sweep
run --shard i/N`` with its own home, store and daemon, on the scripted models over HTTP; the
shards' Parquet merged into one store whose cells and report are the unsharded run's; merging
again adds nothing; a shard killed with -9 resumes by cell."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from orchestrator.sweeps.shards import shard_of
from orchestrator.testing import FakeModelServer
from tests.e2e.test_cli_sweep import DUD, FINDER, SLOW_FINDER
from tests.helpers import CLI_TIMEOUT_S, stop_daemons, wait_until

# Bounds, not expectations: a dozen trials per run on 2 loaded cores.
SWEEP_TIMEOUT_S = 600.0
KILL_WAIT_S = 180.0
RUNNER_EXIT_S = 60.0

SWEEP = """
name: parts
suites: [{suite: s-niah, tasks: 3, context_tokens: [600]}]
models: [openai/finder, openai/dud]
variants: [{name: vanilla, rlm: false}]
seeds: [1, 2]
concurrency: {trials: 2, sandboxes: 2}
"""
CELLS = 12  # 3 tasks × 2 models × 2 seeds


class Homes:
    """Separate prime-agent homes (config, store, daemon) in one test: one per machine."""

    def __init__(self, root: Path, config: str) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.config = config
        # The control socket's path must fit AF_UNIX's 108 bytes: runtime dirs under /tmp.
        self.runtime_root = Path(tempfile.mkdtemp(prefix="pa-"))
        self.runtime_dirs: list[str] = []

    def env(self, name: str) -> dict[str, str]:
        env = dict(os.environ)
        for var, path in (
            ("XDG_CONFIG_HOME", self.root / name / "config"),
            ("XDG_DATA_HOME", self.root / name / "data"),
            ("XDG_RUNTIME_DIR", self.runtime_root / name),
        ):
            path.mkdir(parents=True, exist_ok=True)
            env[var] = str(path)
        config = Path(env["XDG_CONFIG_HOME"]) / "prime-agent" / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(self.config)
        env["PRIME_AGENT_DAEMON_AUTOSTART"] = "1"
        if env["XDG_RUNTIME_DIR"] not in self.runtime_dirs:
            self.runtime_dirs.append(env["XDG_RUNTIME_DIR"])
        return env

    def cli(
        self, name: str, args: list[str], timeout: float = CLI_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(name),
            cwd=self.root,  # a command's default output (sweep-report/) lands here
            check=False,
        )

    def cells(self, name: str, sweep: str = "parts") -> list[dict[str, Any]]:
        shown = self.cli(name, ["sweep", "status", sweep, "--json"])
        assert shown.returncode == 0, shown.stderr
        return [json.loads(line) for line in shown.stdout.splitlines()]

    def stop(self) -> None:
        for runtime_dir in self.runtime_dirs:
            stop_daemons(runtime_dir)
        shutil.rmtree(self.runtime_root, ignore_errors=True)


@pytest.fixture
def models() -> Iterator[tuple[FakeModelServer, FakeModelServer]]:
    with FakeModelServer(FINDER) as finder, FakeModelServer(DUD) as dud:
        yield finder, dud


def _config(finder: FakeModelServer, dud: FakeModelServer) -> str:
    return (
        "retry_base_delay_s = 0.01\nmodel_max_retries = 1\n"
        f'[models."openai/finder"]\napi_base = "{finder.url}"\n'
        f'[models."openai/dud"]\napi_base = "{dud.url}"\n'
    )


@pytest.fixture
def homes(tmp_path: Path, models: tuple[FakeModelServer, FakeModelServer]) -> Iterator[Homes]:
    made = Homes(tmp_path / "homes", _config(*models))
    yield made
    made.stop()


def _merged(store: Path) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(store), read_only=True)
    try:
        return con.execute(
            "SELECT fingerprint, state, score, trials FROM sweep_cells WHERE sweep = 'parts' "
            "ORDER BY position"
        ).fetchall()
    finally:
        con.close()


def _groups(summary: Path) -> dict[tuple[str, str], tuple[float, int]]:
    numbers = json.loads(summary.read_text())
    return {(g["model"], g["variant"]): (g["score"], g["scored"]) for g in numbers["groups"]}


def test_two_shards_merge_into_the_unsharded_result(homes: Homes, tmp_path: Path) -> None:
    path = tmp_path / "parts.yaml"
    path.write_text(SWEEP)
    whole = homes.cli("whole", ["sweep", "run", str(path)], timeout=SWEEP_TIMEOUT_S)
    assert whole.returncode == 0, whole.stderr
    local = homes.cells("whole")
    assert len(local) == CELLS
    reported = homes.cli("whole", ["sweep", "report", "parts", "--out", str(tmp_path / "local")])
    assert reported.returncode == 0, reported.stderr

    exports = tmp_path / "results"
    for index in (0, 1):
        ran = homes.cli(
            f"shard{index}",
            ["sweep", "run", str(path), "--shard", f"{index}/2", "--export-dir", str(exports)],
            timeout=SWEEP_TIMEOUT_S,
        )
        assert ran.returncode == 0, ran.stderr
        mine = homes.cells(f"shard{index}")
        # The shard ran its cells and no other: its own store holds only them.
        assert mine and all(shard_of(c["fingerprint"], 2) == index for c in mine)
        assert f"shard {index}/2: {len(mine)} of {CELLS} cells" in ran.stderr
    names = sorted(p.name for p in exports.iterdir())
    assert names == [
        "parts.shard-0-of-2.cells.parquet",
        "parts.shard-0-of-2.trials.parquet",
        "parts.shard-1-of-2.cells.parquet",
        "parts.shard-1-of-2.trials.parquet",
    ]

    store = tmp_path / "merged" / "sweeps.duckdb"
    report = tmp_path / "merged-report"
    merged = homes.cli(
        "merger", ["sweep", "merge", str(exports), "--into", str(store), "--out", str(report)]
    )
    assert merged.returncode == 0, merged.stderr
    assert f"{CELLS} cell(s) added, 0 replaced, 0 already there; {CELLS} trial(s) added" in (
        merged.stderr
    )
    assert "; done" in merged.stderr
    rows = _merged(store)
    # The merged cells are the unsharded run's: the same cells, in the file's order, scored
    # the same, each with one trial.
    assert rows == [(c["fingerprint"], "scored", c["score"], 1) for c in local]
    # And the same report: the scores per model × variant and the table.
    assert _groups(report / "summary.json") == _groups(tmp_path / "local" / "summary.json")
    assert _groups(report / "summary.json")[("openai/finder", "vanilla")] == (1.0, 6)
    table = [line.split("|")[1:4] for line in merged.stdout.splitlines()]
    assert table == [line.split("|")[1:4] for line in reported.stdout.splitlines()]
    assert (report / "index.html").stat().st_size > 0

    # The same shards again: nothing is added twice.
    again = homes.cli("merger", ["sweep", "merge", str(exports), "--into", str(store)])
    assert again.returncode == 0, again.stderr
    assert f"0 cell(s) added, 0 replaced, {CELLS} already there; 0 trial(s) added" in (again.stderr)
    assert _merged(store) == rows
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT count(*), count(DISTINCT id) FROM sweep_trials").fetchone() == (
        CELLS,
        CELLS,
    )
    con.close()

    # Into this user's own store (no --into): then every command reads the merged sweep.
    into_mine = homes.cli("mine", ["sweep", "merge", str(exports), "--out", str(report)])
    assert into_mine.returncode == 0, into_mine.stderr
    shown = homes.cells("mine")  # starts this home's daemon on the merged store
    assert [(c["fingerprint"], c["state"], c["score"]) for c in shown] == [
        (c["fingerprint"], "scored", c["score"]) for c in local
    ]
    status = homes.cli("mine", ["sweep", "status", "parts"])
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"sweep parts: done; {CELLS} cells: {CELLS} scored")
    # While that daemon holds the store, merging into it is refused in one line.
    held = homes.cli("mine", ["sweep", "merge", str(exports)])
    assert held.returncode == 2, held.stderr
    (line,) = held.stderr.splitlines()
    assert "prime-agent daemon stop" in line and "--into" in line

    # A shard of another sweep file is refused, in one line, and nothing is merged.
    other = tmp_path / "other"
    other.mkdir()
    source = exports / "parts.shard-0-of-2.cells.parquet"
    con = duckdb.connect()
    con.execute(
        f"COPY (SELECT * REPLACE ('0000' AS digest) FROM '{source}') "
        f"TO '{other / 'parts.shard-1-of-2.cells.parquet'}' (FORMAT parquet)"
    )
    con.close()
    refused = homes.cli("merger", ["sweep", "merge", str(source), str(other), "--into", str(store)])
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.splitlines()
    assert "is a shard of another sweep file" in line
    assert _merged(store) == rows


def test_a_killed_shard_resumes_by_cell(tmp_path: Path) -> None:
    with FakeModelServer(SLOW_FINDER) as finder, FakeModelServer(DUD) as dud:
        homes = Homes(tmp_path / "homes", _config(finder, dud))
        try:
            _killed_shard_resumes(homes, tmp_path, lambda: len(finder.requests) + len(dud.requests))
        finally:
            homes.stop()


def _exported(path: Path) -> dict[str, tuple[Any, ...]]:
    con = duckdb.connect()
    try:
        rows = con.execute(
            "SELECT fingerprint, state, score, session_id FROM read_parquet($1)", [str(path)]
        ).fetchall()
    finally:
        con.close()
    return {r[0]: r for r in rows}


def _killed_shard_resumes(homes: Homes, tmp_path: Path, asked: Callable[[], int]) -> None:
    path = tmp_path / "parts.yaml"
    # One trial at a time: the kill lands with cells still to run.
    path.write_text(SWEEP.replace("{trials: 2, sandboxes: 2}", "{trials: 1, sandboxes: 1}"))
    exports = tmp_path / "results"
    export = exports / "parts.shard-1-of-2.cells.parquet"
    command = ["sweep", "run", str(path), "--shard", "1/2", "--export-dir", str(exports)]
    runner = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=homes.env("first"),
    )
    try:
        # The shard writes its export after its first finished trial, before the others.
        assert wait_until(export.exists, timeout=KILL_WAIT_S, interval=0.1)
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=RUNNER_EXIT_S)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    early = _exported(export)
    scored_early = {f: r for f, r in early.items() if r[1] == "scored"}
    assert scored_early and len(scored_early) < len(early)  # killed mid-shard

    # Retried as a Job retries an index: a new pod, a new empty store, the same export.
    retried = homes.cli("retry", command, timeout=SWEEP_TIMEOUT_S)
    assert retried.returncode == 0, retried.stderr
    assert f"{len(scored_early)} cell(s) scored in {export} are not run again" in retried.stderr
    final = _exported(export)
    assert set(final) == set(early) and {r[1] for r in final.values()} == {"scored"}
    for fingerprint, row in scored_early.items():
        assert final[fingerprint] == row  # carried, not run again: the same session
    ran_here = {c["fingerprint"] for c in homes.cells("retry") if c["state"] == "scored"}
    assert ran_here == set(final) - set(scored_early)

    # The killed shard's own store, run again: every cell is scored there or in the export.
    before = asked()
    again = homes.cli("first", command, timeout=SWEEP_TIMEOUT_S)
    assert again.returncode == 0, again.stderr
    assert asked() == before
    assert _exported(export) == final

    store = tmp_path / "merged.duckdb"
    merged = homes.cli("merger", ["sweep", "merge", str(exports), "--into", str(store)])
    assert merged.returncode == 0, merged.stderr
    assert "shard(s) not given: 0/2" in merged.stderr
    assert "; incomplete" in merged.stderr  # half the file's cells are in shard 0
    rows = _merged(store)
    assert {r[0]: (r[1], r[2]) for r in rows} == {f: (r[1], r[2]) for f, r in final.items()}
