"""Run one root session (and whatever family it spawns) to the end, in this process.

This is print and JSON mode without a daemon. Start-up overlaps the slow parts: the root's
sandbox, the embedded model server and the litellm import (on its thread) start together; the
first model call does not wait for the sandbox, only the first cell does. The run ends when
the whole tree is quiet: the root idle, no descendant running, no input waiting (docs/spec.md §1).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.agent.loop import EventSink, TurnOutcome
from orchestrator.control.autonomous import AutonomousPolicy
from orchestrator.models.registry import ResolvedModel
from orchestrator.paths import Paths
from orchestrator.sandbox.base import SandboxBackend
from orchestrator.sandbox.choice import BackendChoice, BackendRequest, choose_backend
from orchestrator.session_specs import StoredRunSettings
from orchestrator.sessions.bus_link import NatsSessionBus
from orchestrator.sessions.family import FamilyService
from orchestrator.sessions.live import RunStop
from orchestrator.sessions.manager import Orchestrator
from orchestrator.sessions.post_turn import begin_run, first_input
from orchestrator.settings import Settings
from orchestrator.store.db import Store

__all__ = ["RunOptions", "RunResult", "make_backend", "run_session", "until_aborted"]

SESSION_NAME_MAX = 64


@dataclass
class RunOptions:
    task: str
    cwd: Path
    backend: BackendRequest = "local"
    name: str | None = None
    # Outside network access for the sandboxes (docker: a bridge network instead of none;
    # bwrap: the host's network namespace instead of loopback only).
    # The local backend has no network isolation to grant or take away.
    network: bool = False
    # Long-horizon controls (docs/control.md): autonomous mode and a goal (objective, budget).
    autonomous: AutonomousPolicy | None = None
    goal: tuple[str, int | None] | None = None
    # What the run's flags chose over config.toml (--max-turns, --system-prompt, ...).
    run_settings: StoredRunSettings | None = None


@dataclass
class RunResult:
    session_id: str
    outcome: TurnOutcome
    stop: RunStop | None = None  # how an autonomous or goal run stopped


def make_backend(name: str, settings: Settings, *, network: bool = False) -> SandboxBackend:
    """The backend ``orchestrator/sandbox/choice.py`` picks for ``name`` (auto: docker, else
    bwrap, else a ``UserError``: a bad name, an unusable backend). Its warning is not shown
    here: ``run_session`` prints it once the session exists."""
    return backend_for(choose(name, settings), settings, network=network)


def choose(name: str, settings: Settings) -> BackendChoice:
    """The rule with this process's probes (docker: the config's image; bwrap: cached;
    kubernetes: the cluster of ``[kubernetes]``, asked only when named)."""
    return choose_backend(
        name,
        lambda: _docker_status(settings),
        _bwrap_status,
        kubernetes_status=lambda: _kubernetes_status(settings),
    )


def backend_for(choice: BackendChoice, settings: Settings, *, network: bool) -> SandboxBackend:
    """A print-mode backend for ``choice``: this process's, its sandboxes die with it."""
    if choice.name == "docker":
        from orchestrator.sandbox.docker import DockerBackend

        # The sandbox policy of the config (image, workspace mode, limits). Pool size 1 by
        # default: the pool fills for the root's workspace after its own cold start, so
        # subagents (same cwd) start warm.
        return DockerBackend.from_settings(settings, network=network)
    if choice.name == "kubernetes":
        from orchestrator.instance import instance_id
        from orchestrator.sandbox.kubernetes import KubernetesBackend

        # A pod per session in [kubernetes]'s namespace, with [sandbox]'s policy. Its pods are
        # labelled as a run's (not a daemon's): no daemon adopts or removes them, and this
        # run deletes them when it ends (a run killed with -9 leaves them: docs/kubernetes.md).
        return KubernetesBackend.from_settings(settings, instance=instance_id(), network=network)
    if choice.name == "bwrap":
        from orchestrator.sandbox.bwrap import BwrapBackend

        # The sandbox policy of the config (workspace mode, limits); no warm pool: the
        # root's sandbox starts cold at once, overlapping the first model call.
        return BwrapBackend.from_settings(settings, network=network, pool_size=0)
    from orchestrator.sandbox.local import LocalBackend

    # The root's sandbox starts cold at once (overlapping the first model call); spares would
    # only cost memory for a run that never spawns.
    return LocalBackend(
        pool_size=0,
        interrupt_grace_s=settings.interrupt_grace_s,
        output_cap_chars=settings.output_cap_chars,
        workspace_mode=settings.sandbox.workspace,
    )


