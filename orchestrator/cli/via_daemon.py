"""Print and JSON mode through the daemon (issue 5): same output, same exit codes.

The daemon owns the database while it runs, so a print-mode run goes through it: create the
session with its task, attach with ``family`` (replaying anything already recorded, and
receiving every descendant's events as the in-process JSON mode does), stream events, and ask
the daemon to answer when the whole tree is quiet; ``release`` then records ``run_end`` and
unloads the tree (sandboxes stop, the session stays on disk and reloads on demand).

SIGINT or SIGTERM (``cli/interrupts.py`` sets ``abort``) sends ``abort``, which the daemon
cascades to the session's subagents, and waits (``ABORT_SETTLE_S``) for the tree's quiet point,
so ``run_end`` is recorded and the tree released as after any run. A lost connection (the daemon
was killed or restarted) is not the end: the client waits for a daemon to answer again
(``RECONNECT_TIMEOUT_S``), follows the session again from the cursors it had printed and waits
for the turn the new daemon resumes.

``--resume ID|NAME`` / ``--continue`` with a task run it as a follow-up on an existing session
the same way: attach from the session's current cursor (only this run's events are printed),
``prompt``, wait for quiet. The session is released afterwards only if this run loaded it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

from orchestrator.cli.common import (
    EXIT_ABORTED,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    budget_spent,
    stopped_run,
    stuck_run,
)
from orchestrator.cli.connect import DaemonLink
from orchestrator.cli.follow import Follower
from orchestrator.cli.progress import JsonLinesSink, ProgressSink
from orchestrator.errors import UserError

__all__ = ["Finish", "continue_via_daemon", "latest_root", "run_via_daemon"]

CREATE_TIMEOUT_S: Final = 120.0  # the daemon may start the embedded model for this session
# After a signal: how long the aborted tree has to go quiet (run_end, release) before we exit.
ABORT_SETTLE_S: Final = 30.0
# A daemon that went away mid-run (killed, restarted): how long to wait for one to answer,
# and how often to try.
RECONNECT_TIMEOUT_S: Final = 120.0
RECONNECT_POLL_S: Final = 0.25
# JSON mode's first line names the session format version (pi / Prime Agent session files).
SESSION_FORMAT_VERSION: Final = 3
# Sessions that cannot be continued, whatever their age.
_NOT_CONTINUABLE: Final = frozenset({"deleted"})


Finish = Callable[[DaemonLink, str, dict[str, Any]], Awaitable[int]]
"""What a run does with the root's outcome instead of printing it (``run --config`` records
its result): called with the link, the root session's id and ``wait_quiet``'s answer, while
the link is still open; its return value is the exit code."""


def _sink(json_mode: bool, progress: bool = True) -> JsonLinesSink | ProgressSink | None:
    if json_mode:
        return JsonLinesSink()
    return ProgressSink() if progress and sys.stderr.isatty() else None


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
    sandbox: dict[str, Any] | None = None,
    abort: asyncio.Event | None = None,
    name: str | None = None,
    settings: dict[str, Any] | None = None,
    finish: Finish | None = None,
) -> int:
    """``sandbox``: the run's ``image``, ``workspace``, ``network`` and ``client_env`` (each
    optional; ``CreateSession`` fields). ``settings``: what the run chose over the daemon's
    config (``SessionSettings``: an eval config's). ``finish``: what to do with the outcome
    instead of printing it; without it, the output and exit codes are print mode's."""
    from orchestrator.api.errors import ApiCommandError

    async with DaemonLink() as link:
        try:
            created: dict[str, Any] = await link.client.request(
                link.client.command(
                    "create_session",
                    cwd=str(cwd),
                    task=text,
                    model=model,
                    api_base=api_base,
                    backend=None if backend == "auto" else backend,
                    refine=refine,
                    autonomous=autonomous,
                    goal=goal,
                    name=name,
                    settings=settings,
                    **(sandbox or {}),
                ),
                timeout=CREATE_TIMEOUT_S,
            )
        except ApiCommandError as exc:
            print(f"prime-agent: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        if created.get("warning"):  # the local backend: the session is not isolated
            print(f"prime-agent: warning: {created['warning']}", file=sys.stderr)
        if created.get("notice"):  # config.toml changed where only a daemon restart applies it
            print(f"prime-agent: note: {created['notice']}", file=sys.stderr)
        return await _run(
            link,
            str(created["session"]),
            cwd=str(cwd),
            json_mode=json_mode,
            wait_timeout_s=wait_timeout_s,
            release=True,
            abort=abort,
            finish=finish,
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
    abort: asyncio.Event | None = None,
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
            abort=abort,
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
    abort: asyncio.Event | None = None,
    finish: Finish | None = None,
) -> int:
    from orchestrator.api.errors import ApiCommandError, ConnectionClosed

    sink = _sink(json_mode, progress=finish is None)  # a recorded run shows only its summary

    def emit(event: dict[str, Any]) -> None:
        if sink is not None:
            sink(event)

    try:
        if isinstance(sink, JsonLinesSink):
            sink({"type": "session", "version": SESSION_FORMAT_VERSION, "id": session, "cwd": cwd})
        follower = Follower(link.client, emit)
        # A new session replays its (new) descendants; a resumed one skips their old history.
        await follower.attach(session, cursor, family=True, history=follow_up is None)
        if follow_up is not None:
            try:
                await link.mutate("prompt", session=session, text=follow_up, mode="follow_up")
            except UserError as exc:
                print(f"prime-agent: error: {exc}", file=sys.stderr)
                return EXIT_USAGE
        while True:
            try:
                outcome = await follower.follow_until(
                    _quiet_or_abort(link, session, wait_timeout_s, release, abort)
                )
                break
            except ConnectionClosed:
                if abort is not None and abort.is_set():
                    return EXIT_ABORTED
                # The daemon died (or was restarted): it continues an interrupted turn when it
                # starts again, so wait for it, follow the session again and wait again.
                if not await _reconnect(link, follower, session, abort):
                    return EXIT_ABORTED
    except ApiCommandError as exc:
        print(f"prime-agent: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if abort is not None and abort.is_set():
        return EXIT_ABORTED
    if finish is not None:
        return await finish(link, session, outcome)
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
    if outcome.get("reason") == "budget_exceeded":
        return budget_spent(str(outcome.get("final_text", "")))
    if outcome.get("error"):
        print(f"prime-agent: error: {outcome['error']}", file=sys.stderr)
        return EXIT_USAGE if outcome.get("user_error") else EXIT_ERROR
    if outcome.get("reason") == "stuck":
        return stuck_run(str(outcome.get("final_text") or ""))
    print(f"prime-agent: the run ended: {outcome.get('reason')}", file=sys.stderr)
    return EXIT_ERROR if outcome.get("reason") != "aborted" else EXIT_ABORTED


async def _quiet_or_abort(
    link: DaemonLink,
    session: str,
    wait_timeout_s: float,
    release: bool,
    abort: asyncio.Event | None,
) -> dict[str, Any]:
    """``wait_quiet``'s answer; when ``abort`` is set first, ``abort`` the session (the daemon
    aborts its descendants' turns too) and give the tree ``ABORT_SETTLE_S`` to go quiet, so
    that ``run_end`` is recorded and the tree released as after any run."""
    from orchestrator.api.errors import ConnectionClosed
    from orchestrator.errors import ApiError

    client = link.client
    waiting = asyncio.ensure_future(
        client.request(
            client.command(
                "wait_quiet",
                session=session,
                timeout_s=wait_timeout_s,
                release=release,
            ),
            timeout=wait_timeout_s + CREATE_TIMEOUT_S,
        )
    )
    if abort is None:
        return dict(await waiting)
    stop = asyncio.ensure_future(abort.wait())
    try:
        await asyncio.wait({waiting, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not waiting.done() and not abort.is_set():
            waiting.cancel()  # we were cancelled ourselves
    if waiting.done():
        return dict(waiting.result())
    try:
        # One try, not ``mutate``: its resend could start a daemon just to abort in it.
        await link.call("abort", session=session)
        async with asyncio.timeout(ABORT_SETTLE_S):
            await waiting
    except (TimeoutError, ConnectionClosed, ApiError, UserError) as exc:
        print(f"prime-agent: the abort did not settle: {exc}", file=sys.stderr)
    finally:
        if not waiting.done():
            waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
    return {"reason": "aborted"}


async def _reconnect(
    link: DaemonLink, follower: Follower, session: str, abort: asyncio.Event | None
) -> bool:
    """Wait (``RECONNECT_TIMEOUT_S`` at most) for a daemon to answer again, then follow the
    session's family again from the cursors already printed (nothing twice, nothing lost).
    False when a signal came meanwhile; ``UserError`` when no daemon came back."""
    from orchestrator.api.errors import ConnectionClosed
    from orchestrator.errors import ApiError

    print("prime-agent: lost the daemon; waiting for it to come back", file=sys.stderr)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RECONNECT_TIMEOUT_S
    while True:
        if abort is not None and abort.is_set():
            return False
        try:
            await link.reconnect()
            await follower.reattach(link.client, session)
            return True
        except (ApiError, ConnectionClosed, UserError, OSError) as exc:
            if loop.time() >= deadline:
                raise UserError(
                    f"the daemon did not come back within {RECONNECT_TIMEOUT_S:.0f} s ({exc}); "
                    f"the session is kept: prime-agent --resume {session}"
                ) from None
        if abort is None:
            await asyncio.sleep(RECONNECT_POLL_S)
        else:  # a signal while we wait ends the wait
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RECONNECT_POLL_S):
                    await abort.wait()
