"""``prime-agent sweep run FILE``: run a sweep's cells through the daemon (docs/sweeps.md).

The runner opens the sweep (the daemon refuses a second live runner of the same name), adds
the file's cells and skips every cell already ``scored``; the rest run as trials, at most
``concurrency.in_flight`` at once. A trial is one root session in its own workspace
(``<data>/sweeps/<name>/<fingerprint>``, made afresh): created idle, registered as the cell's
trial, then given its prompt; when its tree is quiet the answer is scored here and the outcome
recorded (the daemon adds the tree's tokens and cost). So a runner killed at any point loses at
most the trials in flight: the next ``sweep run`` abandons them and runs those cells again,
and a finished cell is never run or counted twice.

A trial that ends — answered, out of tokens, out of time — is ``scored`` (a budget stop scores
what it answered); one that could not run — the model's endpoint failed, the sandbox died — is
``errored`` and runs again next time. Once the sweep's cost or token budget is spent, no new
trial starts and the sweep ends ``budget``.

Before any trial, each cell's task is checked against this machine (``sweeps/runnable.py``): a
cell that needs a GPU the sandboxes cannot have, or an image that is not here, or whose Harbor
environment cannot be made here, is not started. It is recorded ``unrunnable`` with the reason
(``sweep status --json`` shows it), one line per reason says how many cells and names a task,
and the sweep ends ``incomplete``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from orchestrator.api.errors import ConnectionClosed
from orchestrator.api.protocol import (
    MAX_ANSWER_CHARS,
    MAX_ERROR_CHARS,
    MAX_ID_CHARS,
    SWEEP_CELLS_PER_CALL,
)
from orchestrator.api.wire import E_BUSY
from orchestrator.cli.common import EXIT_ABORTED, EXIT_BUDGET_SPENT, EXIT_ERROR, EXIT_OK
from orchestrator.errors import DaemonRefused, UserError

if TYPE_CHECKING:
    from orchestrator.cli.connect import DaemonLink
    from orchestrator.cli.sweep_shards import ShardExporter
    from orchestrator.settings import Settings
    from orchestrator.sweeps.grid import Cell
    from orchestrator.sweeps.harbor_env import Environment
    from orchestrator.sweeps.runnable import Machine
    from orchestrator.sweeps.shards import Shard
    from orchestrator.sweeps.spec import SweepFile
    from orchestrator.sweeps.trial import TrialInput

__all__ = [
    "FALLBACK_CONTEXT_WINDOW",
    "SWEEP_EXIT_CODES",
    "TRIAL_WAIT_DEFAULT_S",
    "SweepProgress",
    "check_models",
    "run_sweep",
]

# A vanilla prompt is cut to the model's window; a model that declares none gets this one.
FALLBACK_CONTEXT_WINDOW: Final = 32_768
# How long a trial may run when the sweep sets no trial_wall_s.
TRIAL_WAIT_DEFAULT_S: Final = 3600.0
# Extra time the daemon gets to answer wait_quiet past the trial's own limit.
WAIT_SLACK_S: Final = 30.0
# How long an aborted trial's tree gets to go quiet (its run_end recorded).
ABORT_SETTLE_S: Final = 15.0
# Non-interactive progress: a line at most this often (and one at the end).
PROGRESS_EVERY_S: Final = 10.0
SWEEP_EXIT_CODES: Final = {
    "done": EXIT_OK,
    "incomplete": EXIT_ERROR,
    "budget": EXIT_BUDGET_SPENT,
    "cancelled": EXIT_ABORTED,
}
WALL_TIME_STOP: Final = "wall_time"  # a trial stopped at the sweep's trial_wall_s
# Cell states this run starts no trial for: done, or not possible on this machine.
_NOT_TO_RUN: Final = frozenset({"scored", "unrunnable"})
# wait_quiet reasons that mean the trial could not run (it is rerun next time).
_ERRORED_REASONS: Final = frozenset({"error"})


@dataclass
class SweepProgress:
    """Counts, cost and an ETA, printed on stderr as the sweep goes."""

    name: str
    total: int
    done: int = 0
    failed: int = 0
    running: int = 0
    held: int = 0  # cells this machine cannot run (not started)
    cost_usd: float = 0.0
    tokens: int = 0
    started: float = field(default_factory=time.monotonic)
    finished_here: int = 0
    _last_print: float = 0.0
    _tty: bool = field(default_factory=lambda: sys.stderr.isatty())

    def line(self) -> str:
        left = self.total - self.done - self.held
        eta = ""
        if self.finished_here and left:
            per_cell = (time.monotonic() - self.started) / self.finished_here
            eta = f" · ETA {_duration(per_cell * left / max(1, self.running or 1))}"
        return (
            f"sweep {self.name}: {self.done}/{self.total} done · {self.running} running · "
            f"{self.failed} failed · "
            + (f"{self.held} cannot run here · " if self.held else "")
            + f"${self.cost_usd:.4f}{eta}"
        )

    def show(self, *, final: bool = False) -> None:
        now = time.monotonic()
        if self._tty:
            end = "\n" if final else ""
            print(f"\r\033[K{self.line()}", end=end, file=sys.stderr, flush=True)
        elif final or now - self._last_print >= PROGRESS_EVERY_S:
            print(self.line(), file=sys.stderr, flush=True)
            self._last_print = now


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


@dataclass
class _Run:
    spec: SweepFile
    settings: Settings
    link: DaemonLink
    data_dir: Path
    progress: SweepProgress
    slots: asyncio.Semaphore
    stop: asyncio.Event  # budget spent or cancelled: start no more trials
    stop_state: str | None = None
    # Harbor tasks' sandbox images, by task id (made before any trial starts).
    environments: dict[str, Environment] = field(default_factory=dict)
    exporter: ShardExporter | None = None  # --export-dir: the results, written as it goes

    def workspace(self, cell: Cell) -> Path:
        return self.data_dir / "sweeps" / self.spec.name / cell.fingerprint


def _window(cell: Cell, settings: Settings) -> int:
    from orchestrator.models.registry import resolve_model

    if cell.model.context_window is not None:
        return cell.model.context_window
    with contextlib.suppress(UserError):
        resolved = resolve_model(cell.model.model, settings, api_base=cell.model.api_base)
        if resolved.context_window:
            return int(resolved.context_window)
    return FALLBACK_CONTEXT_WINDOW


def _session_settings(spec: SweepFile, cell: Cell) -> dict[str, Any]:
    chosen: dict[str, Any] = {}
    model = cell.model.section().session_choice()
    if model:
        chosen["model"] = model
    if spec.budgets.trial_tokens is not None:
        chosen["session_token_budget"] = spec.budgets.trial_tokens
    depth = cell.variant.max_depth
    chosen["max_depth"] = depth if depth is not None else (None if cell.variant.rlm else 0)
    return {k: v for k, v in chosen.items() if v is not None}


def _context_setting(given: TrialInput) -> dict[str, Any]:
    return {"repl_context_file": given.context_file} if given.context_file else {}


def _client_env(cell: Cell, settings: Settings) -> dict[str, str]:
    from orchestrator.models.registry import client_env_names

    names = set(client_env_names(cell.model.model, settings))
    if cell.model.api_key_env:
        names.add(cell.model.api_key_env)
    return {name: os.environ[name] for name in sorted(names) if os.environ.get(name)}


async def _open(run: _Run, cells: list[Cell], unrunnable: dict[str, str]) -> list[dict[str, Any]]:
    from orchestrator.sweeps.grid import HARNESS_VERSION

    spec = run.spec
    opened = await run.link.call(
        "sweep_open",
        name=spec.name,
        spec={**spec.normalised(), "harness": HARNESS_VERSION},
        digest=spec.digest(),
        runner_pid=os.getpid(),
        providers={
            key: limits.model_dump(exclude_none=True) for key, limits in spec.providers.items()
        },
    )
    if opened.get("abandoned"):
        print(
            f"sweep {spec.name}: {opened['abandoned']} trial(s) of an interrupted run "
            "abandoned; their cells run again",
            file=sys.stderr,
        )
    return await _add_cells(run, cells, unrunnable)


async def _add_cells(
    run: _Run, cells: list[Cell], unrunnable: dict[str, str]
) -> list[dict[str, Any]]:
    """Add the cells (the new ones; each with why this machine cannot run it, if it cannot:
    the daemon marks it ``unrunnable``); their rows."""
    rows: list[dict[str, Any]] = []
    for start in range(0, len(cells), SWEEP_CELLS_PER_CALL):
        batch = [
            _cell_row(c, unrunnable.get(c.fingerprint))
            for c in cells[start : start + SWEEP_CELLS_PER_CALL]
        ]
        added = await run.link.call("sweep_add_cells", name=run.spec.name, cells=batch)
        rows.extend(added["cells"])
    return rows


def _cell_row(cell: Cell, unrunnable: str | None) -> dict[str, Any]:
    row = cell.row()
    if unrunnable:
        row["unrunnable"] = unrunnable[:MAX_ERROR_CHARS]
    return row


class _SweepStopped(Exception):
    """The daemon refused a new trial: the sweep was cancelled meanwhile."""


def _budget_spent(run: _Run) -> bool:
    budgets = run.spec.budgets
    if budgets.sweep_cost_usd is not None and run.progress.cost_usd >= budgets.sweep_cost_usd:
        return True
    return budgets.sweep_tokens is not None and run.progress.tokens >= budgets.sweep_tokens


async def _trial(run: _Run, cell: Cell) -> None:
    from orchestrator.sweeps.trial import trial_input

    async with run.slots:
        if run.stop.is_set():
            return
        if _budget_spent(run):
            run.stop_state = "budget"
            run.stop.set()
            return
        run.progress.running += 1
        run.progress.show()
        try:
            outcome = await _run_trial(run, cell, trial_input(cell, _window(cell, run.settings)))
        except _SweepStopped:
            run.stop_state = run.stop_state or "cancelled"
            run.stop.set()
            return
        finally:
            run.progress.running -= 1
        if outcome is None:
            return
        run.progress.finished_here += 1
        run.progress.cost_usd += float(outcome.get("cost_usd") or 0.0)
        run.progress.tokens += int(outcome.get("tokens") or 0)
        if outcome["state"] == "scored":
            run.progress.done += 1
        else:
            run.progress.failed += 1
        run.progress.show()
        if run.exporter is not None:
            await run.exporter.write_soon()


@dataclass(frozen=True)
class _Verified:
    """A Harbor task's verifier run after the agent's turn: its reward, or why there is none."""

    reward: float | None
    error: str | None = None


def _prepare_workspace(run: _Run, cell: Cell, given: TrialInput) -> tuple[Path, dict[str, Any]]:
    """The trial's workspace, made afresh, and what ``create_session`` adds for it (a Harbor
    task's image and mounts)."""
    from orchestrator.sweeps.harbor_env import TrialDirs
    from orchestrator.sweeps.suites.harbor import harbor_spec

    root = run.workspace(cell)
    if harbor_spec(cell.task) is not None:
        environment = run.environments[cell.task.id]
        dirs = TrialDirs(root)
        dirs.create(environment)
        return dirs.workdir, {"image": environment.image, "mounts": dirs.mounts(environment)}
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for name, text in given.files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root, {}


