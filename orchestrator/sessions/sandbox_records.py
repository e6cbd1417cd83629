"""The daemon's record of its live sandboxes, and the adopted ones waiting for their session.

``SandboxRegistry`` is the backends' ``SandboxListener``: every sandbox that outlives the daemon
(``SandboxSpec.die_with_parent`` off) is written to the store's ``sandboxes`` table when it
starts and deleted when it stops, so a daemon killed with ``kill -9`` leaves a complete list
for its successor (``orchestrator/sessions/adoption.py``).

``AdoptedSandboxes`` holds the sandboxes the successor adopted until their session is loaded
(sessions are loaded on demand: a prompt, a message, an attach). Loading takes the session's
sandbox from here instead of starting a new one, so its next cell runs in the same kernel. One
that waits as long as a quiet session stays loaded is unloaded like one (``idle.py``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Final

from orchestrator.sandbox.base import Sandbox, SandboxRef
from orchestrator.store.db import Store
from orchestrator.store.sandboxes import SandboxRow

__all__ = [
    "ADOPTED_NOTICE",
    "AdoptedSandboxes",
    "SandboxRegistry",
    "ref_of",
    "row_of",
]

log = logging.getLogger(__name__)

# Told to the model at the first model call of a woken session whose sandbox was adopted: the
# orchestrator restarted, the REPL did not. (A cell that was running then already has its
# "interrupted" result: it was interrupted on adoption, and is not re-run.)
ADOPTED_NOTICE: Final = (
    "[notice] the orchestrator restarted; this session's REPL kept running and was re-attached: "
    "its namespace (variables, imports, cwd) is intact"
)


def row_of(ref: SandboxRef) -> SandboxRow:
    return SandboxRow(
        backend=ref.backend,
        ref=ref.ref,
        session_id=ref.session_id,
        url=ref.url,
        kernel_id=ref.kernel_id,
        token=ref.token,
        runtime_dir=ref.runtime_dir,
        state="ready" if ref.kernel_id else "starting",
    )


def ref_of(row: SandboxRow) -> SandboxRef:
    return SandboxRef(
        backend=row.backend,
        ref=row.ref,
        session_id=row.session_id,
        url=row.url,
        kernel_id=row.kernel_id,
        token=row.token,
        runtime_dir=row.runtime_dir,
    )


class SandboxRegistry:
    """Writes what the backends report into the ``sandboxes`` table (a ``SandboxListener``)."""

    def __init__(self, store: Store):
        self.store = store

    async def sandbox_up(self, ref: SandboxRef) -> None:
        await self.store.put_sandbox(row_of(ref))

    async def sandbox_down(self, ref: SandboxRef) -> None:
        await self.store.delete_sandbox(ref.backend, ref.ref)


class AdoptedSandboxes:
    """Adopted sandboxes by session id, until the session is loaded (or the daemon stops:
    each is also owned by its backend, whose ``close`` stops it)."""

    def __init__(self) -> None:
        # Each sandbox with the time.monotonic() of its adoption.
        self._by_session: dict[str, tuple[Sandbox, float]] = {}

    def __len__(self) -> int:
        return len(self._by_session)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._by_session

    def put(self, session_id: str, sandbox: Sandbox) -> None:
        self._by_session[session_id] = (sandbox, time.monotonic())

    def waiting_since(self, before: float) -> list[str]:
        """Sessions whose sandbox was adopted before ``before`` (a ``time.monotonic()`` value)
        and is still waiting to be loaded."""
        return [sid for sid, (_, since) in self._by_session.items() if since <= before]

    async def take(self, session_id: str) -> Sandbox | None:
        """The session's adopted sandbox if it is still alive; a dead one is stopped (its row
        removed) and the session starts a new one as usual."""
        adopted = self._by_session.pop(session_id, None)
        if adopted is None:
            return None
        sandbox = adopted[0]
        if await sandbox.is_alive():
            return sandbox
        log.warning("the adopted sandbox of %s died before its session was loaded", session_id)
        with contextlib.suppress(Exception):
            await sandbox.stop()
        return None

    async def discard(self, session_id: str) -> None:
        """The session ended (deleted, aborted) while not loaded: stop its adopted sandbox."""
        adopted = self._by_session.pop(session_id, None)
        if adopted is not None:
            with contextlib.suppress(Exception):
                await adopted[0].stop()
