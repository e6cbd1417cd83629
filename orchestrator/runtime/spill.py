"""Huge cell output goes to a file inside the sandbox, not over the wire (R10).

The host bounds what the model reads to a head and a tail per stream (``sandbox/output.py``);
everything in between would only cross ZMQ, the gateway and the websocket to be thrown away,
and one ``sys.stdout.write('x' * 100_000_000)`` is a single 100 MB message that no bounded
client can take. So the kernel cuts first, when the host asks for it: an ``execute_request``
whose metadata carries ``SPILL_METADATA_KEY`` = ``{"dir", "cell", "after", "tail"}``.

For such a cell, per stream (stdout, stderr; ``print``, ``sys.stdout.write``, and fd-level
output of child processes, which ipykernel reads back into the same stream):

- the first ``after`` characters go out as usual (and are remembered);
- at the first character past them the stream is **spilled**: ``<dir>/<cell>.<stream>.txt`` is
  opened, gets everything the cell wrote to that stream so far, and from then on every write;
  nothing more is sent, only the last ``tail`` characters are kept in memory;
- when the cell ends (``post_execute``) the file is closed and ONE stream message goes out
  with the tail as its text and ``SPILL_CONTENT_KEY`` = ``{"path", "chars", "bytes",
  "skipped"}``: where the complete stream is, how big, and how many characters the host never
  saw. Other Jupyter clients ignore the extra key and just see head and tail.

The file holds exactly what the cell wrote to that stream (UTF-8; a lone surrogate is written
backslash-escaped). Output a cell's threads write after it ended is sent as usual.

Results and displays are one message each (``session.send``, wrapped): a ``text/plain`` over
``after`` goes to ``<cell>.result.txt`` / ``<cell>.display[-N].txt`` and is sent as head + tail
with the same record (plus ``head``, where the head ends); other huge forms (HTML) are dropped.
An exception with a huge message (in the ``error`` message and again in the ``execute_reply``)
goes to ``<cell>.traceback.txt``; both are sent with a bounded evalue and traceback that name
the file. Stdlib only, installed by the runtime extension (``orchestrator/runtime/__init__.py``).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import IO, Any

__all__ = ["SPILL_CONTENT_KEY", "SPILL_METADATA_KEY", "SPILL_STREAMS", "install", "spill_path"]

SPILL_METADATA_KEY = "prime_agent_spill"  # in an execute_request's metadata (host -> kernel)
SPILL_CONTENT_KEY = "prime_agent_spill"  # in the closing stream message's content
SPILL_STREAMS = ("stdout", "stderr")
# An exception is sent twice: as iopub ``error`` and in the ``execute_reply``.
ERROR_TYPES = ("error", "execute_reply")
# Messages that are one block each, and the host's name for them.
BLOCK_KINDS = {
    "execute_result": "result",
    "display_data": "display",
    "update_display_data": "display",
}
SPILL_FILE_ENCODING = "utf-8"
SPILL_FILE_ERRORS = "backslashreplace"
_UNSAFE_NAME_RE = re.compile(r"[^A-Za-z0-9._-]")


def spill_path(directory: str, cell: str, stream: str) -> str:
    """``<dir>/<cell>.<stream>.txt``; the cell id is confined to a plain file name."""
    safe = _UNSAFE_NAME_RE.sub("_", cell).lstrip(".") or "cell"
    return os.path.join(directory, f"{safe}.{stream}.txt")


class _Tail:
    """The last ``limit`` characters written, kept as whole chunks (no re-slicing per write)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._chunks: deque[str] = deque()
        self._len = 0

    def add(self, text: str) -> None:
        if len(text) >= self.limit:
            self._chunks.clear()
            self._len = 0
            text = text[-self.limit :]
        self._chunks.append(text)
        self._len += len(text)
        while self._len - len(self._chunks[0]) >= self.limit:
            self._len -= len(self._chunks.popleft())

    def text(self) -> str:
        return "".join(self._chunks)[-self.limit :] if self.limit else ""