async def until_aborted(work: Awaitable[None], abort: asyncio.Event | None) -> bool:
    """Await ``work`` unless ``abort`` is set first (then ``work`` is cancelled): True when
    ``work`` finished. An explicit race, so a cancellation swallowed below cannot lose it."""
    task = asyncio.ensure_future(work)
    if abort is None:
        await task
        return True
    stop = asyncio.ensure_future(abort.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if task.done():
        task.result()  # its error, if it failed
        return True
    task.cancel()
    await asyncio.wait({task})
    return False


def _docker_status(settings: Settings) -> tuple[bool, str]:
    # The docker SDK is imported only when docker is asked for.
    from orchestrator.sandbox.docker import docker_usable
    from orchestrator.sandbox.images import resolve_image

    return docker_usable(resolve_image(settings.sandbox.image))


def _bwrap_status() -> tuple[bool, str]:
    from orchestrator.sandbox.bwrap_probe import bwrap_usable

    return bwrap_usable()


def _kubernetes_status(settings: Settings) -> tuple[bool, str]:
    from orchestrator.sandbox.k8s_status import kubernetes_usable  # the client: only when asked

    return kubernetes_usable(settings.kubernetes)


async def run_session(
    opts: RunOptions,
    model: ResolvedModel,
    settings: Settings,
    paths: Paths,
    *,
    sink: EventSink | None = None,
    on_session: Callable[[str], None] | None = None,
    abort: asyncio.Event | None = None,
) -> RunResult:
    """Run the task to the tree's quiet point. ``abort`` set (a signal, ``cli/interrupts.py``)
    aborts the tree instead, at whatever point it is: the turns running are aborted and
    recorded, the outcome is ``aborted``; the sandboxes stop either way."""
    # The bus first: a bad [nats] config is a one-line error before anything is opened.
    bus = NatsSessionBus(paths, nats=settings.nats)
    choice = choose(opts.backend, settings)  # UserError: a bad or unusable backend
    store = await Store.open(paths.database_file)
    orch = Orchestrator(
        store=store,
        backend=backend_for(choice, settings, network=opts.network),
        settings=settings,
        paths=paths,
        bus=bus,
        sink=sink,
    )
    embedded = None
    root = None
    try:
        await bus.start(FamilyService(orch).handlers())
        first_line = opts.task.strip().splitlines()[0] if opts.task.strip() else ""
        if model.embedded:
            from orchestrator.models.embedded import EmbeddedModel

            chosen = settings.embedded
            if model.embedded_variant is not None:
                chosen = chosen.model_copy(update={"variant": model.embedded_variant})
            embedded = EmbeddedModel(chosen, paths)
            await embedded.start()
            model = model.with_endpoint(embedded.api_base, embedded.litellm_model, embedded.api_key)
        root = await orch.create_session(
            model=model,
            cwd=opts.cwd,
            name=opts.name or first_line[:SESSION_NAME_MAX] or None,
            budget=settings.session_token_budget,
            run_settings=opts.run_settings,
        )
        if choice.warning:  # local: NOT isolated. Once the session exists, before it runs
            # anything: a run refused before that (its NATS unreachable) says only why.
            print(f"prime-agent: warning: {choice.warning}", file=sys.stderr)
        if on_session is not None:
            on_session(root.id)
        start = await begin_run(orch, root, autonomous=opts.autonomous, goal=opts.goal)
        orch.submit(root, first_input(root, opts.task, start))
        quiet = orch.wait_quiet(root.record.root_id, settings.family_wait_timeout_s)
        if not await until_aborted(quiet, abort):
            await orch.abort_tree(root)
            root.last_outcome = TurnOutcome(reason="aborted")
        outcome = root.last_outcome or TurnOutcome(reason="aborted")
        return RunResult(session_id=root.id, outcome=outcome, stop=root.run_stop)
    finally:

        async def _finish() -> None:
            if root is not None:
                await orch.finish_root(root)
            await orch.close()
            await bus.close()
            if embedded is not None:
                with contextlib.suppress(Exception):
                    await embedded.stop()
            await store.close()

        await asyncio.shield(_finish())
