"""The gateway's kernel manager: a kernel that stops leaves no process behind.

jupyter_client stops a kernel gracefully when it can (a shutdown request, the process exits)
and signals the kernel's process group only when it must. Processes the kernel forked or
started are then left running: a fork bomb's copies fill the sandbox's pid limit so the
restarted kernel cannot even start a thread, and a process that called ``setsid`` escapes any
group signal. The gateway is a child subreaper, so everything the kernel ever started is still
its descendant; once the kernel has stopped (restart, death, shutdown) and before a new one
starts, this manager kills all of them.

Runs inside the gateway process only (``gateway_main`` names this class in its config, by
dotted path, as traitlets requires). A gateway holds one kernel (``max_kernels = 1``), so the
gateway's descendants at that moment are exactly what the stopped kernel left.
"""

from __future__ import annotations

import logging
import os

from kernel_gateway.services.kernels.manager import KernelGatewayIOLoopKernelManager

from orchestrator.sandbox.proctree import sweep_descendants

__all__ = ["SweepingKernelManager"]

log = logging.getLogger(__name__)


class SweepingKernelManager(KernelGatewayIOLoopKernelManager):  # type: ignore[misc]
    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        try:
            await super()._async_cleanup_resources(restart=restart)
        finally:
            killed = sweep_descendants(os.getpid())
            if killed:
                log.warning("killed %d process(es) the stopped kernel left running", killed)