class _StreamSpill:
    """One stream of one cell: passing through, then (past ``after``) into its file."""

    def __init__(self, path: str, after: int, tail: int) -> None:
        self.path = path
        self.after = after
        self.sent: list[str] = []  # what went out, until the spill (at most ``after`` chars)
        self.sent_chars = 0
        self.chars = 0  # everything the cell wrote to this stream
        self.file: IO[str] | None = None
        self.failed = ""
        self.tail = _Tail(tail)

    def write(self, text: str, send: Callable[[str], Any]) -> None:
        self.chars += len(text)
        if self.failed:
            send(text)  # no file (full disk, read-only dir): the host bounds what it gets
            return
        if self.file is None:
            room = self.after - self.sent_chars
            if len(text) <= room:
                self.sent.append(text)
                self.sent_chars += len(text)
                send(text)
                return
            if room > 0:  # the head fills up; the file gets all of ``text`` below
                send(text[:room])
                self.sent_chars += room
            self._open()
            if self.file is None:
                send(text[max(room, 0) :])
                return
        try:
            self.file.write(text)
        except OSError as exc:
            self._fail(exc)
            send(text)
            return
        self.tail.add(text)

    def _open(self) -> None:
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.file = open(  # noqa: SIM115 - closed in close()
                self.path, "w", encoding=SPILL_FILE_ENCODING, errors=SPILL_FILE_ERRORS
            )
            for piece in self.sent:
                self.file.write(piece)
        except OSError as exc:
            self._fail(exc)
        self.sent = []

    def _fail(self, exc: OSError) -> None:
        self.failed = exc.strerror or str(exc)
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
        self.file = None

    def close(self) -> dict[str, Any] | None:
        """Close the file; the spill record for the host (None when nothing was spilled)."""
        if self.file is None:
            return None
        try:
            self.file.close()
            size = os.path.getsize(self.path)
        except OSError:
            size = -1
        self.file = None
        tail = self.tail.text()
        return {
            "path": self.path,
            "chars": self.chars,
            "bytes": size,
            "skipped": self.chars - self.sent_chars - len(tail),
            "tail": tail,
        }


class _Request:
    """What the host asked for one cell."""

    def __init__(self, directory: str, cell: str, after: int, tail: int) -> None:
        self.directory = directory
        self.cell = cell
        self.after = after
        self.tail = tail
        self.counts: dict[str, int] = {}  # blocks spilled so far, per kind
        self.traceback = ""  # the pointer to its traceback file, once written


