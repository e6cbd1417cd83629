"""``prime-agent run --config F``: run one evaluation config (docs/control.md) to its stop and
write the result record to DuckDB (``eval_results``) and as JSON next to the config.

Like ``-p``, the run goes through the user's daemon, started when none runs (autostart), so
any number of runs share one host. Everything the config chooses travels with its session and
applies to it (and its family) only: the model's endpoint, window, prices, tool protocol and
key (the key's *value* read from this shell's environment, sent in memory only), the backend
and sandbox (image, workspace, memory, CPUs), compaction, refine, retries, the token budget,
the depth limit, autonomous mode and the goal. When the tree is quiet the daemon, which owns
the database, writes the result row (``record_eval_result``) and this process writes the JSON
file. ``--no-daemon`` runs it in this process instead, as before; a running daemon holds the
database then, so that is refused in one line.

The exit code is the stop reason's (docs/control.md); the JSON file and the one summary line on
stdout say the same, whichever way the run went. Ctrl-C aborts the run (the daemon aborts the
whole tree) and writes no result.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, cast

import typer

from orchestrator.cli.common import EXIT_ABORTED, guarded
from orchestrator.cli.print_run import INTERRUPTED_LINE
from orchestrator.errors import UserError

if TYPE_CHECKING:
    from orchestrator.cli.connect import DaemonLink
    from orchestrator.control.eval_config import EvalConfig
    from orchestrator.paths import Paths
    from orchestrator.settings import Settings
    from orchestrator.store.eval_results import EvalResultRow

__all__ = ["eval_run", "session_settings", "stop_of"]

# How a run without an autonomous or goal stop ended, as a stop reason.
PLAIN_STOPS: Final = {"completed": "completed", "aborted": "aborted"}
BACKEND_ENV: Final = "PRIME_AGENT_BACKEND"  # as `prime-agent -p` reads it


def stop_of(outcome_reason: str, stop: Any) -> tuple[str, int]:
    """The stop reason and exit code of a finished run."""
    from orchestrator.control.autonomous import exit_code_for

    if stop is not None:
        return str(stop.reason), int(stop.exit_code)
    reason = PLAIN_STOPS.get(outcome_reason, "model_error")
    return reason, exit_code_for(reason)


def _stop_of_outcome(outcome: dict[str, Any]) -> tuple[str, int]:
    """``stop_of`` for ``wait_quiet``'s answer (the daemon path)."""
    from orchestrator.control.autonomous import exit_code_for

    if outcome.get("exit_code") is not None:
        return str(outcome.get("stop_reason")), int(outcome["exit_code"])
    reason = PLAIN_STOPS.get(str(outcome.get("reason")), "model_error")
    return reason, exit_code_for(reason)


