"""Import nats-py without its websocket transport, for a process that only speaks ``nats://``.

nats-py imports aiohttp at import time (``nats.aio.transport``, inside ``try``/``except
ImportError``) for ``ws://`` servers alone; aiohttp costs a few hundred milliseconds of the
daemon's start. With aiohttp hidden for the moment of nats-py's own import, the websocket
transport is off in this process (nats-py says so if a ``ws://`` server is ever dialled) and
aiohttp stays importable for everyone else (litellm imports it later, if it is ever needed).

Only safe before any other thread runs: a thread importing aiohttp at that moment would see it
missing. ``import_nats_without_websockets`` checks and does nothing otherwise.
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Final

__all__ = ["WEBSOCKET_SCHEMES", "import_nats_without_websockets"]

WEBSOCKET_SCHEMES: Final = ("ws://", "wss://")
_WEBSOCKET_LIBRARY: Final = "aiohttp"
_NATS_CLIENT_MODULE: Final = "nats.aio.client"


def import_nats_without_websockets() -> bool:
    """Import nats-py's client with aiohttp hidden; False (nothing done) when nats-py or
    aiohttp is already imported, or when another thread runs."""
    if _NATS_CLIENT_MODULE in sys.modules or _WEBSOCKET_LIBRARY in sys.modules:
        return False
    if threading.active_count() > 1:
        return False
    sys.modules[_WEBSOCKET_LIBRARY] = None  # type: ignore[assignment]  # import → ImportError
    try:
        importlib.import_module(_NATS_CLIENT_MODULE)
    finally:
        del sys.modules[_WEBSOCKET_LIBRARY]
    return True