class _Spiller:
    """The kernel-wide state: the cells that asked for spilling, by execute_request msg_id."""

    def __init__(self, ipython: Any) -> None:
        self.ipython = ipython
        self.lock = threading.RLock()
        self.cells: dict[str, dict[str, _StreamSpill]] = {}
        # The cell in flight (msg_id -> its request), kept until its execute_reply went out:
        # the reply may carry a huge exception too.
        self.requests: dict[str, _Request] = {}
        self.pid = os.getpid()
        self.streams: dict[str, Any] = {}

    def wrap(self, stream: Any, name: str) -> None:
        original = stream.write
        self.streams[name] = stream

        def write(text: str) -> int | None:
            if not isinstance(text, str) or os.getpid() != self.pid:
                return original(text)  # type: ignore[no-any-return]
            parent = (stream.parent_header or {}).get("msg_id")
            with self.lock:
                cell = self.cells.get(parent) if parent else None
                spill = cell.get(name) if cell is not None else None
                if spill is None:
                    return original(text)  # type: ignore[no-any-return]
                spill.write(text, original)
            return len(text)

        stream.write = write

    def pre_execute(self) -> None:
        kernel = getattr(self.ipython, "kernel", None)
        if kernel is None:
            return
        with contextlib.suppress(Exception):
            parent = kernel.get_parent("shell")
            request = (parent.get("metadata") or {}).get(SPILL_METADATA_KEY)
            msg_id = parent["header"]["msg_id"]
            if not isinstance(request, dict) or not msg_id:
                return
            directory, cell = str(request["dir"]), str(request["cell"])
            after, tail = int(request["after"]), int(request["tail"])
            with self.lock:
                self.cells[msg_id] = {
                    name: _StreamSpill(spill_path(directory, cell, name), after, tail)
                    for name in self.streams
                }
                self.requests = {msg_id: _Request(directory, cell, after, tail)}

    def post_execute(self) -> None:
        kernel = getattr(self.ipython, "kernel", None)
        if kernel is None or not self.cells:
            return
        with contextlib.suppress(Exception):
            parent = kernel.get_parent("shell")
            msg_id = parent["header"]["msg_id"]
            for stream in self.streams.values():
                stream.flush()  # what was sent of the head goes out before the tail
            with self.lock:
                cell = self.cells.pop(msg_id, None)
            for name, spill in (cell or {}).items():
                record = spill.close()
                if record is not None:
                    self._send_tail(self.streams[name], name, parent, record)

    def _send_tail(self, stream: Any, name: str, parent: Any, record: dict[str, Any]) -> None:
        tail = record.pop("tail")
        content = {"name": name, "text": tail, SPILL_CONTENT_KEY: record}
        msg = stream.session.msg("stream", content, parent=parent)
        stream.session.send(stream.pub_thread, msg, ident=stream.topic)

    def wrap_session(self, session: Any) -> None:
        """Results and displays are one message each (``session.send`` from the displayhook
        and the display publisher): a huge ``text/plain`` goes to ``<cell>.<kind>.txt``."""
        original = session.send

        def send(stream: Any, msg_or_type: Any, content: Any = None, *args: Any, **kw: Any) -> Any:
            with contextlib.suppress(Exception):
                if isinstance(msg_or_type, dict):
                    kind = BLOCK_KINDS.get(msg_or_type["header"]["msg_type"])
                    if kind is not None:
                        parent = msg_or_type.get("parent_header") or {}
                        msg_or_type["content"] = self.spill_block(
                            kind, parent, msg_or_type["content"]
                        )
                elif msg_or_type in BLOCK_KINDS and isinstance(content, dict):
                    parent = args[0] if args else kw.get("parent")
                    parent = (parent or {}).get("header", parent) or {}
                    content = self.spill_block(BLOCK_KINDS[msg_or_type], parent, content)
                elif msg_or_type in ERROR_TYPES and isinstance(content, dict):
                    parent = args[0] if args else kw.get("parent")
                    parent = (parent or {}).get("header", parent) or {}
                    content = self.spill_error(parent, content)
                    if msg_or_type == "execute_reply":
                        self.requests.pop(str(parent.get("msg_id", "")), None)
            return original(stream, msg_or_type, content, *args, **kw)

        session.send = send

    def spill_error(self, parent: dict[str, Any], content: dict[str, Any]) -> Any:
        """An exception with a huge message is in the ``error`` message AND the reply: both
        get a bounded evalue and traceback that name ``<cell>.traceback.txt``."""
        evalue, traceback = content.get("evalue"), content.get("traceback")
        request = self.requests.get(str(parent.get("msg_id", "")))
        if request is None or not isinstance(evalue, str) or not isinstance(traceback, list):
            return content
        text = "\n".join(str(line) for line in traceback)
        if len(evalue) + len(text) <= request.after:
            return content
        if not request.traceback:  # the reply repeats what the error message had
            path = spill_path(request.directory, request.cell, "traceback")
            try:
                os.makedirs(request.directory, exist_ok=True)
                with open(path, "w", encoding=SPILL_FILE_ENCODING, errors=SPILL_FILE_ERRORS) as f:
                    f.write(text + "\n")
                size = os.path.getsize(path)
            except OSError:
                return content
            request.traceback = f"the whole traceback ({size} bytes) is in {path}"
        return {
            **content,
            "evalue": _cut(evalue, request.tail, request.traceback),
            "traceback": [_cut(text, request.tail, request.traceback)],
        }

    def spill_block(self, kind: str, parent: dict[str, Any], content: dict[str, Any]) -> Any:
        data = content.get("data")
        request = self.requests.get(str(parent.get("msg_id", "")))
        if request is None or not isinstance(data, dict):
            return content
        directory, cell, after, tail = request.directory, request.cell, request.after, request.tail
        big = {k for k, v in data.items() if isinstance(v, str) and len(v) > after}
        if not big:
            return content
        request.counts[kind] = n = request.counts.get(kind, 0) + 1
        name = kind if n == 1 else f"{kind}-{n}"
        text = data.get("text/plain")
        kept = {k: v for k, v in data.items() if k not in big}
        if not isinstance(text, str) or "text/plain" not in big:
            return {**content, "data": kept}  # only other forms were huge: dropped
        path = spill_path(directory, cell, name)
        try:
            os.makedirs(directory, exist_ok=True)
            with open(path, "w", encoding=SPILL_FILE_ENCODING, errors=SPILL_FILE_ERRORS) as fh:
                fh.write(text)
            size = os.path.getsize(path)
        except OSError:
            return content  # no file: sent as it is, the host bounds (or drops) it
        head, rest = text[: tail // 2], text[tail // 2 :]
        end = rest[-(tail - len(head)) :] if tail > len(head) else ""
        record = {
            "path": path,
            "chars": len(text),
            "bytes": size,
            "skipped": len(text) - len(head) - len(end),
            "head": len(head),
        }
        kept["text/plain"] = head + end
        return {**content, "data": kept, SPILL_CONTENT_KEY: record}


def _cut(text: str, keep: int, pointer: str) -> str:
    """At most ``keep`` characters (the host's cap: it keeps them all, pointer included)."""
    if len(text) <= keep:
        return text
    middle = f"\n[... {len(text)} chars cut; {pointer} ...]\n"
    half = max(0, (keep - len(middle)) // 2)
    return f"{text[:half]}{middle}{text[len(text) - half :]}"


def install(ipython: Any) -> None:
    """Wrap the kernel's stdout/stderr and register the cell hooks (a no-op outside
    ipykernel, where there is no iopub stream to protect)."""
    streams = {name: getattr(sys, name, None) for name in SPILL_STREAMS}
    if not all(hasattr(s, "session") and hasattr(s, "parent_header") for s in streams.values()):
        return
    spiller = _Spiller(ipython)
    for name, stream in streams.items():
        spiller.wrap(stream, name)
    session = getattr(getattr(ipython, "kernel", None), "session", None)
    if session is not None:
        spiller.wrap_session(session)
    ipython.events.register("pre_execute", spiller.pre_execute)
    ipython.events.register("post_execute", spiller.post_execute)
