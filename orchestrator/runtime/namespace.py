"""The user's variables with their sizes, and dropping oversized ones (INSIDE the kernel).

The host calls these as silent executions after a compaction (docs/compaction.md): first
``inventory`` (what the summary may recommend reusing, and which variables are over the drop
size), then, once the summary is in, ``drop`` of the oversized names. Both return JSON.

**How a size is measured.** Pickling a variable to learn its size would copy it (a 2 GiB array
costs 2 GiB more) and can run arbitrary code; so the size is measured, not serialized:

- an object whose type has an integer ``nbytes`` (numpy arrays, torch tensors, ...) counts its
  buffer plus ``sys.getsizeof``;
- a pandas object counts ``memory_usage(deep=False)`` (the frame's buffers; the characters of
  object columns are not walked, so string-heavy frames are under-counted);
- anything else is walked: ``sys.getsizeof`` of the object, of the items of lists, tuples,
  sets, dicts and deques, and of instances' ``__dict__``, each object once, stopping as soon as
  the total passes the cap or ``MEASURE_MAX_OBJECTS`` objects were visited. A walk cut short
  reports a lower bound (``exact: false``). Only a variable *known* to be over the cap is
  dropped, so an uncertain size never costs the user a variable.

Stdlib only. Objects the shell or the runtime put there (``rlm``, ``history``, ...: the ones
also in ``user_ns_hidden``) are never listed or dropped; a user's own variable that reuses such
a name is.
"""

from __future__ import annotations

import collections
import json
import re
import sys
import types
from collections.abc import Mapping
from typing import Any

__all__ = ["MEASURE_MAX_OBJECTS", "drop", "inventory", "measure"]

# Objects one measurement visits at most (a lower bound is reported past it).
MEASURE_MAX_OBJECTS = 100_000
# Variables one inventory lists at most (oversized ones are always listed).
INVENTORY_MAX_NAMES = 200
_IPYTHON_PRIVATE = re.compile(r"^(_+|_i{1,3}|_i?\d+|_ih|_oh|_dh|__\w+__)$")
_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), range)
_CONTAINERS = (list, tuple, set, frozenset, collections.deque)
_OPAQUE = (
    types.ModuleType,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
    types.FrameType,
)
_OUTPUT_CACHE_NAMES = ("_", "__", "___")


def _buffer_bytes(obj: Any) -> int | None:
    """``nbytes`` when the object's type defines it (looked up on the type: no ``__getattr__``
    of the instance runs)."""
    if not hasattr(type(obj), "nbytes"):
        return None
    try:
        value = obj.nbytes
    except Exception:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _pandas_bytes(obj: Any) -> int | None:
    if not type(obj).__module__.startswith("pandas") or not hasattr(type(obj), "memory_usage"):
        return None
    try:
        usage = obj.memory_usage(deep=False)
        return int(usage.sum()) if hasattr(usage, "sum") else int(usage)
    except Exception:
        return None


def measure(obj: Any, cap: int) -> tuple[int, bool]:
    """``(bytes, exact)``: the object's size, or a lower bound once it passes ``cap`` or the
    walk passes ``MEASURE_MAX_OBJECTS`` (``exact`` is then False)."""
    for direct in (_buffer_bytes(obj), _pandas_bytes(obj)):
        if direct is not None:
            return direct + sys.getsizeof(obj, 0), True
    seen: set[int] = set()
    stack: list[Any] = [obj]
    total = 0
    while stack:
        if total > cap or len(seen) >= MEASURE_MAX_OBJECTS:
            return total, False
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item, 0)
        if isinstance(item, _ATOMS + _OPAQUE):
            continue
        buffer = _buffer_bytes(item)
        if buffer is not None:
            total += buffer
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, _CONTAINERS):
            stack.extend(item)
        else:
            attrs = getattr(item, "__dict__", None)
            if isinstance(attrs, dict):
                stack.append(attrs)
    return total, True


def _shell() -> Any:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        raise RuntimeError("no IPython shell is running")
    return shell


def _user_variables(namespace: Mapping[str, Any], hidden: Mapping[str, Any]) -> list[str]:
    unset = object()
    names = []
    for name, value in namespace.items():
        if not isinstance(name, str) or name.startswith("_") or _IPYTHON_PRIVATE.match(name):
            continue
        if hidden.get(name, unset) is value:  # the shell's or the runtime's own object
            continue
        if isinstance(value, _OPAQUE):
            continue
        names.append(name)
    return sorted(names)


def inventory(cap: int) -> str:
    """JSON ``{ok, variables: [{name, type, bytes, exact, over}], more}``: the user's
    variables by name (at most ``INVENTORY_MAX_NAMES``, every one over ``cap`` included)."""
    try:
        shell = _shell()
        rows = []
        for name in _user_variables(shell.user_ns, shell.user_ns_hidden):
            value = shell.user_ns[name]
            size, exact = measure(value, cap)
            rows.append(
                {
                    "name": name,
                    "type": type(value).__name__,
                    "bytes": size,
                    "exact": exact,
                    "over": size > cap,
                }
            )
    except Exception as exc:
        return json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    over = [r for r in rows if r["over"]]
    rest = [r for r in rows if not r["over"]]
    room = max(0, INVENTORY_MAX_NAMES - len(over))
    shown = sorted(over + rest[:room], key=lambda r: str(r["name"]))
    return json.dumps({"ok": True, "variables": shown, "more": len(rest) - min(room, len(rest))})


def drop(names: list[str]) -> str:
    """Delete ``names`` from the user namespace (and from IPython's output cache, which would
    keep the objects alive); JSON ``{ok, dropped: [...]}``."""
    try:
        shell = _shell()
        namespace = shell.user_ns
        dropped = []
        unset = object()
        for name in names:
            if name not in namespace or shell.user_ns_hidden.get(name, unset) is namespace[name]:
                continue
            value = namespace.pop(name)
            dropped.append(name)
            out = namespace.get("Out")
            if isinstance(out, dict):
                for key in [k for k, v in out.items() if v is value]:
                    del out[key]
            for alias in _OUTPUT_CACHE_NAMES:
                if namespace.get(alias) is value:
                    namespace[alias] = None
            del value
        import gc

        gc.collect()
    except Exception as exc:
        return json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    return json.dumps({"ok": True, "dropped": dropped})