async def _verify(run: _Run, cell: Cell, session: str) -> _Verified:
    """A Harbor task's ``tests/test.sh`` in the trial's sandbox, once the agent is done (the
    tests appear at /tests only now); its reward is what it wrote under /logs/verifier."""
    from orchestrator.sweeps.harbor_env import VERIFIER_COMMAND, TrialDirs, read_reward
    from orchestrator.sweeps.suites.harbor import harbor_spec

    spec = harbor_spec(cell.task)
    assert spec is not None
    dirs = TrialDirs(run.workspace(cell))
    await asyncio.to_thread(dirs.install_tests, spec)
    checked = await run.link.mutate(
        "run_check",
        session=session,
        command=VERIFIER_COMMAND,
        timeout_s=spec.verifier_timeout_s,
        release=True,
    )
    reward = read_reward(dirs.logs)
    if reward is not None:
        return _Verified(reward)
    why = "timed out" if checked.get("timed_out") else f"exit code {checked.get('exit_code')}"
    output = str(checked.get("output") or "").strip()
    return _Verified(None, f"the verifier wrote no reward ({why}): {output}")


def _trial_limit(spec: SweepFile, cell: Cell) -> float:
    """The trial's wall time: the sweep's, and a Harbor task's own agent timeout."""
    from orchestrator.sweeps.suites.harbor import harbor_spec

    limit = spec.budgets.trial_wall_s or TRIAL_WAIT_DEFAULT_S
    harbor = harbor_spec(cell.task)
    return min(limit, harbor.agent_timeout_s) if harbor is not None else limit


