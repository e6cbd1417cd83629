"""``prime-agent run --config F``: run one evaluation config (docs/control.md) to its stop and
write the result record to DuckDB (``eval_results``) and as JSON next to the config.

The run happens in this process (like ``-p --no-daemon``): an evaluation owns its run from
start to stop, and the result row is written to the same database file right after. A running
daemon holds that file, so it is refused in one line (stop the daemon, or wait for it). The
exit code is the stop reason's (docs/control.md); the JSON file and the one summary line on
stdout say the same.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated, Any, Final, cast

import typer

from orchestrator.cli.common import EXIT_ABORTED, guarded
from orchestrator.errors import UserError

__all__ = ["eval_run", "stop_of"]

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


def eval_run(
    config: Annotated[Path, typer.Option("--config", help="The evaluation config (YAML).")],
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    raise SystemExit(guarded(lambda: _eval_run(config), debug=debug))


def _eval_run(path: Path) -> int:
    from orchestrator.cli.autostart import daemon_info
    from orchestrator.control.eval_config import load_eval_config
    from orchestrator.paths import Paths
    from orchestrator.settings import load_settings

    cfg = load_eval_config(path)
    paths = Paths.from_env()
    settings = cfg.settings(load_settings(paths.config_file))
    if daemon_info() is not None:
        raise UserError(
            "run --config runs in this process and a running daemon holds the database: "
            "stop it first (prime-agent daemon stop)"
        )
    try:
        return asyncio.run(_run(cfg, settings, paths))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("prime-agent: interrupted; the session history is kept", file=sys.stderr)
        return EXIT_ABORTED


async def _run(cfg: Any, settings: Any, paths: Any) -> int:
    import os

    from orchestrator.control.autonomous import AutonomousPolicy
    from orchestrator.models.registry import resolve_model
    from orchestrator.sandbox.choice import BACKEND_CHOICES, BackendRequest
    from orchestrator.sessions.runner import RunOptions, run_session
    from orchestrator.store.db import Store
    from orchestrator.store.eval_results import build_result, save_result
    from orchestrator.store.queries import utcnow

    model = resolve_model(cfg.model.name, settings, api_base=cfg.model.api_base)
    policy = None
    if cfg.autonomous is not None:
        policy = AutonomousPolicy.model_validate(cfg.autonomous.model_dump(exclude_none=True))
    goal = (cfg.goal.objective, cfg.goal.token_budget) if cfg.goal is not None else None
    backend = cfg.backend or os.environ.get(BACKEND_ENV) or "auto"
    if backend not in BACKEND_CHOICES:
        raise UserError(f"{BACKEND_ENV}={backend!r}: use one of {', '.join(BACKEND_CHOICES)}")
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
    cost = "unknown" if not row.cost_known else f"${row.cost_usd or 0:.4f}"
    print(
        f"{cfg.run_name}: {reason} (exit {code}) in {row.wall_s:.1f} s, "
        f"{row.tokens_input + row.tokens_output} tokens, {cost}, "
        f"{row.sessions} session(s); result {cfg.output_path}"
    )
    return code
