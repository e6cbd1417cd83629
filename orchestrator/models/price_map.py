"""litellm's bundled price and window map, read as JSON without importing litellm.

litellm ships ``model_prices_and_context_window_backup.json`` and, offline
(``LITELLM_LOCAL_MODEL_COST_MAP``, models/lite.py), its ``model_cost`` is that file. Importing
litellm costs seconds and ~200 MB, so prices and windows are read from the file itself: once per
process (~30 ms), then each model's entry once (``model_entry`` is cached). The file is found
through the package's import spec, which does not import the package.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import threading
from pathlib import Path
from typing import Any, Final

__all__ = ["PRICE_MAP_FILE", "model_entry", "preload_in_background", "price_map_path"]

PRICE_MAP_FILE: Final = "model_prices_and_context_window_backup.json"
PRICE_MAP_PACKAGE: Final = "litellm"

# Sessions starting together each look their model up on a thread; ``functools.cache`` alone
# would let every one of them miss and read the ~1 MB file (20 sessions: ~0.6 s of CPU).
_reading: Final = threading.Lock()


def price_map_path() -> Path | None:
    spec = importlib.util.find_spec(PRICE_MAP_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(location) / PRICE_MAP_FILE
        if candidate.is_file():
            return candidate
    return None


def _table() -> dict[str, Any]:
    with _reading:  # the first caller reads; the others wait for it and share its table
        return _read_table()


@functools.cache
def _read_table() -> dict[str, Any]:
    path = price_map_path()
    if path is None:
        return {}
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # unreadable: every model's cost is unknown, never invented
    return loaded if isinstance(loaded, dict) else {}


@functools.cache
def model_entry(*names: str) -> dict[str, Any] | None:
    """The first of ``names`` the map knows (a copy is not made: treat it as read-only)."""
    table = _table()
    for name in names:
        entry = table.get(name)
        if isinstance(entry, dict):
            return entry
    return None


def preload_in_background() -> threading.Thread:
    """Read the map on a thread now: a daemon's first session then finds it read instead of
    reading it (~30 ms of CPU, several times that on a loaded machine) between its first
    reply and its next step."""
    thread = threading.Thread(target=_table, name="price-map-read", daemon=True)
    thread.start()
    return thread
