"""Run one root session to completion in this process (print and JSON modes).

Start-up overlaps the slow parts: the sandbox (kernel gateway + kernel) and the embedded model
server start as background tasks while litellm imports on its thread, and the first model call
does not wait for the sandbox — only the first cell does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from orchestrator.agent.loop import AgentLoop, EventSink, TurnOutcome
from orchestrator.agent.prompts import EnvironmentFacts, build_system_prompt
from orchestrator.errors import SandboxStartError, UserError
from orchestrator.ids import new_session_id
from orchestrator.models.client import ModelClient
from orchestrator.models.registry import ResolvedModel
from orchestrator.paths import Paths, ensure_private_dir
from orchestrator.sandbox.base import Sandbox, SandboxBackend, SandboxSpec
from orchestrator.sessions.context import ContextBuilder
from orchestrator.settings import Settings
from orchestrator.store.db import SessionRecord, Store
from orchestrator.store.events import RunEndPayload

__all__ = ["RunOptions", "RunResult", "make_backend", "run_session"]

BACKENDS = ("local",)
SESSION_NAME_MAX = 64


@dataclass
class RunOptions:
    task: str
    cwd: Path
    backend: Literal["local"] = "local"
    name: str | None = None


@dataclass
class RunResult:
    session_id: str
    outcome: TurnOutcome
    usage: dict[str, Any] = field(default_factory=dict)


def make_backend(name: str, settings: Settings) -> SandboxBackend:
    if name != "local":
        raise UserError(f"backend {name!r} is not available yet; use --backend local")
    from orchestrator.sandbox.local import LocalBackend

    # A one-shot run has exactly one session: a warm spare would only cost memory.
    return LocalBackend(
        pool_size=0,
        interrupt_grace_s=settings.interrupt_grace_s,
        output_cap_chars=settings.output_cap_chars,
    )


async def run_session(
    opts: RunOptions,
    model: ResolvedModel,
    settings: Settings,
    paths: Paths,
    *,
    sink: EventSink | None = None,
    on_session: Callable[[str], None] | None = None,
) -> RunResult:
    store = await Store.open(paths.database_file)
    try:
        return await _run_with_store(opts, model, settings, paths, store, sink, on_session)
    finally:
        await asyncio.shield(store.close())


async def _run_with_store(
    opts: RunOptions,
    model: ResolvedModel,
    settings: Settings,
    paths: Paths,
    store: Store,
    sink: EventSink | None,
    on_session: Callable[[str], None] | None,
) -> RunResult:
    session_id = new_session_id()
    first_line = opts.task.strip().splitlines()[0] if opts.task.strip() else ""
    await store.create_session(
        SessionRecord(
            id=session_id,
            root_id=session_id,
            name=opts.name or first_line[:SESSION_NAME_MAX] or None,
            cwd=str(opts.cwd),
            model=model.selector,
            backend=opts.backend,
            status="running",
        )
    )
    if on_session is not None:
        on_session(session_id)
    artifacts = ensure_private_dir(paths.session_artifacts(session_id))
    backend = make_backend(opts.backend, settings)
    spec = SandboxSpec(session_id=session_id, cwd=opts.cwd, artifacts_dir=artifacts)
    sandbox_task: asyncio.Task[Sandbox] = asyncio.create_task(backend.create(spec))

    async def get_sandbox() -> Sandbox:
        try:
            return await asyncio.shield(sandbox_task)
        except SandboxStartError:
            raise
        except Exception as exc:  # a backend bug must still reach the model as an error
            raise SandboxStartError(f"could not start the sandbox: {exc}") from exc

    async def record(type_: str, payload: Any) -> Any:
        rec = await store.append(session_id, type_, payload)  # type: ignore[arg-type]
        if sink is not None:
            sink(
                {
                    "type": rec.type,
                    "session_id": rec.session_id,
                    "seq": rec.seq,
                    "id": rec.id,
                    "parent_id": rec.parent_event_id,
                    "ts": rec.ts.isoformat(),
                    "payload": rec.payload,
                }
            )
        return rec

    embedded = None
    outcome: TurnOutcome | None = None
    try:
        if model.embedded:
            from orchestrator.models.embedded import EmbeddedModel

            embedded = EmbeddedModel(settings.embedded, paths)
            await embedded.start()
            model = model.with_endpoint(embedded.api_base, embedded.litellm_model, embedded.api_key)
        prompt = build_system_prompt(
            EnvironmentFacts(cwd=str(opts.cwd), model=model.selector, backend=opts.backend),
            tool_protocol=model.tool_protocol,
        )
        loop = AgentLoop(
            session_id=session_id,
            client=ModelClient(model, settings),
            system_prompt=prompt,
            get_sandbox=get_sandbox,
            record=record,
            settings=settings,
            context=ContextBuilder(),
            sink=sink,
        )
        outcome = await loop.run(opts.task)
        return RunResult(session_id=session_id, outcome=outcome)
    finally:
        reason = outcome.reason if outcome is not None else "aborted"
        final = outcome.final_text if outcome is not None else ""
        status = {"completed": "completed", "aborted": "aborted"}.get(reason, "error")

        async def _finish() -> None:
            with contextlib.suppress(Exception):
                await record("run_end", RunEndPayload(reason=reason, final_text=final))
                await store.update_session(session_id, status=status)
            if not sandbox_task.done():
                sandbox_task.cancel()
            with contextlib.suppress(BaseException):
                sandbox = await sandbox_task
                await sandbox.stop()
            with contextlib.suppress(Exception):
                await backend.close()
            if embedded is not None:
                with contextlib.suppress(Exception):
                    await embedded.stop()

        await asyncio.shield(_finish())