async def _run_trial(run: _Run, cell: Cell, given: TrialInput) -> dict[str, Any] | None:
    from orchestrator.sweeps.scoring import read_timed_result, score
    from orchestrator.sweeps.suites.harbor import harbor_spec

    link, spec = run.link, run.spec
    verified_task = harbor_spec(cell.task) is not None
    cwd, sandbox = await asyncio.to_thread(_prepare_workspace, run, cell, given)
    if cell.task.image is not None:  # the image the task names (a Harbor task's: its own)
        sandbox.setdefault("image", cell.task.image)
    autonomous: dict[str, Any] | None = None
    if cell.task.gates:  # a gated task runs in autonomous mode until its gates pass
        autonomous = {"gates": list(cell.task.gates)}
        gate_timeout = cell.task.params.get("gate_timeout_s")
        if gate_timeout is not None:  # a timed gate that trains or benchmarks takes longer
            autonomous["gate_timeout_s"] = float(gate_timeout)
        if spec.budgets.trial_turns is not None:
            autonomous["max_turns"] = spec.budgets.trial_turns
    created = await link.mutate(
        "create_session",
        cwd=str(cwd),
        model=cell.model.model,
        api_base=cell.model.api_base,
        backend=spec.backend,
        name=f"{spec.name}/{cell.fingerprint[:12]}",
        refine=cell.variant.refine,
        autonomous=autonomous,
        settings={**_session_settings(spec, cell), **_context_setting(given)} or None,
        client_env=_client_env(cell, run.settings),
        **sandbox,
    )
    session = str(created["session"])
    try:
        started = await link.mutate(
            "sweep_trial_start", name=spec.name, fingerprint=cell.fingerprint, session=session
        )
    except DaemonRefused as exc:
        if exc.code == E_BUSY:  # the sweep is not running any more (sweep_commands.py)
            raise _SweepStopped from None
        raise
    trial = str(started["trial"])
    began = time.monotonic()
    await link.mutate("prompt", session=session, text=given.prompt, mode="follow_up")
    limit = _trial_limit(spec, cell)
    try:
        quiet: dict[str, Any] = await asyncio.wait_for(
            # A verified task keeps its sandbox for the verifier (run_check releases it).
            link.call("wait_quiet", session=session, timeout_s=limit, release=not verified_task),
            limit + WAIT_SLACK_S,
        )
    except (TimeoutError, UserError) as exc:
        if time.monotonic() - began < limit:  # refused, not out of time
            raise UserError(f"trial of {cell.task.id}: {exc}") from None
        quiet = await _stop_overdue(link, session, release=not verified_task)
    wall_s = time.monotonic() - began
    answer = str(quiet.get("final_text") or "")
    reason = str(quiet.get("stop_reason") or quiet.get("reason") or "unknown")
    # Aborted from outside (sweep cancel, prime-agent abort): it did not run to its end, so it
    # runs again next time rather than scoring what it had so far.
    interrupted = quiet.get("reason") == "aborted" and reason != WALL_TIME_STOP
    errored = quiet.get("reason") in _ERRORED_REASONS or bool(quiet.get("error")) or interrupted
    error_class = "aborted" if interrupted else str(quiet.get("error_class") or "error")
    error = str(quiet.get("error")) if quiet.get("error") else None
    reward: float | None = None
    # A timed task's gate left what it measured in the workspace (sweeps/scoring.py).
    timed = read_timed_result(cwd) if cell.task.scoring == "timed" else None
    if verified_task:
        if errored:  # nothing to verify: let the tree's sandboxes go
            with contextlib.suppress(UserError, TimeoutError):
                await link.call("wait_quiet", session=session, timeout_s=1.0, release=True)
        else:
            verified = await _verify(run, cell, session)
            reward = verified.reward
            if verified.error is not None:
                errored, error_class, error = True, "verifier", verified.error
    fields: dict[str, Any] = {
        "trial": trial,
        "state": "errored" if errored else "scored",
        "score": None if errored else score(cell.task, answer, reason, reward, timed=timed),
        "answer": answer[:MAX_ANSWER_CHARS] or None,
        "stop_reason": reason[:MAX_ID_CHARS],
        "error_class": error_class if errored else None,
        "error": error[:MAX_ERROR_CHARS] if error else None,
        "truncated": bool(given.truncated),
        "wall_s": round(wall_s, 3),
    }
    finished = await link.mutate("sweep_trial_finish", **fields)
    cell_row: dict[str, Any] = finished["cell"]
    return cell_row


