"""``attach``, ``send`` and ``observe``: a running session, through the daemon.

- ``attach ID|NAME`` prints the session's events (what it missed first, then live ones) until
  Ctrl-C, which detaches: the session keeps running in the daemon. ``--json`` prints each event
  as a JSON line (the shape JSON mode uses); ``--cursor N`` starts after event N.
- ``send ID|NAME MESSAGE`` queues a user message: an idle session starts a turn (``delivered``),
  a running one takes it after its turn (``queued``), or at its next model call with ``--steer``.
- ``observe ID|NAME`` shows the session's state, usage and newest events, and returns.

Each accepts an id, a unique id prefix or a name (the daemon resolves it). Each needs the daemon
and starts it when autostart is on (``orchestrator/cli/connect.py``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Annotated, Any, Final

import typer

from orchestrator.api.protocol import RECENT_EVENTS_MAX
from orchestrator.cli.common import EXIT_ERROR, EXIT_OK, guarded
from orchestrator.cli.connect import DaemonLink, require_daemon
from orchestrator.cli.follow import Follower
from orchestrator.cli.progress import JsonLinesSink
from orchestrator.cli.render import EventPrinter

__all__ = ["OBSERVE_DEFAULT_EVENTS", "attach", "attach_session", "observe", "send"]

# `observe` shows this many of the newest events unless --last says otherwise.
OBSERVE_DEFAULT_EVENTS: Final = 12


def attach(
    session: Annotated[str, typer.Argument(help="Session id, unique id prefix or name.")],
    as_json: Annotated[bool, typer.Option("--json", help="Events as JSON lines.")] = False,
    cursor: Annotated[
        int, typer.Option("--cursor", min=0, help="Start after this event (0: from the start).")
    ] = 0,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    raise SystemExit(
        guarded(lambda: attach_session(session, cursor=cursor, as_json=as_json), debug=debug)
    )


def attach_session(selector: str, *, cursor: int = 0, as_json: bool = False) -> int:
    """Follow ``selector``'s events until Ctrl-C (exit 0: detached) or the daemon goes."""
    require_daemon("attach")
    # Ctrl-C is how one detaches, even when the parent started us with SIGINT ignored (a
    # process inherits an ignored signal through exec; Python then leaves it ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    attached: list[str] = []
    try:
        return asyncio.run(_attach(selector, cursor, as_json, attached))
    except (KeyboardInterrupt, asyncio.CancelledError):
        which = attached[0] if attached else selector
        print(f"prime-agent: detached from {which}; it keeps running", file=sys.stderr)
        return EXIT_OK


async def _attach(selector: str, cursor: int, as_json: bool, attached: list[str]) -> int:
    task = asyncio.current_task()
    assert task is not None
    # SIGTERM detaches like Ctrl-C (closing the connection is what detaches).
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    async with DaemonLink() as link:
        row: dict[str, Any] = (await link.call("get_session", session=selector))["session"]
        sid = str(row["id"])
        attached.append(sid)
        printer = EventPrinter()
        emit = JsonLinesSink() if as_json else printer
        if not as_json:
            name = row.get("name") or "unnamed"
            print(f"prime-agent: attached to {sid} ({name}); Ctrl-C detaches", file=sys.stderr)
        follower = Follower(link.client, emit, on_gap=None if as_json else printer.gap)
        await follower.attach(sid, cursor)
        async for item in link.client.events():
            await follower.handle(item)
    print("prime-agent: error: the daemon closed the connection", file=sys.stderr)
    return EXIT_ERROR


def send(
    session: Annotated[str, typer.Argument(help="Session id, unique id prefix or name.")],
    message: Annotated[str, typer.Argument(help="The message (a user turn).")],
    steer: Annotated[
        bool,
        typer.Option("--steer", help="Into the running turn, at its next model call."),
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    def run() -> dict[str, Any]:
        require_daemon("send")
        return asyncio.run(_send(session, message, steer))

    result = guarded(run, debug=debug)
    typer.echo(f"{result.get('status')} (session {result.get('session')})")


async def _send(selector: str, message: str, steer: bool) -> dict[str, Any]:
    async with DaemonLink() as link:
        mode = "steer" if steer else "follow_up"
        result: dict[str, Any] = await link.mutate(
            "prompt", session=selector, text=message, mode=mode
        )
        return result


def observe(
    session: Annotated[str, typer.Argument(help="Session id, unique id prefix or name.")],
    last: Annotated[
        int, typer.Option("--last", min=1, max=RECENT_EVENTS_MAX, help="How many newest events.")
    ] = OBSERVE_DEFAULT_EVENTS,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    def run() -> dict[str, Any]:
        require_daemon("observe")
        return asyncio.run(_observe(session, last))

    view = guarded(run, debug=debug)
    if as_json:
        typer.echo(json.dumps(view, ensure_ascii=False, default=str))
        return
    for line in _describe(view):
        typer.echo(line)
    printer = EventPrinter()
    for event in view["events"]:
        printer(event)


async def _observe(selector: str, last: int) -> dict[str, Any]:
    async with DaemonLink() as link:
        found: dict[str, Any] = await link.call("get_session", session=selector, recent=last)
        row = found["session"]
        usage = await link.call("get_usage", session=row["id"])
    nodes = usage.get("usage") or []
    return {
        "session": row,
        "usage": nodes[0] if nodes else None,
        "cursor": found.get("cursor", 0),
        "events": found.get("events") or [],
    }


def _describe(view: dict[str, Any]) -> list[str]:
    from orchestrator.cli.usage import totals_text

    row = view["session"]
    head = f"{row['id']}  {row.get('name') or '(unnamed)'}  [{row.get('status')}]"
    lines = [
        f"{head}  model {row.get('model')}  backend {row.get('backend')}  depth {row.get('depth')}",
        f"cwd {row.get('cwd')}" + (f"  parent {row['parent_id']}" if row.get("parent_id") else ""),
    ]
    node = view.get("usage")
    if node:
        lines.append(
            f"usage: own {totals_text(node['own'])}; with subagents {totals_text(node['total'])}"
        )
    if row.get("live"):
        lines.append(f"loaded: turns {row.get('turns', 0)}, pending inputs {row.get('pending', 0)}")
    lines.append(f"-- newest {len(view['events'])} events (cursor {view.get('cursor', 0)}) --")
    return lines
