"""The one place litellm is imported.

litellm costs ~4 s to import and, left to its defaults, reaches the internet for a cost map and
loads a ``.env`` from the working directory. ``load_litellm`` sets the offline switches before the
import and is cached; ``preload_in_background`` starts it on a thread at CLI start so the import
overlaps sandbox start-up instead of adding to it.
"""

from __future__ import annotations

import asyncio
import os
import threading
from types import ModuleType
from typing import Any

__all__ = ["ensure_litellm", "load_litellm", "preload_in_background"]

_OFFLINE_ENV = {
    # Use the cost map bundled with the package, never the upstream JSON.
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    # PRODUCTION stops litellm from calling dotenv.load_dotenv() on the user's cwd.
    "LITELLM_MODE": "PRODUCTION",
    "LITELLM_TELEMETRY": "False",
}

_lock = threading.Lock()
_module: ModuleType | None = None


def load_litellm() -> Any:
    """Import and configure litellm once (thread-safe)."""
    global _module
    with _lock:
        if _module is None:
            for key, value in _OFFLINE_ENV.items():
                os.environ.setdefault(key, value)
            import litellm

            litellm.suppress_debug_info = True  # no "Provider List: <url>" on every error
            litellm.telemetry = False
            litellm.drop_params = True  # providers that reject an optional param still work
            # Its success-logging callbacks rebuild the whole response and walk every message
            # of the history after each streamed call (~3 ms a call, growing with history) for
            # loggers we never register; cost and usage are recorded by models/cost.py.
            litellm.disable_streaming_logging = True
            litellm.success_callback = []
            litellm.callbacks = []
            _silence_success_dispatch()
            _module = litellm
        return _module


async def _no_success_logging(*_args: Any, **_kwargs: Any) -> None:
    return None


def _silence_success_dispatch() -> None:
    """An async streamed call still schedules ``Logging.dispatch_success_handlers`` as a task
    after its last chunk, whatever ``disable_streaming_logging`` says: it rebuilds the response,
    runs the cost calculator and walks the messages, for no logger of ours. It becomes a
    no-op; a litellm without it is left as it is."""
    try:
        from litellm.litellm_core_utils import litellm_logging
    except ImportError:
        return
    if hasattr(litellm_logging.Logging, "dispatch_success_handlers"):
        litellm_logging.Logging.dispatch_success_handlers = _no_success_logging  # type: ignore[method-assign]


async def ensure_litellm() -> Any:
    """``load_litellm`` for async callers: the first import (seconds) runs on a thread, so an
    event loop that serves other clients (the daemon's) never stalls on it."""
    if _module is not None:
        return _module
    return await asyncio.to_thread(load_litellm)


def preload_in_background() -> threading.Thread:
    thread = threading.Thread(target=load_litellm, name="litellm-import", daemon=True)
    thread.start()
    return thread
