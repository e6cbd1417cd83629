"""Code that runs INSIDE the kernel (stdlib only; nothing here imports the host side).

The kernelspec written by ``orchestrator.sandbox.gateway_main`` loads this package as an IPython
extension, so every kernel start pays for it: keep the import cheap. The helpers themselves live
in submodules that are imported on first use (``%%bash`` -> ``bash``, ``edit`` -> ``edit``).

What the extension installs:

- ``%%bash``: the cell body runs in a throwaway ``bash`` in its own process group; its output
  streams into the cell as it arrives; a non-zero exit status is an error; an interrupt kills
  the whole group.
- ``edit(path, old, new)``: exact single-occurrence replace that returns a unified diff; it can
  be called plainly or awaited.

``session_setup`` is what the host runs (silently) after every kernel (re)start to put the
session's working directory and environment in place.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.runtime.edit import EditResult

__all__ = [
    "RUNTIME_NAMES",
    "edit",
    "load_ipython_extension",
    "session_setup",
]

# Names the runtime adds to the user namespace (hidden from %who and namespace snapshots).
RUNTIME_NAMES = ("edit",)
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


def _bash_cell_magic(line: str, cell: str) -> None:
    from orchestrator.runtime.bash import run_bash_cell

    run_bash_cell(line, cell)


def load_ipython_extension(ipython: Any) -> None:
    """IPython extension hook: register ``%%bash`` and push the helpers."""
    # Replaces IPython's own %%bash (a script magic that neither kills the process group on
    # interrupt nor reports the exit status).
    ipython.register_magic_function(_bash_cell_magic, magic_kind="cell", magic_name="bash")
    helpers = {"edit": edit}
    ipython.user_ns.update(helpers)
    ipython.user_ns_hidden.update(helpers)
    for name in COLOR_FORCING_ENV:
        os.environ.pop(name, None)
    os.environ.update(PLAIN_OUTPUT_ENV)


def session_setup(cwd: str, env: Mapping[str, str]) -> int:
    """Apply a session's working directory and environment; return the kernel's pid.

    Run by the host after each kernel start and restart (a warm-pool kernel was started before
    its session was known, and a restarted kernel forgets ``os.environ`` changes).
    """
    os.environ.update(env)
    os.chdir(cwd)
    return os.getpid()
