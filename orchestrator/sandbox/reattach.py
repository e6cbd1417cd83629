"""Re-attaching a ``KernelGatewayClient`` to a kernel another orchestrator process started.

Used by every backend's ``adopt`` (docs/spec.md §4, R2): a daemon that was killed left its sandboxes
running, and the next daemon connects to the same gateway (URL or Unix socket, token) and the
same kernel id, so the kernel's namespace is kept.

A kernel that is still **busy** ran a cell for the dead daemon. Its result has nowhere to go
(the cell already has its ``interrupted`` tool result in the history, and is never re-run) and
the next cell would queue behind it, so it is interrupted at once. If it does not stop within
the interrupt grace the kernel is not adopted: the caller removes the sandbox, and the
session gets a fresh one at its next cell, like any woken session. ``reattach_within`` is
what an ``adopt`` calls: all of it within the start timeout, and the client closed when it
fails.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

from orchestrator.errors import KernelDied, SandboxError
from orchestrator.sandbox.gateway import KernelGatewayClient

__all__ = ["ADOPT_POLL_S", "reattach", "reattach_within"]

# While waiting for an interrupted kernel to report idle (the gateway's own view of it).
ADOPT_POLL_S: Final = 0.05
_BUSY_STATES: Final = frozenset({"busy"})


async def reattach(
    client: KernelGatewayClient, kernel_id: str, *, interrupt_grace_s: float, ready_timeout_s: float
) -> bool:
    """Point ``client`` at ``kernel_id``, interrupt a cell still running there, connect, and
    wait until the kernel answers. Returns whether a cell was interrupted. Raises
    ``SandboxError`` (gateway or kernel gone, interrupt ignored, no answer in time)."""
    if not kernel_id:
        raise SandboxError("the sandbox never got a kernel (it was still starting)")
    client.kernel_id = kernel_id
    model = await client.kernel_model()  # 404 (no such kernel) / unreachable: SandboxError
    state = model.get("execution_state")
    if state == "dead":
        raise KernelDied(f"kernel {kernel_id} is dead")
    busy = state in _BUSY_STATES
    if busy:
        await client.interrupt()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + interrupt_grace_s
        while (await client.kernel_model()).get("execution_state") in _BUSY_STATES:
            if loop.time() >= deadline:
                raise SandboxError(
                    f"kernel {kernel_id} kept running a cell {interrupt_grace_s:g} s after an "
                    "interrupt"
                )
            await asyncio.sleep(ADOPT_POLL_S)
    await client.connect()
    await client.wait_ready(timeout_s=ready_timeout_s)
    return busy


async def reattach_within(
    client: KernelGatewayClient,
    kernel_id: str,
    *,
    what: str,
    interrupt_grace_s: float,
    timeout_s: float,
) -> bool:
    """``reattach`` given ``timeout_s`` in all (and as its wait for the kernel's answer).
    Returns whether a cell was interrupted. When it fails or runs out of time, ``client`` is
    closed and ``SandboxError`` says that ``what`` (the sandbox, as its log names it) could
    not be adopted."""
    try:
        async with asyncio.timeout(timeout_s):
            return await reattach(
                client, kernel_id, interrupt_grace_s=interrupt_grace_s, ready_timeout_s=timeout_s
            )
    except (SandboxError, TimeoutError) as exc:
        with contextlib.suppress(Exception):
            await client.close()
        raise SandboxError(f"{what} could not be adopted: {exc!r}") from exc