def eval_run(
    config: Annotated[Path, typer.Option("--config", help="The evaluation config (YAML).")],
    no_daemon: Annotated[
        bool,
        typer.Option("--no-daemon", help="Run in this process instead of through the daemon."),
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    raise SystemExit(guarded(lambda: _eval_run(config, no_daemon), debug=debug))


def _eval_run(path: Path, no_daemon: bool) -> int:
    from orchestrator.cli.autostart import daemon_info
    from orchestrator.cli.print_run import daemon_for_run
    from orchestrator.control.eval_config import load_eval_config
    from orchestrator.paths import Paths
    from orchestrator.settings import load_settings

    cfg = load_eval_config(path)
    paths = Paths.from_env()
    settings = cfg.settings(load_settings(paths.config_file))
    backend = _backend(cfg)
    if not no_daemon and daemon_for_run(own_bus=False):
        return _through_daemon(cfg, settings, backend)
    if daemon_info() is not None:
        raise UserError(
            "run --config --no-daemon runs in this process and a running daemon holds the "
            "database: stop it first (prime-agent daemon stop), or leave out --no-daemon"
        )
    try:
        return asyncio.run(_run(cfg, settings, paths, backend))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(INTERRUPTED_LINE, file=sys.stderr)
        return EXIT_ABORTED


def _backend(cfg: EvalConfig) -> str:
    from orchestrator.sandbox.choice import BACKEND_CHOICES

    backend = cfg.backend or os.environ.get(BACKEND_ENV) or "auto"
    if backend not in BACKEND_CHOICES:
        raise UserError(f"{BACKEND_ENV}={backend!r}: use one of {', '.join(BACKEND_CHOICES)}")
    return backend


def session_settings(cfg: EvalConfig) -> dict[str, Any] | None:
    """What ``cfg`` chooses over the daemon's ``config.toml`` that the endpoint and the sandbox
    image and workspace do not carry: ``CreateSession.settings`` (``SessionSettings``)."""
    chosen: dict[str, Any] = {}
    model = cfg.model.session_choice()
    if model:
        chosen["model"] = model
    if cfg.sandbox is not None:
        chosen["memory_mib"] = cfg.sandbox.memory_mib
        chosen["cpus"] = cfg.sandbox.cpus
    if cfg.compaction is not None:
        chosen["compaction"] = cfg.compaction.model_dump(exclude_none=True) or None
    chosen.update(cfg.run_limits())
    chosen = {k: v for k, v in chosen.items() if v is not None}
    return chosen or None


def _summary(cfg: EvalConfig, row: EvalResultRow) -> str:
    cost = "unknown" if not row.cost_known else f"${row.cost_usd or 0:.4f}"
    return (
        f"{cfg.run_name}: {row.stop_reason} (exit {row.exit_code}) in {row.wall_s:.1f} s, "
        f"{row.tokens_input + row.tokens_output} tokens, {cost}, "
        f"{row.sessions} session(s); result {cfg.output_path}"
    )


def _through_daemon(cfg: EvalConfig, settings: Settings, backend: str) -> int:
    from orchestrator.cli.interrupts import run_interruptible
    from orchestrator.cli.via_daemon import run_via_daemon
    from orchestrator.models.registry import client_env_names
    from orchestrator.store.eval_results import EvalResultRow, write_result_json
    from orchestrator.store.queries import utcnow

    # This shell's key (the config's api_key_env, or the provider's variable) and
    # OPENAI_BASE_URL go with the session, in the daemon's memory only.
    client_env = {
        name: os.environ[name]
        for name in client_env_names(cfg.model.name, settings)
        if os.environ.get(name)
    }
    sandbox: dict[str, Any] = {"client_env": client_env}
    if cfg.sandbox is not None:
        sandbox["image"] = cfg.sandbox.image
        sandbox["workspace"] = cfg.sandbox.workspace
    autonomous = None
    if cfg.autonomous is not None:
        autonomous = cfg.autonomous.model_dump(exclude_none=True)
    goal = cfg.goal.model_dump(exclude_none=True) if cfg.goal is not None else None
    refine = cfg.refine.enabled if cfg.refine is not None else None
    started = utcnow()

    async def finish(link: DaemonLink, session: str, outcome: dict[str, Any]) -> int:
        finished = utcnow()
        reason, code = _stop_of_outcome(outcome)
        answer = await link.mutate(
            "record_eval_result",
            session=session,
            config=cfg.record(),
            config_path=None if cfg.source is None else str(cfg.source),
            stop_reason=reason,
            exit_code=code,
            started_at=started.isoformat(),
            finished_at=finished.isoformat(),
        )
        row = EvalResultRow.from_wire(answer["result"])
        write_result_json(row, cfg.output_path)
        print(_summary(cfg, row))
        return code

    code = run_interruptible(
        lambda abort: run_via_daemon(
            text=cfg.prompt,
            model=cfg.model.name,
            api_base=cfg.model.api_base,
            cwd=cfg.workdir,
            backend=backend,
            json_mode=False,
            wait_timeout_s=settings.family_wait_timeout_s,
            refine=refine,
            autonomous=autonomous,
            goal=goal,
            sandbox={k: v for k, v in sandbox.items() if v is not None},
            abort=abort,
            name=cfg.run_name,
            settings=session_settings(cfg),
            finish=finish,
        )
    )
    if code == EXIT_ABORTED:
        print(INTERRUPTED_LINE, file=sys.stderr)
    return code


async def _run(cfg: EvalConfig, settings: Settings, paths: Paths, backend: str) -> int:
    from orchestrator.control.autonomous import AutonomousPolicy
    from orchestrator.models.registry import resolve_model
    from orchestrator.sandbox.choice import BackendRequest
    from orchestrator.sessions.runner import RunOptions, run_session
    from orchestrator.store.db import Store
    from orchestrator.store.eval_results import build_result, save_result
    from orchestrator.store.queries import utcnow

    model = resolve_model(cfg.model.name, settings, api_base=cfg.model.api_base)
    policy = None
    if cfg.autonomous is not None:
        policy = AutonomousPolicy.model_validate(cfg.autonomous.model_dump(exclude_none=True))
    goal = (cfg.goal.objective, cfg.goal.token_budget) if cfg.goal is not None else None
    started = utcnow()
    result = await run_session(
        RunOptions(
            task=cfg.prompt,
            cwd=cfg.workdir,
            backend=cast(BackendRequest, backend),
            name=cfg.run_name,
            autonomous=policy,
            goal=goal,
        ),
        model,
        settings,
        paths,
    )
    finished = utcnow()
    reason, code = stop_of(result.outcome.reason, result.stop)
    async with await Store.open(paths.database_file) as store:
        events = await store.events(result.session_id)
        gates = [e.payload for e in events if e.type == "gate_result"]
        row = await build_result(
            store,
            config=cfg,
            config_path=cfg.source,
            root_session_id=result.session_id,
            stop_reason=reason,
            exit_code=code,
            gates=gates,
            started_at=started,
            finished_at=finished,
        )
        await save_result(store, row, cfg.output_path)
    print(_summary(cfg, row))
    return code
