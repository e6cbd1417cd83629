"""The Python SDK: ``from orchestrator import Client`` — drive agents from Python through the
daemon, the way the CLI and the TUI do (docs/sdk.md)::

    async with await Client.connect() as client:       # starts the daemon when none runs
        session = await client.create_session(cwd=".", model="openai/gpt-4o-mini")
        outcome = await session.run("Count the lines of README.md")
        print(outcome.final_text, (await session.usage())["total"]["cost_usd"])

A ``Client`` is one connection to the daemon's control socket; a ``Session`` is a handle on
one session through it: ``prompt`` (or ``steer``), ``wait`` for the tree to go quiet, ``run``
(both), ``events`` (its history, then what happens live, until a turn ends), ``abort``,
``usage`` and ``info``. Errors are the package's own: ``ApiCommandError`` (with ``.code``) for
what the daemon refuses, ``DaemonNotRunning`` when none answers and none may be started.

Events of every session the client follows arrive on one connection; the client hands each to
the queue of the session it belongs to, so two sessions streamed at once each see their own,
in order. The model's key travels the way the CLI's does: the variables resolving the model
may read (its key, ``OPENAI_BASE_URL``), from this process's environment, held by the daemon
for that session's family only and never written anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from orchestrator.api.client import ControlClient
from orchestrator.api.errors import DaemonNotRunning
from orchestrator.api.messages import Event, Resync
from orchestrator.api.wire import WAIT_QUIET_DEFAULT_S

__all__ = ["TURN_END_EVENTS", "Client", "Outcome", "Session"]

# Event types that end ``Session.events`` by default: a turn's end (and a print-mode run's).
TURN_END_EVENTS: Final = frozenset({"turn_end"})
# Slack on top of wait's own bound for the daemon to answer.
_WAIT_SLACK_S: Final = 30.0


@dataclass(frozen=True)
class Outcome:
    """How a session's tree went quiet (``wait_quiet``'s answer)."""

    session: str
    reason: str  # the root's last turn: completed, aborted, error, budget_exceeded, ...
    final_text: str
    error: str | None = None
    error_class: str | None = None
    stop_reason: str | None = None  # an autonomous or goal run's
    exit_code: int | None = None  # the CLI's exit code for that stop

    @classmethod
    def from_answer(cls, answer: Mapping[str, Any]) -> Outcome:
        return cls(
            session=str(answer.get("session") or ""),
            reason=str(answer.get("reason") or "none"),
            final_text=str(answer.get("final_text") or ""),
            error=answer.get("error"),
            error_class=answer.get("error_class"),
            stop_reason=answer.get("stop_reason"),
            exit_code=answer.get("exit_code"),
        )


class Session:
    """One session, through its client's connection."""

    def __init__(self, client: Client, session_id: str):
        self._client = client
        self.id = session_id

    def __repr__(self) -> str:
        return f"Session({self.id!r})"

    async def prompt(self, text: str) -> str:
        """Queue ``text`` as the session's next user turn; the daemon's status
        (``delivered``: it runs now, ``queued``: after the running turn)."""
        answer = await self._client.control.call(
            "prompt", session=self.id, text=text, mode="follow_up"
        )
        return str(answer.get("status") or "")

    async def steer(self, text: str) -> str:
        """Deliver ``text`` into the running turn (at its next step)."""
        answer = await self._client.control.call("prompt", session=self.id, text=text, mode="steer")
        return str(answer.get("status") or "")

    async def wait(self, timeout_s: float = WAIT_QUIET_DEFAULT_S) -> Outcome:
        """Until the session's whole tree is quiet (its subagents included); how it ended."""
        answer = await asyncio.wait_for(
            self._client.control.call("wait_quiet", session=self.id, timeout_s=timeout_s),
            timeout_s + _WAIT_SLACK_S,
        )
        return Outcome.from_answer(answer)

    async def run(self, text: str, *, timeout_s: float = WAIT_QUIET_DEFAULT_S) -> Outcome:
        """``prompt`` then ``wait``."""
        await self.prompt(text)
        return await self.wait(timeout_s)

    async def abort(self) -> bool:
        """Stop the running turn and its subagents' turns; whether one was running."""
        answer = await self._client.control.call("abort", session=self.id)
        return bool(answer.get("aborted"))

    async def usage(self) -> dict[str, Any]:
        """Tokens and cost: ``own`` (this session's calls) and ``total`` (its tree's)."""
        answer = await self._client.control.call("get_usage", session=self.id)
        usage = answer.get("usage")
        row = usage[0] if isinstance(usage, list) and usage else usage
        return dict(row or {})

    async def info(self) -> dict[str, Any]:
        """The session's row: status, model, backend, name, parent, cwd, ..."""
        answer = await self._client.control.call("get_session", session=self.id)
        return dict(answer["session"])

    async def events(
        self, *, cursor: int = 0, until: Collection[str] = TURN_END_EVENTS
    ) -> AsyncIterator[dict[str, Any]]:
        """The session's events after ``cursor`` (0: from the start), then live ones, each
        once and in order, until one whose type is in ``until`` (empty: until the client
        closes). Each is a dict: ``type``, ``seq``, ``payload``, ``ts``, ..."""
        async for event in self._client.follow(self.id, cursor):
            yield event
            if event.get("type") in until:
                return