async def _stop_overdue(link: DaemonLink, session: str, *, release: bool) -> dict[str, Any]:
    """A trial past its wall time: abort its tree and give it a moment to record the end."""
    with contextlib.suppress(UserError):
        await link.mutate("abort", session=session)
    settled: dict[str, Any] = {}
    with contextlib.suppress(UserError, TimeoutError):
        settled = await asyncio.wait_for(
            link.call("wait_quiet", session=session, timeout_s=ABORT_SETTLE_S, release=release),
            ABORT_SETTLE_S + WAIT_SLACK_S,
        )
    return {**settled, "reason": "aborted", "stop_reason": WALL_TIME_STOP, "error": None}


async def _prepare_environments(run: _Run, cells: list[Cell]) -> dict[str, str]:
    """Each Harbor task's sandbox image, one task at a time (builds are heavy); the cells whose
    environment cannot be made here, with why (fingerprint -> reason)."""
    from orchestrator.sweeps.harbor_env import EnvironmentUnavailable, prepare_environment
    from orchestrator.sweeps.suites.harbor import harbor_spec

    problems: dict[str, str] = {}  # task id -> reason
    for cell in cells:
        harbor = harbor_spec(cell.task)
        task_id = cell.task.id
        if harbor is None or task_id in run.environments or task_id in problems:
            continue
        try:
            run.environments[task_id] = await asyncio.to_thread(prepare_environment, harbor)
        except (EnvironmentUnavailable, UserError) as exc:
            problems[task_id] = str(exc)
    return {c.fingerprint: problems[c.task.id] for c in cells if c.task.id in problems}


