"""Print and JSON mode through a running daemon (issue 5): same output, same exit codes.

The daemon owns the database while it runs, so a print-mode run goes through it: create the
session with its task, attach (replaying anything already recorded), stream events, and ask the
daemon to answer when the whole tree is quiet; ``release`` then unloads the tree (sandboxes
stop, the session stays on disk and reloads on demand). Ctrl-C aborts the running turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any

from orchestrator.cli.common import EXIT_ABORTED, EXIT_ERROR, EXIT_OK, EXIT_USAGE
from orchestrator.cli.progress import JsonLinesSink, ProgressSink

__all__ = ["run_via_daemon"]

CREATE_TIMEOUT_S = 120.0  # the daemon may start the embedded model for this session


async def run_via_daemon(
    *,
    text: str,
    model: str | None,
    api_base: str | None,
    cwd: Path,
    backend: str,
    json_mode: bool,
    wait_timeout_s: float,
) -> int:
    from orchestrator.api.client import ControlClient
    from orchestrator.api.errors import ApiCommandError
    from orchestrator.api.protocol import CreateSession, Event, WaitQuiet

    sink: JsonLinesSink | ProgressSink | None = None
    if json_mode:
        sink = JsonLinesSink()
    elif sys.stderr.isatty():
        sink = ProgressSink()
    client = await ControlClient.connect()
    session = ""
    try:
        try:
            created: dict[str, Any] = await client.request(
                CreateSession(
                    command_id=client.new_command_id(),
                    cwd=str(cwd),
                    task=text,
                    model=model,
                    api_base=api_base,
                    backend=None if backend == "auto" else backend,
                ),
                timeout=CREATE_TIMEOUT_S,
            )
        except ApiCommandError as exc:
            print(f"prime-agent: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        session = str(created["session"])
        if isinstance(sink, JsonLinesSink):
            sink({"type": "session", "version": 3, "id": session, "cwd": str(cwd)})
        replay = await client.call("attach", session=session, cursor=0)
        seen = 0
        for event in replay.get("events", []):
            seen = max(seen, int(event.get("seq", 0)))
            if sink is not None:
                sink(event)

        async def stream() -> None:
            nonlocal seen
            async for item in client.events():
                # A Resync (this client fell behind) carries no event; the replay on attach
                # and the database have everything, and the final answer comes regardless.
                if not isinstance(item, Event) or item.session != session or item.cursor <= seen:
                    continue
                seen = item.cursor
                if sink is not None:
                    sink(item.event)

        streamer = asyncio.create_task(stream())
        try:
            outcome: dict[str, Any] = await client.request(
                WaitQuiet(
                    command_id=client.new_command_id(),
                    session=session,
                    timeout_s=wait_timeout_s,
                    release=True,
                ),
                timeout=wait_timeout_s + CREATE_TIMEOUT_S,
            )
        finally:
            streamer.cancel()
            with contextlib.suppress(BaseException):
                await streamer
    except asyncio.CancelledError:
        if session:
            with contextlib.suppress(Exception):
                await client.call("abort", session=session)
        raise
    except ApiCommandError as exc:
        print(f"prime-agent: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    if outcome.get("reason") == "completed":
        if not json_mode:
            sys.stdout.write(str(outcome.get("final_text", "")).rstrip("\n") + "\n")
            sys.stdout.flush()
        return EXIT_OK
    if outcome.get("error"):
        print(f"prime-agent: error: {outcome['error']}", file=sys.stderr)
        return EXIT_USAGE if outcome.get("user_error") else EXIT_ERROR
    print(f"prime-agent: the run ended: {outcome.get('reason')}", file=sys.stderr)
    return EXIT_ERROR if outcome.get("reason") != "aborted" else EXIT_ABORTED
