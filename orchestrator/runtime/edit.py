"""``edit(path, old, new)``: exact single-occurrence replace that returns a unified diff.

The model calls it as ``await edit(...)`` (docs/spec.md §3) or plainly; ``EditResult`` is a ``str``
that is also awaitable, so both spellings work and neither needs an event loop.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import tempfile
from collections.abc import Generator
from typing import Any

__all__ = ["EditError", "EditResult", "edit_file"]

DIFF_CONTEXT_LINES = 3


class EditError(ValueError):
    """An edit that cannot be applied; the message says why and what to do."""


class EditResult(str):
    """The unified diff of an applied edit; awaitable, and shown as the diff itself."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, EditResult]:
        # A generator that returns at once: ``await`` works without scheduling anything.
        return self
        yield  # pragma: no cover - makes this function a generator

    def __repr__(self) -> str:
        return str(self) if self else "(no changes)"


def edit_file(path: str | os.PathLike[str], old: str, new: str) -> EditResult:
    if not isinstance(old, str) or not isinstance(new, str):
        raise EditError("old and new must be strings")
    if old == "":
        raise EditError("old is empty; pass the exact text to replace")
    target = os.path.expanduser(os.fspath(path))
    try:
        # newline="" keeps \r\n line endings as they are.
        with open(target, encoding="utf-8", newline="") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise EditError(f"{target}: no such file") from None
    except IsADirectoryError:
        raise EditError(f"{target}: is a directory") from None
    except UnicodeDecodeError:
        raise EditError(f"{target}: not a UTF-8 text file") from None
    count = text.count(old)
    if count == 0:
        raise EditError(
            f"{target}: old text not found (it must match exactly, whitespace included)"
        )
    if count > 1:
        raise EditError(
            f"{target}: old text occurs {count} times; include more surrounding lines so it "
            "occurs exactly once"
        )
    updated = text.replace(old, new, 1)
    if updated != text:
        # Through a symlink, edit the file it points to rather than replacing the link.
        _write_atomically(os.path.realpath(target), updated)
    diff = difflib.unified_diff(
        text.splitlines(keepends=True),
        updated.splitlines(keepends=True),
        fromfile=f"a/{os.fspath(path)}",
        tofile=f"b/{os.fspath(path)}",
        n=DIFF_CONTEXT_LINES,
    )
    return EditResult("".join(line if line.endswith("\n") else line + "\n" for line in diff))


def _write_atomically(target: str, text: str) -> None:
    # Write beside the file and rename over it: a crash mid-write never leaves half a file.
    directory = os.path.dirname(os.path.abspath(target))
    mode = os.stat(target).st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=".edit-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
