"""The orchestrator daemon: one per user, the single owner of the store, the bus and sandboxes.

``await Daemon().run()`` serves the control socket until SIGTERM/SIGINT or a ``shutdown``
command, then stops every session, sandbox and server it owns (R8) and returns.

Start-up order matters. The control socket is bound FIRST, because binding takes the socket's
flock (``ControlServer``): a second daemon must fail on that lock before it touches anything
the first one owns. Were the store or the bus first, a second daemon would report the DuckDB
file as locked (confusing), or worse, adopt the first daemon's NATS server (``reuse``) and stop
it on its way out. Until the rest is up, ``ping`` answers with ``ready: false`` and other
commands wait (bounded) for readiness.

Shutdown order: mark stopping (new commands get ``shutting_down``), abort running turns (each
records its ``aborted`` event, pushed to attached clients), stop sessions and sandboxes, mark
the sessions ``inactive`` in the store (their sandbox is gone, their history is on disk), close
the socket, stop NATS and the embedded model, close the store last.

Sandboxes started here outlive a crash of the daemon (no ``die_with_parent``) and are recorded
in the store's ``sandboxes`` table; the next daemon adopts them before ``ready``
(``orchestrator/sessions/adoption.py``: same kernel, variables intact) or removes them (R2, R8).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from orchestrator.api.errors import ApiCommandError
from orchestrator.api.server import ControlServer, default_socket_path
from orchestrator.api.wire import E_BUSY, STREAM_EVENT_TYPES
from orchestrator.daemon.backends import DaemonBackends
from orchestrator.daemon.bus import DaemonBus, daemon_bus
from orchestrator.daemon.config_watch import ConfigWatch, restart_notice
from orchestrator.daemon.files import DAEMON_LOG_FILE_NAME, STARTUP_ERROR_PREFIX, daemon_log_path
from orchestrator.daemon.handler import DaemonHandler
from orchestrator.daemon.schedule_link import make_scheduler, record_interrupted
from orchestrator.models.call_workers import auto_worker_count
from orchestrator.models.call_workers import install as install_call_workers
from orchestrator.models.call_workers import uninstall as uninstall_call_workers
from orchestrator.models.registry import ResolvedModel, resolve_model
from orchestrator.paths import Paths
from orchestrator.sandbox.choice import BackendChoice
from orchestrator.sessions.adoption import adopt_sandboxes, resume_interrupted_turns
from orchestrator.sessions.family import FamilyService
from orchestrator.sessions.live import LiveSession
from orchestrator.sessions.manager import TERMINAL_STATES, Orchestrator
from orchestrator.sessions.redelivery import redeliver_pending
from orchestrator.sessions.sandbox_records import SandboxRegistry
from orchestrator.settings import Settings, load_settings
from orchestrator.store.db import Store

if TYPE_CHECKING:
    from orchestrator.models.embedded import EmbeddedModel

__all__ = [
    "DAEMON_LOG_FILE_NAME",
    "READY_WAIT_TIMEOUT_S",
    "STARTUP_ERROR_PREFIX",
    "Daemon",
    "daemon_log_path",
]

log = logging.getLogger(__name__)

# A command that arrives while the daemon is still starting waits this long for it.
READY_WAIT_TIMEOUT_S: Final = 60.0
# Each phase of shutdown is bounded so a wedged part cannot keep the daemon (and its socket
# lock) alive forever; sandbox stops are themselves bounded by PROCESS_STOP_GRACE_S.
SHUTDOWN_PHASE_TIMEOUT_S: Final = 60.0
_STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)


class Daemon:
    """Owns one Store, one DaemonBus, its sandbox backends (``DaemonBackends``), one
    Orchestrator, one ControlServer."""

    def __init__(
        self,
        *,
        paths: Paths | None = None,
        settings: Settings | None = None,
        socket_path: Path | None = None,
    ):
        self.paths = paths or Paths.from_env()
        self.settings = settings or load_settings(self.paths.config_file)
        # Settings given by the caller (tests, embedders) are final; read from the file, new
        # sessions follow the file's edits (config_watch.py).
        self.config = (
            None if settings is not None else ConfigWatch(self.paths.config_file, self.settings)
        )
        self.socket_path = socket_path or default_socket_path(self.paths)
        self.started_monotonic = time.monotonic()
        self.handler = DaemonHandler(self)
        self.server: ControlServer | None = None
        self._store: Store | None = None
        self._orch: Orchestrator | None = None
        self._bus: DaemonBus | None = None
        self._backends: DaemonBackends | None = None
        # One server per embedded variant asked for (``[embedded] variant``, ``embedded/1.5b``).
        self._embedded: dict[str, EmbeddedModel] = {}
        self._embedded_lock = asyncio.Lock()
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._stopping = False

    # ---------------------------------------------------------------------------- DaemonControl

    @property
    def store(self) -> Store:
        if self._store is None:
            raise ApiCommandError(E_BUSY, "the daemon is still starting")
        return self._store

    @property
    def orch(self) -> Orchestrator:
        if self._orch is None:
            raise ApiCommandError(E_BUSY, "the daemon is still starting")
        return self._orch

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def wait_ready(self) -> None:
        try:
            async with asyncio.timeout(READY_WAIT_TIMEOUT_S):
                await self._ready.wait()
        except TimeoutError:
            raise ApiCommandError(E_BUSY, "the daemon is still starting") from None

    def request_shutdown(self) -> None:
        self._stop.set()

    def settings_for_new_session(self) -> tuple[Settings, str | None]:
        """config.toml as it is now (``ConfigError`` when it no longer parses), and a notice
        when a section only a restart applies changed."""
        if self.config is None:
            return self.settings, None
        current, changed = self.config.current()
        return current, restart_notice(changed, self.config.path)

    async def endpoint_for(self, model: ResolvedModel) -> ResolvedModel:
        """Remote models as they are; the embedded model gets the endpoint of this daemon's
        server for its variant, started on first use (it costs ~0.5 GB of RAM, so only when
        asked): the configured one, or the one its name chose (``embedded/1.5b``)."""
        if not model.embedded:
            return model
        settings = self.settings.embedded
        if model.embedded_variant is not None:
            settings = settings.model_copy(update={"variant": model.embedded_variant})
        async with self._embedded_lock:
            embedded = self._embedded.get(settings.variant)
            if embedded is None:
                from orchestrator.models.embedded import EmbeddedModel

                embedded = EmbeddedModel(settings, self.paths)
                self._embedded[settings.variant] = embedded
            if not embedded.running:
                await embedded.start()  # also restarts a server that died
        return model.with_endpoint(embedded.api_base, embedded.litellm_model, embedded.api_key)

    async def resolve(self, selector: str) -> ResolvedModel:
        """A stored session's model, usable here: how the orchestrator wakes a session."""
        return await self.endpoint_for(resolve_model(selector, self.settings))

    async def choose_backend(self, requested: str | None) -> BackendChoice:
        """The sandbox backend of a new session: auto, docker, bwrap, local or kubernetes
        (``UserError``)."""
        if self._backends is None:
            raise ApiCommandError(E_BUSY, "the daemon is still starting")
        return await self._backends.choose(requested)

    async def abort_tree(self, live: LiveSession) -> list[str]:
        """Stop the running turn of the session and of its descendants (cascade); the session
        stays loaded and takes new prompts. The ids whose turn was aborted."""
        aborted = await self.orch.abort_tree(live)
        if aborted:
            log.info("aborted %d running turn(s) under %s: %s", len(aborted), live.id, aborted)
        return aborted

    # ---------------------------------------------------------------------------- lifecycle

    async def run(self) -> None:
        """Serve until asked to stop; always leaves nothing running behind."""
        server = ControlServer(self.socket_path, self.handler)
        await server.start()  # DaemonAlreadyRunning / SocketPathError: nothing else started
        self.server = server
        loop = asyncio.get_running_loop()
        for sig in _STOP_SIGNALS:
            loop.add_signal_handler(sig, self.request_shutdown)
        try:
            await self._start_components()
            self._ready.set()
            log.info("daemon ready: pid %d, socket %s", os.getpid(), self.socket_path)
            await self._stop.wait()
            log.info("daemon stopping")
        finally:
            for sig in _STOP_SIGNALS:
                loop.remove_signal_handler(sig)
            await asyncio.shield(self._shutdown())
            log.info("daemon stopped")

    async def _start_components(self) -> None:
        from orchestrator.models.lite import preload_in_background
        from orchestrator.models.price_map import preload_in_background as preload_price_map
        from orchestrator.models.registry import litellm_expected

        # litellm takes seconds and ~200 MB to import: only when the default model goes through
        # it (OpenAI-compatible endpoints never do), then now, on a thread, not in a turn.
        if litellm_expected(self.settings):
            preload_in_background()
        preload_price_map()
        workers = self.settings.daemon.model_workers
        pool = install_call_workers(auto_worker_count() if workers is None else workers)
        log.info("model-call workers: up to %d, started by demand", pool.count if pool else 0)
        self._store = await Store.open(self.paths.database_file)
        backends = DaemonBackends(
            self.settings,
            listener=SandboxRegistry(self._store),
            socket_path=self.socket_path,
            paths=self.paths,
        )
        self._backends = backends
        # The backends of the sandboxes a dead daemon left: each is looked for (adoption).
        await backends.start({row.backend for row in await self._store.list_sandboxes()})
        self._bus = daemon_bus(self.paths, self.settings.nats)
        self._orch = Orchestrator(
            store=self._store,
            backend=backends.local,
            settings=self.settings,
            paths=self.paths,
            bus=self._bus,
            sink=self._sink,
            resolve=self.resolve,
            sandboxes_outlive_us=True,
        )
        # One dict: a docker backend found later (image built meanwhile) is seen by both.
        self._orch.backends = backends.all
        # A session a client watches is never idle-unloaded under it.
        self._orch.idle.attached = lambda sid: (
            self.server is not None and bool(self.server.attached_clients(sid))
        )
        await self._bus.start(FamilyService(self._orch).handlers())
        # Nothing is loaded yet, so rows that say running or idle were left by a daemon (or a
        # print-mode run) that died: mark the interrupted turns and cells, call them inactive.
        recovered = await self._orch.recover_interrupted()
        if recovered:
            log.info("marked %d session(s) left by a dead orchestrator inactive", len(recovered))
        # Sandboxes a dead daemon left running: adopt (kernel state intact) or remove each,
        # before redelivery (a woken recipient finds its old kernel) and before the pools.
        adoption = await adopt_sandboxes(self._orch)
        if adoption.adopted or adoption.removed or adoption.unknown_removed:
            log.info(
                "sandboxes left by a dead daemon: %d adopted, %d removed, %d unknown removed",
                len(adoption.adopted),
                len(adoption.removed),
                adoption.unknown_removed,
            )
        # A daemon is long-lived: keep warm sandboxes so a new session's first cell is fast.
        backends.start_pools()
        # Messages accepted before a crash or stop and not yet in their recipient's history
        # (R4): each wakes its recipient, once. Before `ready`, so a client never sees the
        # recipient idle with its message still in the mailbox.
        redelivered = await redeliver_pending(self._orch)
        if redelivered:
            log.info("redelivered %d queued agent message(s)", redelivered)
        # Turns the crash interrupted (marked above) continue, unless a message already did.
        resumed = await resume_interrupted_turns(self._orch)
        if resumed:
            log.info("resumed %d interrupted turn(s): %s", len(resumed), ", ".join(resumed))
        # Heartbeats and schedules (docs/control.md): ticks a crash left claimed are marked
        # interrupted (never replayed), then due ticks are delivered.
        scheduler = make_scheduler(self._orch, self._store)
        self._orch.scheduler = scheduler
        attached = self._orch.idle.attached
        self._orch.idle.attached = lambda sid: attached(sid) or scheduler.keeps_loaded(sid)
        interrupted = await scheduler.start()
        await record_interrupted(self._store, interrupted)
        if interrupted:
            log.info(
                "marked %d schedule tick(s) a crash left claimed interrupted", len(interrupted)
            )

    def _sink(self, event: dict[str, Any]) -> None:
        # Durable events carry the store's seq (committed before we get here: R1), which is
        # the per-session cursor. Transient ones (text deltas, a tool or a compaction starting)
        # have none: they go as `stream` messages to the clients that asked for them, stamped
        # with the seq of the session's newest durable event (`after`).
        seq = event.get("seq")
        if self.server is None:
            return
        session = str(event["session_id"])
        if isinstance(seq, int):
            self.server.broadcast(session, seq, event)
        elif event.get("type") in STREAM_EVENT_TYPES:
            live = self._orch.loaded(session) if self._orch is not None else None
            after = live.pushed_seq if live is not None else None
            self.server.broadcast_transient(session, event, after=after)

    async def _shutdown(self) -> None:
        self._stopping = True
        orch = self._orch
        if orch is not None:
            await self._bounded("stopping sessions", self._stop_sessions(orch))
        if self.server is not None:
            await self._bounded("closing the control socket", self.server.close())
        if self._bus is not None:
            await self._bounded("stopping NATS", self._bus.close())
        await self._bounded("stopping the model-call workers", uninstall_call_workers())
        for embedded in self._embedded.values():
            await self._bounded("stopping the embedded model", embedded.stop())
        self._orch = None
        store, self._store = self._store, None
        if store is not None:
            await self._bounded("closing the store", store.close())
            stats = store.statistics()
            log.info(
                "store: %d commits, %d events, largest batch %d, %d failed commits, "
                "%d ingests into the tables, %d other jobs",
                stats.commits,
                stats.rows,
                stats.largest_batch,
                stats.failed_commits,
                stats.ingests,
                stats.calls,
            )

    async def _stop_sessions(self, orch: Orchestrator) -> None:
        settled = [s for s in orch.loaded_sessions() if s.state not in TERMINAL_STATES]
        # Cancels every driver (a running turn records `aborted` and interrupts its cell, while
        # the bus and sandboxes are still up), then stops every tree's sandboxes and the pool.
        # Not abort_turn: that restarts drivers, and a queued follow-up would start a new turn.
        await orch.close()
        for session in settled:
            # Sandbox gone, history on disk: that is what "inactive" means (docs/spec.md §4).
            # The row as the live session left it: its state is the transition's start.
            row = dataclasses.replace(session.record, status=session.state)
            with contextlib.suppress(Exception):
                await orch.set_stored_state(row, "inactive", "shutdown")

    @staticmethod
    async def _bounded(what: str, work: Any) -> None:
        try:
            async with asyncio.timeout(SHUTDOWN_PHASE_TIMEOUT_S):
                await work
        except Exception:
            log.exception("shutdown: %s failed", what)
