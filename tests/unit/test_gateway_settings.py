"""The gateway as its client and its process configure it: the channels socket waits as long as
a kernel may take to start (a CI failure's fix), and the gateway logs no debug records."""

from __future__ import annotations

import logging
from pathlib import Path

from jupyter_server.services.kernels.kernelmanager import MappingKernelManager

from orchestrator.sandbox.gateway import KERNEL_READY_TIMEOUT_S, WS_OPEN_TIMEOUT_S


def test_the_socket_handshake_is_bounded_like_the_kernels_start() -> None:
    """The gateway answers the handshake only after its kernel is ready and has answered
    kernel_info, which it waits for up to its ``kernel_info_timeout``. A shorter bound on our
    side failed local sandboxes on a loaded machine while their kernel was still importing."""
    gateway_wait = MappingKernelManager.kernel_info_timeout.default_value
    assert WS_OPEN_TIMEOUT_S >= KERNEL_READY_TIMEOUT_S
    assert gateway_wait <= WS_OPEN_TIMEOUT_S


def test_the_gateway_builds_no_debug_records(tmp_path: Path) -> None:
    """traitlets leaves an application's logger at DEBUG and filters in the handler, so each
    kernel message built a debug record nobody printed (the kernel manager's activity
    tracking, ~7 % of a busy gateway's CPU). The logger itself is at the gateway's level."""
    from orchestrator.sandbox.gateway_main import LOG_LEVEL, _make_app

    app = _make_app("token", env_allow=[], runtime_dir=tmp_path)
    log = app.kernel_manager.log
    assert not log.isEnabledFor(logging.DEBUG)
    assert log.isEnabledFor(logging.getLevelName(LOG_LEVEL))