async def _exporter(
    link: DaemonLink, spec: SweepFile, shard: Shard, every_cell: list[Cell], export_dir: Path
) -> ShardExporter:
    """The shard's exporter, with what its earlier export holds (a retried shard's)."""
    from orchestrator.cli.sweep_shards import ShardExporter

    exporter = ShardExporter(link, spec, shard, every_cell, export_dir)
    problem = await asyncio.to_thread(exporter.read_earlier)
    if problem is not None:
        print(f"sweep {spec.name}: earlier export left aside: {problem}", file=sys.stderr)
    elif exporter.earlier_cells:
        print(
            f"sweep {spec.name}: shard {shard}: {len(exporter.scored_earlier())} cell(s) "
            f"scored in {exporter.cells_path} are not run again",
            file=sys.stderr,
        )
    return exporter


def check_models(spec: SweepFile, settings: Settings) -> None:
    """Refuse, before anything runs, a sweep with a model no trial could call: an unknown
    provider or name, or a key that is not set in this shell (``UserError``, one line)."""
    from orchestrator.models.registry import resolve_model

    problems: list[str] = []
    for model in spec.models:
        try:
            resolve_model(model.model, settings, api_base=model.api_base)
        except UserError as exc:
            problems.append(f"{model.label} cannot run: {exc}")
            continue
        if model.api_key_env and not os.environ.get(model.api_key_env):
            problems.append(f"{model.label} cannot run: {model.api_key_env} is not set")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(f"sweep {spec.name}: {problems[0]}{more}")


