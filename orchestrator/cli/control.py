"""``schedule``, ``heartbeat`` and ``goal``: long-horizon controls from the shell, through the
daemon (docs/control.md, docs/schedules.md). Each needs the daemon (and starts it when
autostart is on): the scheduler that delivers ticks lives there.

- ``schedule add SESSION SPEC PROMPT [--label L] [--steer]``: ``SPEC`` is ``in 10m``,
  ``every 30s`` (at least 10 s), ``at 2026-12-01T09:00+01:00`` or 5 cron fields; prints the
  schedule's line. ``schedule list [SESSION] [--all]``; ``schedule cancel ID``.
- ``heartbeat SESSION [every 10m TEXT | status | pause | resume | stop]``: ``/heartbeat``.
- ``goal SESSION [OBJECTIVE] [--budget N]``: set a goal (``/goal``); ``goal SESSION status |
  pause | resume | clear``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Final

import typer

from orchestrator.cli.harness import Debug, Json, _run

__all__ = ["goal", "heartbeat", "schedule_app"]

GOAL_ACTIONS: Final = ("status", "pause", "resume", "clear")

schedule_app = typer.Typer(
    help="Prompts delivered to a session later or repeatedly (in/every/at/cron).",
    no_args_is_help=True,
)


@schedule_app.command("add")
def add(
    session: Annotated[str, typer.Argument(help="Session id, unique id prefix or name.")],
    spec: Annotated[str, typer.Argument(help="in 10m | every 30s | at ISO-TIME | 'M H D M W'")],
    prompt: Annotated[str, typer.Argument(help="What the session is told at each tick.")],
    label: Annotated[str | None, typer.Option("--label")] = None,
    steer: Annotated[
        bool, typer.Option("--steer", help="Into a running turn (default: after it).")
    ] = False,
    debug: Debug = False,
) -> None:
    fields: dict[str, Any] = {
        "session": session,
        "spec": spec,
        "prompt": prompt,
        "delivery": "steer" if steer else "follow_up",
    }
    if label:
        fields["label"] = label
    result = _run("schedule add", lambda link: link.mutate("schedule_add", **fields), debug)
    typer.echo(result["line"])


@schedule_app.command("list")
def list_schedules(
    session: Annotated[str | None, typer.Argument(help="Only this session's.")] = None,
    include_inactive: Annotated[
        bool, typer.Option("--all", help="Also completed and cancelled ones.")
    ] = False,
    as_json: Json = False,
    debug: Debug = False,
) -> None:
    fields: dict[str, Any] = {"include_inactive": include_inactive}
    if session:
        fields["session"] = session
    result = _run("schedule list", lambda link: link.call("schedule_list", **fields), debug)
    if as_json:
        typer.echo(json.dumps(result["schedules"], indent=2))
        return
    for line in result["lines"] or ["no schedules"]:
        typer.echo(line)


@schedule_app.command("cancel")
def cancel(
    schedule_id: Annotated[str, typer.Argument(metavar="ID", help="Schedule id or prefix.")],
    debug: Debug = False,
) -> None:
    result = _run(
        "schedule cancel", lambda link: link.mutate("schedule_cancel", id=schedule_id), debug
    )
    typer.echo(result["line"])


def heartbeat(
    session: Annotated[str, typer.Argument(help="Session id, unique id prefix or name.")],
    text: Annotated[
        list[str] | None, typer.Argument(help="every 10m TEXT | status | pause | resume | stop")
    ] = None,
    debug: Debug = False,
) -> None:
    line = " ".join(text or [])
    result = _run(
        "heartbeat", lambda link: link.mutate("heartbeat", session=session, text=line), debug
    )
    typer.echo(result["message"])


def goal(
    session: Annotated[str, typer.Argument(help="Session id, unique id prefix or name.")],
    objective: Annotated[
        list[str] | None, typer.Argument(help="The objective; or status|pause|resume|clear.")
    ] = None,
    budget: Annotated[int | None, typer.Option("--budget", min=1, help="Token budget.")] = None,
    debug: Debug = False,
) -> None:
    words = objective or []
    fields: dict[str, Any] = {"session": session}
    if len(words) == 1 and words[0] in GOAL_ACTIONS:
        fields["action"] = words[0]
    elif words:
        fields.update(action="set", objective=" ".join(words))
        if budget is not None:
            fields["token_budget"] = budget
    result = _run("goal", lambda link: link.mutate("goal", **fields), debug)
    row = result.get("goal")
    if row is None:
        typer.echo(f"{result['session']}: no goal")
        return
    used = f"{row.get('tokens_used', 0)}"
    if row.get("token_budget"):
        used += f"/{row['token_budget']}"
    typer.echo(f"{row['id']} {row['status']} ({used} tokens): {row['objective']}")
