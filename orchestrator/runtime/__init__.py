"""Code that runs INSIDE the kernel (stdlib only; nothing here imports the host side).

The kernelspec written by ``orchestrator.sandbox.gateway_main`` loads this package as an IPython
extension, so every kernel start pays for it: keep the import cheap. The helpers themselves live
in submodules that are imported on first use (``%%bash`` -> ``bash``, ``edit`` -> ``edit``).

What the extension installs:

- ``%%bash``: the cell body runs in a throwaway ``bash`` in its own process group; its output
  streams into the cell as it arrives; a non-zero exit status is an error; an interrupt kills
  the whole group.
- Output spilling (``spill.py``): a cell's stdout/stderr past the size the host asks for goes
  to a file inside the sandbox instead of over the wire; the host is sent head, tail and where
  the rest is.
- ``edit(path, old, new)``: exact single-occurrence replace that returns a unified diff; it can
  be called plainly or awaited.
- ``rlm`` (with ``rlm.harness``), ``agent_message``, ``agent_observe``, ``history``,
  ``compact``, ``refine``, ``mcp``: host requests over NATS (``rlm.py``, ``harness.py``,
  ``messaging.py``, ``history.py``, ``refine.py``, ``mcp.py``, ``host.py``; docs/runtime.md,
  docs/mcp.md). They
  are pushed as lazy stand-ins: the first use imports the real object and puts it in the
  namespace in the stand-in's place, so a kernel start pays for none of it (and ``nats`` is
  imported only by the first request).

``session_setup`` is what the host runs (silently) after every kernel (re)start to put the
session's working directory and environment in place.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.runtime.edit import EditResult

from orchestrator.runtime.wire import REPL_CONTEXT_FILE_ENV, REPL_CONTEXT_VARIABLE

__all__ = [
    "RUNTIME_NAMES",
    "edit",
    "load_ipython_extension",
    "session_setup",
]

CWD_PATH_ENTRY = ""  # sys.path's entry for "the current directory, whatever it is now"
# Names the runtime adds to the user namespace (hidden from %who and namespace snapshots).
RUNTIME_NAMES = (
    "edit",
    "rlm",
    "agent_message",
    "agent_observe",
    "history",
    "compact",
    "refine",
    "goal",
    "rlm_heartbeat",
    "mcp",
)
# Name -> (module, attribute) of the helpers pushed as lazy stand-ins.
LAZY_HELPERS = {
    "rlm": ("orchestrator.runtime.rlm", "rlm"),
    "agent_message": ("orchestrator.runtime.messaging", "agent_message"),
    "agent_observe": ("orchestrator.runtime.messaging", "agent_observe"),
    "history": ("orchestrator.runtime.history", "history"),
    "compact": ("orchestrator.runtime.history", "compact"),
    "refine": ("orchestrator.runtime.refine", "refine"),
    "goal": ("orchestrator.runtime.goal", "goal"),
    "rlm_heartbeat": ("orchestrator.runtime.heartbeat", "rlm_heartbeat"),
    "mcp": ("orchestrator.runtime.mcp", "mcp"),
}
# ipykernel's shell init asks every subprocess for colour (TERM=xterm-color, FORCE_COLOR=1,
# CLICOLOR_FORCE=1); the model reads plain text, and escape codes only cost tokens.
PLAIN_OUTPUT_ENV = {"TERM": "dumb", "CLICOLOR": "0", "NO_COLOR": "1"}
COLOR_FORCING_ENV = ("FORCE_COLOR", "CLICOLOR_FORCE")


def edit(path: str | os.PathLike[str], old: str, new: str) -> EditResult:
    """Replace the one occurrence of ``old`` in ``path`` by ``new``; return the diff.

    Works with and without ``await``. Errors (no occurrence, several occurrences, missing file)
    are raised as ``EditError`` with a message that says what to do.
    """
    from orchestrator.runtime.edit import edit_file

    return edit_file(path, old, new)


class _LazyHelper:
    # Stands in for a runtime object until first use, then swaps the real one into the
    # namespace (and keeps delegating, for references taken before the swap). No docstring:
    # ``__doc__`` is delegated too, so ``help(rlm)`` / ``rlm?`` show the real one.

    __slots__ = ("_attr", "_module", "_name", "_namespaces")

    def __init__(
        self, name: str, module: str, attr: str, namespaces: tuple[dict[str, Any], ...]
    ) -> None:
        self._name = name
        self._module = module
        self._attr = attr
        self._namespaces = namespaces

    def _resolve(self) -> Any:
        target = _lookup_helper(self._module, self._attr)
        for namespace in self._namespaces:
            if namespace.get(self._name) is self:
                namespace[self._name] = target
        return target

    def __getattr__(self, name: str) -> Any:
        if name in _LazyHelper.__slots__:  # not initialised (copy, unpickle): do not recurse
            raise AttributeError(name)
        return getattr(self._resolve(), name)

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        return getattr(self._resolve(), "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return repr(self._resolve())

    def __iter__(self) -> Any:
        return iter(self._resolve())

    def __getitem__(self, key: Any) -> Any:
        return self._resolve()[key]

    def __dir__(self) -> list[str]:
        return dir(self._resolve())

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickles (namespace snapshots, copies) as the real object, never the namespaces.
        return (_lookup_helper, (self._module, self._attr))


def _lookup_helper(module: str, attr: str) -> Any:
    return getattr(importlib.import_module(module), attr)


def _bash_cell_magic(line: str, cell: str) -> None:
    from orchestrator.runtime.bash import run_bash_cell

    run_bash_cell(line, cell)


def load_ipython_extension(ipython: Any) -> None:
    """IPython extension hook: register ``%%bash`` and push the helpers."""
    # Replaces IPython's own %%bash (a script magic that neither kills the process group on
    # interrupt nor reports the exit status).
    ipython.register_magic_function(_bash_cell_magic, magic_kind="cell", magic_name="bash")
    helpers: dict[str, Any] = {"edit": edit}
    namespaces = (ipython.user_ns, ipython.user_ns_hidden)
    for name, (module, attr) in LAZY_HELPERS.items():
        helpers[name] = _LazyHelper(name, module, attr, namespaces)
    ipython.user_ns.update(helpers)
    ipython.user_ns_hidden.update(helpers)
    # The kernel starts with ``python -P`` so a user's ``zmq.py`` cannot shadow what ipykernel
    # imports at start; from here on cells import from the working directory as in Jupyter.
    if CWD_PATH_ENTRY not in sys.path:
        sys.path.insert(0, CWD_PATH_ENTRY)
    for name in COLOR_FORCING_ENV:
        os.environ.pop(name, None)
    os.environ.update(PLAIN_OUTPUT_ENV)
    from orchestrator.runtime.async_check import install as install_async_check
    from orchestrator.runtime.spill import install as install_spill

    install_spill(ipython)
    install_async_check(ipython)


def session_setup(cwd: str, env: Mapping[str, str]) -> int:
    """Apply a session's working directory and environment; return the kernel's pid.

    Run by the host after each kernel start and restart (a warm-pool kernel was started before
    its session was known, and a restarted kernel forgets ``os.environ`` changes).
    """
    os.environ.update(env)
    os.chdir(cwd)
    _bind_context(env.get(REPL_CONTEXT_FILE_ENV))
    return os.getpid()


def _bind_context(name: str | None) -> None:
    """The session asked for a workspace file as the REPL variable ``context`` (a sweep's rlm
    variant): bind it in the user namespace, as text. A missing file binds nothing."""
    if not name:
        return
    try:
        with open(name, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return
    from IPython import get_ipython

    shell = get_ipython()
    if shell is not None:
        shell.user_ns[REPL_CONTEXT_VARIABLE] = text