async def run_sweep(
    spec: SweepFile,
    settings: Settings,
    data_dir: Path,
    *,
    link_factory: Callable[[], DaemonLink],
    machine: Machine | None = None,
    shard: Shard | None = None,
    export_dir: Path | None = None,
) -> int:
    """Run ``spec``'s unscored cells; the exit code of the sweep's end (``SWEEP_EXIT_CODES``).
    ``machine``: what this machine can give a trial (default: asked of the engine).
    ``shard``: only its cells run (``sweeps/shards.py``); ``export_dir``: at the end, the
    shard's cells and trials are written there as Parquet (the whole sweep as shard 0/1 when
    no shard is given)."""
    from orchestrator.daemon.backends import BACKEND_ENV
    from orchestrator.sweeps.grid import expand
    from orchestrator.sweeps.runnable import Machine, cannot_run, report_lines, unrunnable
    from orchestrator.sweeps.shards import Shard

    every_cell = expand(spec)
    cells = every_cell if shard is None else shard.take(every_cell)
    if shard is not None:
        print(
            f"sweep {spec.name}: shard {shard}: {len(cells)} of {len(every_cell)} cells",
            file=sys.stderr,
        )
    if machine is None:
        backend = spec.backend or os.environ.get(BACKEND_ENV)
        machine = Machine(settings, backend=backend)
    checked = machine
    reasons = await asyncio.to_thread(unrunnable, cells, lambda t: cannot_run(t, checked))
    async with link_factory() as link:
        progress = SweepProgress(spec.name, total=len(cells))
        run = _Run(
            spec=spec,
            settings=settings,
            link=link,
            data_dir=data_dir,
            progress=progress,
            slots=asyncio.Semaphore(spec.concurrency.in_flight),
            stop=asyncio.Event(),
        )
        rows = await _open(run, cells, reasons)
        states = {row["fingerprint"]: row for row in rows}
        carried: set[str] = set()  # scored in this shard's earlier export: not run again
        if export_dir is not None:
            run.exporter = await _exporter(link, spec, shard or Shard(0, 1), every_cell, export_dir)
            carried = run.exporter.scored_earlier()
        held = {
            f: why
            for f, why in reasons.items()
            if states[f]["state"] == "unrunnable" and f not in carried
        }
        todo = [
            c
            for c in cells
            if states[c.fingerprint]["state"] not in _NOT_TO_RUN and c.fingerprint not in carried
        ]
        # Harbor tasks' environments are built now (heavy: only for cells still to run); one
        # that cannot be made here holds its cells like any other reason.
        not_made = await _prepare_environments(run, todo)
        if not_made:
            await _add_cells(run, [c for c in todo if c.fingerprint in not_made], not_made)
            held.update(not_made)
            todo = [c for c in todo if c.fingerprint not in not_made]
        for line in report_lines(spec.name, cells, held):
            print(line, file=sys.stderr)
        progress.done = sum(
            1
            for c in cells
            if states[c.fingerprint]["state"] == "scored" or c.fingerprint in carried
        )
        progress.held = len(held)
        progress.cost_usd = sum(float(r.get("cost_usd") or 0) for r in rows)
        progress.tokens = sum(int(r.get("tokens") or 0) for r in rows)
        progress.show()
        tasks = [asyncio.ensure_future(_trial(run, cell)) for cell in todo]
        try:
            await asyncio.gather(*tasks)
        except ConnectionClosed:
            # The daemon died (or was stopped) under the trials in flight: they are abandoned
            # when the sweep is opened again, and what finished is kept.
            progress.show(final=True)
            raise UserError(
                f"sweep {spec.name}: the daemon went away; run the same command again to "
                "continue (finished cells are kept)"
            ) from None
        finally:
            for task in tasks:
                task.cancel()
        if run.stop_state is not None:
            state = run.stop_state
        else:
            state = "done" if progress.done == len(cells) else "incomplete"
        if state != "cancelled":
            closed = await link.mutate("sweep_close", name=spec.name, state=state)
            state = str(closed["sweep"]["state"])
        progress.show(final=True)
        if run.exporter is not None:
            written = await run.exporter.write()
            print(f"sweep {spec.name}: results in {written}", file=sys.stderr)
        print(f"sweep {spec.name}: {state}", file=sys.stderr)
        return SWEEP_EXIT_CODES.get(state, EXIT_ERROR)
