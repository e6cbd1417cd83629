"""The channels socket waits as long as a kernel may take to start (a CI failure's fix)."""

from __future__ import annotations

from jupyter_server.services.kernels.kernelmanager import MappingKernelManager

from orchestrator.sandbox.gateway import KERNEL_READY_TIMEOUT_S, WS_OPEN_TIMEOUT_S


def test_the_socket_handshake_is_bounded_like_the_kernels_start() -> None:
    """The gateway answers the handshake only after its kernel is ready and has answered
    kernel_info, which it waits for up to its ``kernel_info_timeout``. A shorter bound on our
    side failed local sandboxes on a loaded machine while their kernel was still importing."""
    gateway_wait = MappingKernelManager.kernel_info_timeout.default_value
    assert WS_OPEN_TIMEOUT_S >= KERNEL_READY_TIMEOUT_S
    assert gateway_wait <= WS_OPEN_TIMEOUT_S
