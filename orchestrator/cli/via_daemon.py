"""Print and JSON mode through the daemon (issue 5): same output, same exit codes.

The daemon owns the database while it runs, so a print-mode run goes through it: create the
session with its task, attach with ``family`` (replaying anything already recorded, and
receiving every descendant's events as the in-process JSON mode does), stream events, and ask
the daemon to answer when the whole tree is quiet; ``release`` then records ``run_end`` and
unloads the tree (sandboxes stop, the session stays on disk and reloads on demand). Ctrl-C
aborts the running turn.

``--resume ID|NAME`` / ``--continue`` with a task run it as a follow-up on an existing session
the same way: attach from the session's current cursor (only this run's events are printed),
``prompt``, wait for quiet. The session is released afterwards only if this run loaded it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any, Final

from orchestrator.cli.common import EXIT_ABORTED, EXIT_ERROR, EXIT_OK, EXIT_USAGE, stopped_run
from orchestrator.cli.connect import DaemonLink
from orchestrator.cli.follow import Follower
from orchestrator.cli.progress import JsonLinesSink, ProgressSink
from orchestrator.errors import UserError

__all__ = ["continue_via_daemon", "latest_root", "run_via_daemon"]

CREATE_TIMEOUT_S: Final = 120.0  # the daemon may start the embedded model for this session
# JSON mode's first line names the session format version (pi / Prime Agent session files).
SESSION_FORMAT_VERSION: Final = 3
# Sessions that cannot be continued, whatever their age.
_NOT_CONTINUABLE: Final = frozenset({"deleted"})


def _sink(json_mode: bool) -> JsonLinesSink | ProgressSink | None:
    if json_mode:
        return JsonLinesSink()
    return ProgressSink() if sys.stderr.isatty() else None


async def run_via_daemon(
    *,
    text: str,
    model: str | None,
    api_base: str | None,
    cwd: Path,
    backend: str,
    json_mode: bool,
    wait_timeout_s: float,
    refine: bool | None = None,
    autonomous: dict[str, Any] | None = None,
    goal: dict[str, Any] | None = None,
) -> int:
    from orchestrator.api.errors import ApiCommandError
    from orchestrator.api.protocol import CreateSession

    async with DaemonLink() as link:
        try:
            created: dict[str, Any] = await link.client.request(
                CreateSession(
                    command_id=link.client.new_command_id(),
                    cwd=str(cwd),
                    task=text,
                    model=model,
                    api_base=api_base,
                    backend=None if backend == "auto" else backend,
                    refine=refine,
                    autonomous=autonomous,
                    goal=goal,
                ),
                timeout=CREATE_TIMEOUT_S,
            )
        except ApiCommandError as exc:
            print(f"prime-agent: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        if created.get("warning"):  # auto without docker: the session is not isolated
            print(f"prime-agent: warning: {created['warning']}", file=sys.stderr)
        return await _run(
            link,
            str(created["session"]),
            cwd=str(cwd),
            json_mode=json_mode,
            wait_timeout_s=wait_timeout_s,
            release=True,
        )


async def continue_via_daemon(
    *,
    selector: str | None,
    text: str,
    cwd: Path,
    json_mode: bool,
    wait_timeout_s: float,
    model: str | None = None,
    api_base: str | None = None,
) -> int:
    """``--resume SELECTOR`` (or ``--continue``: ``selector`` None) with a task; with
    ``model``/``api_base`` the session switches to them first (an explicit, recorded switch)."""
    async with DaemonLink() as link:
        sid = selector or await latest_root(link, cwd)
        found: dict[str, Any] = await link.call("get_session", session=sid, recent=1)
        row = found["session"]
        was_live = bool(row.get("live"))  # a switch loads it: release what this run woke
        if model is not None or api_base is not None:
            fields: dict[str, Any] = {"session": str(row["id"]), "model": model or row["model"]}
            if api_base is not None:
                fields["api_base"] = api_base
            try:
                switched = await link.mutate("set_model", **fields)
            except UserError as exc:
                print(f"prime-agent: error: {exc}", file=sys.stderr)
                return EXIT_USAGE
            where = switched.get("api_base") or "its provider's endpoint"
            print(f"prime-agent: switched to {switched['model']} at {where}", file=sys.stderr)
            found = await link.call("get_session", session=str(row["id"]), recent=1)
            row = found["session"]
        return await _run(
            link,
            str(row["id"]),
            cwd=str(row.get("cwd") or cwd),
            json_mode=json_mode,
            wait_timeout_s=wait_timeout_s,
            # Unload afterwards only what this run woke: another client may be using it.
            release=not was_live,
            cursor=int(found.get("cursor") or 0),
            follow_up=text,
        )


async def latest_root(link: DaemonLink, cwd: Path) -> str:
    """The id of the most recently active root session started in ``cwd`` (``--continue``)."""
    listing = await link.call("list_sessions", roots_only=True, cwd=str(cwd))
    roots = [s for s in listing.get("sessions") or [] if s.get("status") not in _NOT_CONTINUABLE]
    if not roots:
        raise UserError(f'no session to continue in {cwd}; start one with prime-agent -p "task"')
    newest = max(roots, key=lambda s: (str(s.get("updated_at")), str(s.get("created_at"))))
    return str(newest["id"])


async def _run(
    link: DaemonLink,
    session: str,
    *,
    cwd: str,
    json_mode: bool,
    wait_timeout_s: float,
    release: bool,
    cursor: int = 0,
    follow_up: str | None = None,
) -> int:
    from orchestrator.api.errors import ApiCommandError
    from orchestrator.api.protocol import WaitQuiet

    client = link.client
    sink = _sink(json_mode)

    def emit(event: dict[str, Any]) -> None:
        if sink is not None:
            sink(event)

    try:
        if isinstance(sink, JsonLinesSink):
            sink({"type": "session", "version": SESSION_FORMAT_VERSION, "id": session, "cwd": cwd})
        follower = Follower(client, emit)
        # A new session replays its (new) descendants; a resumed one skips their old history.
        await follower.attach(session, cursor, family=True, history=follow_up is None)
        if follow_up is not None:
            try:
                await link.mutate("prompt", session=session, text=follow_up, mode="follow_up")
            except UserError as exc:
                print(f"prime-agent: error: {exc}", file=sys.stderr)
                return EXIT_USAGE
        outcome: dict[str, Any] = await follower.follow_until(
            client.request(
                WaitQuiet(
                    command_id=client.new_command_id(),
                    session=session,
                    timeout_s=wait_timeout_s,
                    release=release,
                ),
                timeout=wait_timeout_s + CREATE_TIMEOUT_S,
            )
        )
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await client.call("abort", session=session)
        raise
    except ApiCommandError as exc:
        print(f"prime-agent: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if outcome.get("exit_code") is not None:  # an autonomous or goal run stopped
        return stopped_run(
            str(outcome.get("stop_reason")),
            str(outcome.get("stop_detail") or ""),
            int(outcome["exit_code"]),
            str(outcome.get("final_text", "")),
            json_mode,
        )
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