class Client:
    """A connection to the daemon (``connect``), and the sessions it drives."""

    def __init__(self, control: ControlClient):
        self.control = control  # the protocol client underneath (docs/protocol.md)
        self._queues: dict[str, asyncio.Queue[dict[str, Any] | None]] = {}
        self._cursors: dict[str, int] = {}
        self._pump: asyncio.Task[None] | None = None

    @classmethod
    async def connect(
        cls, socket_path: Path | str | None = None, *, start_daemon: bool = True
    ) -> Client:
        """Connect to the user's daemon (or the one at ``socket_path``), starting it first
        when none runs and ``start_daemon`` (and autostart is not switched off)."""
        if socket_path is None and start_daemon:
            from orchestrator.cli.connect import ensure_daemon

            if not await asyncio.to_thread(ensure_daemon):
                raise DaemonNotRunning(
                    "no daemon is running and autostart is off: prime-agent daemon start"
                )
        return cls(await ControlClient.connect(socket_path))

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
        await self.control.close()
        for queue in self._queues.values():
            queue.put_nowait(None)

    async def create_session(
        self,
        task: str | None = None,
        *,
        cwd: Path | str = ".",
        model: str | None = None,
        api_base: str | None = None,
        backend: str | None = None,
        name: str | None = None,
        image: str | None = None,
        network: bool | None = None,
        settings: Mapping[str, Any] | None = None,
        client_env: Mapping[str, str] | None = None,
    ) -> Session:
        """A new root session (idle, or running ``task``). ``settings``: what it chooses over
        the daemon's config.toml (``SessionSettings``: ``max_turn_steps``, ``system_prompt``,
        ...). ``client_env``: the variables its model reads; default: this process's values
        of those the model's resolution may read."""
        if client_env is None:
            client_env = _model_env(model)
        answer = await self.control.call(
            "create_session",
            cwd=str(Path(cwd).expanduser().resolve()),
            task=task,
            model=model,
            api_base=api_base,
            backend=backend,
            name=name,
            image=image,
            network=network,
            settings=dict(settings) if settings else None,
            client_env=dict(client_env) or None,
        )
        return Session(self, str(answer["session"]))

    async def session(self, selector: str) -> Session:
        """An existing session by id, id prefix, name, or a subagent's ``sub-…`` id."""
        answer = await self.control.call("get_session", session=selector)
        return Session(self, str(answer["session"]["id"]))

    async def sessions(self, *, roots_only: bool = False) -> list[dict[str, Any]]:
        answer = await self.control.call("list_sessions", roots_only=roots_only or None)
        return list(answer.get("sessions") or [])

    async def follow(self, session_id: str, cursor: int) -> AsyncIterator[dict[str, Any]]:
        """``session_id``'s events after ``cursor``: the replay, then live ones."""
        queue = self._queues.setdefault(session_id, asyncio.Queue())
        self._cursors[session_id] = cursor
        attached = await self.control.call("attach", session=session_id, cursor=cursor)
        for event in attached.get("events") or []:
            seq = int(event.get("seq") or 0)
            if seq > self._cursors[session_id]:
                self._cursors[session_id] = seq
                yield event
        if self._pump is None:
            self._pump = asyncio.create_task(self._route())
        try:
            while (event := await queue.get()) is not None:
                yield event
        finally:
            self._queues.pop(session_id, None)
            with contextlib.suppress(Exception):
                await self.control.call("detach", session=session_id)

    async def _route(self) -> None:
        """Every pushed event to the queue of its session, once (cursors dedupe a replay
        that overlaps the live stream); a resync re-attaches from the last cursor seen."""
        async for item in self.control.events():
            if isinstance(item, Resync):
                if item.session in self._queues:
                    again = await self.control.call(
                        "attach", session=item.session, cursor=self._cursors[item.session]
                    )
                    for event in again.get("events") or []:
                        self._deliver(item.session, event)
                continue
            if isinstance(item, Event):
                self._deliver(item.session, item.event)
        for queue in self._queues.values():
            queue.put_nowait(None)

    def _deliver(self, session_id: str, event: dict[str, Any]) -> None:
        queue = self._queues.get(session_id)
        seq = int(event.get("seq") or 0)
        if queue is None or seq <= self._cursors.get(session_id, 0):
            return
        self._cursors[session_id] = seq
        queue.put_nowait(event)


def _model_env(model: str | None) -> dict[str, str]:
    """This process's values of the variables resolving ``model`` may read (the CLI's rule,
    with config.toml's default model and declared endpoints)."""
    from orchestrator.cli.client_config import load_client_config
    from orchestrator.model_names import client_env_names
    from orchestrator.paths import Paths

    config = load_client_config(Paths.from_env().config_file)
    names = client_env_names(model, config.default_model, config.models)
    return {name: os.environ[name] for name in sorted(names) if os.environ.get(name)}
