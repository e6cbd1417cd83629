"""Bounded, cleaned cell output (R10).

Each stream a cell produces (stdout, stderr, result, display, traceback) goes through a
``StreamCleaner`` (ANSI escapes and control characters removed, ``\\r`` handled like a terminal)
into a ``BoundedText`` that keeps at most ``cap`` characters: the head and the tail, with a
``[... truncated N chars ...]`` marker between them. Memory stays bounded whatever the cell
prints; 100 MB of stdout costs a few hundred KiB here.

The full (cleaned) output is kept only when something was cut: on the first cut the collector
opens ``<artifacts_dir>/outputs/<cell_id>.txt``, writes everything seen so far (still in memory
at that moment, since no stream had exceeded its cap yet) and from then on appends every chunk
as it arrives.

Huge output never gets here: the collector asks the kernel (``spill_request``, sent in the
execute_request's metadata) to write a stream past ``SPILL_AFTER_CHARS`` into
``<outputs>/<cell_id>.<stream>.txt`` inside the sandbox (``orchestrator/runtime/spill.py``)
and to send only its tail, with a record of the file (``spilled``). The stream's marker then
names that file and its size; when the spilled streams are all that overflowed, that file is
the cell's artifact and the collector's own (partial) file is removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from orchestrator.sandbox.base import CellError, CellResult, CellStatus, OutputListener

__all__ = [
    "ARTIFACT_SUBDIR",
    "LIVE_OUTPUT_MAX_CHARS",
    "SPILL_AFTER_CHARS",
    "STREAMS",
    "BoundedText",
    "OutputCollector",
    "StreamCleaner",
    "StreamName",
    "StreamSpill",
    "artifact_path_for",
    "clean_text",
    "truncation_marker",
]

StreamName = Literal["stdout", "stderr", "result", "display", "traceback"]
STREAMS: tuple[StreamName, ...] = ("stdout", "stderr", "result", "display", "traceback")
log = logging.getLogger(__name__)

ARTIFACT_SUBDIR = "outputs"
# A line with no newline (a progress bar, 10 MB of "x") is committed once it is this long, so
# the pending-line buffer that ``\r`` handling needs stays bounded too.
MAX_PENDING_LINE_CHARS = 16 * 1024
# An escape sequence split across two chunks is held back at most this long before we give up
# on it being one (real sequences are a few dozen chars; OSC titles can be longer).
MAX_ESCAPE_CARRY_CHARS = 256
ARTIFACT_STREAM_HEADER = "\n===== {name} =====\n"
# A stream past this many characters (raw, in one cell) is written to a file by the kernel
# instead of being sent (orchestrator/runtime/spill.py); at least the cap itself.
SPILL_AFTER_CHARS = 1024 * 1024
# How much of one cell's output a live view is shown as it arrives (the result has it all, up
# to the cap): enough to watch a cell work, not a copy of a flood.
LIVE_OUTPUT_MAX_CHARS = 64 * 1024

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), DCS/SOS/PM/APC (ESC P|X|^|_ ... ST), and
# the remaining two-character escapes. 8-bit C1 controls are removed with the other controls.
_ANSI_RE = re.compile(
    r"""
    \x1b\[[0-?]*[ -/]*[@-~]
    | \x1b\][^\x07\x1b]*(?:\x07|\x1b\\)
    | \x1b[PX^_][^\x1b]*\x1b\\
    | \x1b[ -/]*[0-~]
    """,
    re.VERBOSE,
)
# An escape that may still be completed by the next chunk.
_INCOMPLETE_ESCAPE_RE = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*|[PX^_][^\x1b]*\x1b?|[ -/]*)?\Z"
)
# Control characters except \t \n \r (\r is handled by the line logic), DEL, C1 controls, and
# lone surrogates (from undecodable bytes), which cannot be encoded and are replaced.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_SURROGATE_RE = re.compile(r"[\ud800-\udfff]")
# Everything on a line up to its last \r: what a terminal would have overwritten.
_CR_OVERWRITE_RE = re.compile(r"[^\n]*\r")
_CELL_ID_UNSAFE_RE = re.compile(r"[^A-Za-z0-9._-]")
_REPLACEMENT = "\ufffd"


def truncation_marker(n: int, note: str = "") -> str:
    return f"\n[... truncated {n} chars{note} ...]\n"


@dataclass(frozen=True)
class StreamSpill:
    """A stream the kernel wrote to a file in the sandbox (``runtime/spill.py``'s record)."""

    stream: StreamName
    path: Path
    chars: int
    size_bytes: int
    skipped: int

    @classmethod
    def parse(cls, stream: StreamName, record: Mapping[str, Any]) -> StreamSpill | None:
        try:
            return cls(
                stream=stream,
                path=Path(str(record["path"])),
                chars=max(0, int(record["chars"])),
                size_bytes=int(record["bytes"]),
                skipped=max(0, int(record["skipped"])),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def note(self) -> str:
        size = f" ({self.size_bytes} bytes)" if self.size_bytes >= 0 else ""
        return f"; all {self.chars} chars of {self.stream}{size} are in {self.path}"


def clean_text(text: str) -> str:
    """Clean one complete piece of text (no streaming state)."""
    cleaner = StreamCleaner()
    return cleaner.feed(text) + cleaner.flush()


def artifact_path_for(artifacts_dir: Path, cell_id: str) -> Path:
    # cell_id comes from our own caller, but it still becomes a file name: confine it (R14).
    safe = _CELL_ID_UNSAFE_RE.sub("_", cell_id).lstrip(".") or "cell"
    return artifacts_dir / ARTIFACT_SUBDIR / f"{safe}.txt"


class StreamCleaner:
    """Streaming cleaner: chunks in, clean committed text out.

    ``\\r\\n`` is a newline; a lone ``\\r`` discards the current line so far (a progress bar
    shows its last state). Text after the last newline is held as the pending line until a
    newline, ``flush()``, or ``MAX_PENDING_LINE_CHARS``.
    """

    def __init__(self) -> None:
        self._carry = ""  # an unfinished escape sequence or a trailing \r
        self._line = ""  # the pending (uncommitted) line

    def feed(self, chunk: str) -> str:
        text = self._carry + chunk
        self._carry = ""
        incomplete = _INCOMPLETE_ESCAPE_RE.search(text)
        if incomplete and len(text) - incomplete.start() <= MAX_ESCAPE_CARRY_CHARS:
            self._carry = text[incomplete.start() :]
            text = text[: incomplete.start()]
        elif text.endswith("\r"):
            # Might be the first half of \r\n.
            self._carry = "\r"
            text = text[:-1]
        text = _ANSI_RE.sub("", text)
        text = _CONTROL_RE.sub("", text)
        text = _SURROGATE_RE.sub(_REPLACEMENT, text)
        return self._lines(text.replace("\r\n", "\n"))

    def flush(self) -> str:
        tail = self._carry
        self._carry = ""
        out = ""
        if tail and tail != "\r":
            # An escape that never finished: drop the ESC and keep the rest as text.
            out = self._lines(_CONTROL_RE.sub("", tail.replace("\x1b", "")).replace("\r", ""))
        out += self._line
        self._line = ""
        return out

    def _lines(self, text: str) -> str:
        if "\r" in text:
            first_nl = text.find("\n")
            if "\r" in (text if first_nl < 0 else text[:first_nl]):
                self._line = ""  # the pending line was overwritten
            text = _CR_OVERWRITE_RE.sub("", text)
        last_nl = text.rfind("\n")
        if last_nl < 0:
            self._line += text
            out = ""
        else:
            out = self._line + text[: last_nl + 1]
            self._line = text[last_nl + 1 :]
        if len(self._line) >= MAX_PENDING_LINE_CHARS:
            out += self._line
            self._line = ""
        return out


class BoundedText:
    """At most ``cap`` characters of a stream: its head and tail around a truncation marker."""

    def __init__(self, cap: int):
        if cap < len(truncation_marker(10**12)) * 2:
            raise ValueError(f"output cap {cap} is too small")
        self.cap = cap
        self.total = 0
        self._head: list[str] = []
        self._head_len = 0
        self._tail: deque[str] = deque()
        self._tail_len = 0
        self.note = ""  # added to the marker (where the complete stream is)
        self._head_closed = False  # after a skip: what follows is tail, never head

    @property
    def overflowed(self) -> bool:
        return self.total > self.cap

    def skip(self, n: int, note: str) -> None:
        """``n`` characters the host never saw come here; what follows is a new tail."""
        self.total += n
        self.note = note
        self._head_closed = True
        self._tail.clear()
        self._tail_len = 0

    def add(self, text: str) -> None:
        if not text:
            return
        self.total += len(text)
        half = self.cap // 2
        if self._head_len < half and not self._head_closed:
            take = text[: half - self._head_len]
            self._head.append(take)
            self._head_len += len(take)
            text = text[len(take) :]
        if not text:
            return
        if len(text) >= half:
            # Only the last ``half`` chars of a big chunk can survive; drop the rest now.
            self._tail.clear()
            self._tail_len = 0
            text = text[-half:]
        self._tail.append(text)
        self._tail_len += len(text)
        # Drop whole chunks that the rest already covers; bounds the tail to < 2 * half chars
        # without re-slicing a chunk on every add.
        while self._tail_len - len(self._tail[0]) >= half:
            self._tail_len -= len(self._tail.popleft())

    def text(self) -> tuple[str, int]:
        """Return (bounded text, chars cut)."""
        head = "".join(self._head)
        tail = "".join(self._tail)
        if self.total <= self.cap:
            return head + tail, 0
        # Fit head + marker + tail into the cap; the marker's length depends on the count.
        cut = self.total - self.cap
        for _ in range(3):
            room = max(0, self.cap - len(truncation_marker(cut, self.note)))
            head_len = min(len(head), room // 2)
            tail_len = min(len(tail), room - head_len)
            cut = self.total - head_len - tail_len
        tail_part = tail[len(tail) - tail_len :] if tail_len else ""
        return head[:head_len] + truncation_marker(cut, self.note) + tail_part, cut


class OutputCollector:
    """Everything one cell printed, bounded and cleaned; see the module docstring."""

    def __init__(
        self, *, cap_chars: int, artifact_path: Path, listener: OutputListener | None = None
    ):
        self.cap_chars = cap_chars
        self.artifact_path = artifact_path
        # Shown live (a client's view of the running cell), up to LIVE_OUTPUT_MAX_CHARS: what
        # the model is given is the result, bounded by the cap, never this.
        self._listener = listener
        self._live_chars = 0
        self._cleaners = {name: StreamCleaner() for name in STREAMS}
        self._texts = {name: BoundedText(cap_chars) for name in STREAMS}
        # Until the first cut, the chronological log of committed chunks (bounded: no stream
        # has passed its cap yet); afterwards None and chunks go straight to the file.
        self._log: list[tuple[StreamName, str]] | None = []
        self._artifact: IO[str] | None = None
        self._artifact_stream: StreamName | None = None
        self._artifact_saved = False  # True once the file holds everything so far
        self._artifact_midline = False  # the file does not end with a newline
        self._error: tuple[str, str] | None = None
        self._notes: list[str] = []
        self._spills: dict[StreamName, StreamSpill] = {}

    # --- input ----------------------------------------------------------------------------

    def add(self, stream: StreamName, text: str) -> None:
        self._commit(stream, self._cleaners[stream].feed(text))

    def add_block(self, stream: StreamName, text: str, spill: Any = None) -> None:
        """A self-contained piece (a result or display repr): committed with a newline.

        ``spill``: the kernel wrote the whole piece to a file and sent head + tail (``text``
        split after ``spill["head"]`` characters)."""
        head_len = len(text)
        if isinstance(spill, Mapping) and isinstance(spill.get("head"), int):
            head_len = max(0, min(len(text), spill["head"]))
        cleaner = self._cleaners[stream]
        cleaned = cleaner.feed(text[:head_len])
        if head_len == len(text):
            cleaned += cleaner.flush()
        if self._texts[stream].total and cleaned:
            cleaned = "\n" + cleaned
        self._commit(stream, cleaned)
        if head_len < len(text) or spill is not None:
            if isinstance(spill, Mapping):
                self.spilled(stream, spill)
            self._commit(stream, cleaner.feed(text[head_len:]) + cleaner.flush())

    def set_error(self, ename: str, evalue: str, traceback: list[str]) -> None:
        self._error = (clean_text(ename)[: self.cap_chars], clean_text(evalue))
        for line in traceback:
            self.add_block("traceback", line)

    def spill_request(self) -> dict[str, str | int]:
        """What the kernel needs to spill this cell's huge streams (execute_request metadata):
        next to the collector's own artifact, in a directory the kernel can write."""
        return {
            "dir": str(self.artifact_path.parent),
            "cell": self.artifact_path.stem,
            "after": max(SPILL_AFTER_CHARS, self.cap_chars),
            "tail": self.cap_chars,
        }

    def spilled(self, stream: StreamName, record: Mapping[str, Any]) -> None:
        """The kernel wrote ``stream`` to a file; the text that follows is its tail."""
        spill = StreamSpill.parse(stream, record)
        if spill is None:
            return
        self._commit(stream, self._cleaners[stream].flush())
        self._spills.setdefault(stream, spill)  # several displays: the first is the artifact
        self._texts[stream].skip(spill.skipped, spill.note())
        pointer = truncation_marker(spill.skipped, spill.note()).lstrip("\n")
        if self._log is not None:
            self._log.append((stream, pointer))
            if self._texts[stream].overflowed:
                self._open_artifact()
        else:
            self._write_artifact(stream, pointer)

    def note(self, text: str) -> None:
        """Something the host wants the model to read (e.g. a dropped oversized message)."""
        self._notes.append(text)

    # --- output ---------------------------------------------------------------------------

    def result(
        self,
        status: CellStatus,
        *,
        duration_ms: float = 0.0,
        kernel_restarted: bool = False,
        notice: str = "",
    ) -> CellResult:
        for name in STREAMS:
            self._commit(name, self._cleaners[name].flush())
        self.close()
        fields: dict[str, str] = {}
        truncated = 0
        for name in STREAMS:
            fields[name], cut = self._texts[name].text()
            truncated += cut
        error = None
        if self._error is not None:
            ename, evalue = self._error
            bounded = BoundedText(self.cap_chars)
            bounded.add(evalue)
            evalue_text, cut = bounded.text()
            truncated += cut
            error = CellError(ename=ename, evalue=evalue_text, traceback=fields["traceback"])
        notice = " ".join(part for part in [notice, *self._notes] if part)
        artifact, size = self._artifact_for_result()
        return CellResult(
            status=status,
            stdout=fields["stdout"],
            stderr=fields["stderr"],
            result=fields["result"],
            display=fields["display"],
            error=error,
            duration_ms=duration_ms,
            truncated_chars=truncated,
            artifact_path=artifact,
            artifact_bytes=size,
            kernel_restarted=kernel_restarted,
            notice=notice,
        )

    def close(self) -> None:
        if self._artifact is not None:
            self._artifact.close()
            self._artifact = None

    # --- internals ------------------------------------------------------------------------

    def _artifact_for_result(self) -> tuple[Path | None, int]:
        """The file that holds the cell's complete output, and its size."""
        own_needed = any(
            text.overflowed for name, text in self._texts.items() if name not in self._spills
        )
        if self._spills and not own_needed:
            # The kernel's files hold every stream that was cut: ours would be a partial copy.
            if self._artifact_saved:
                with contextlib.suppress(OSError):
                    self.artifact_path.unlink()
                self._artifact_saved = False
            spill = next(self._spills[name] for name in STREAMS if name in self._spills)
            return spill.path, max(0, spill.size_bytes)
        if not self._artifact_saved:
            return None, 0
        try:
            return self.artifact_path, os.path.getsize(self.artifact_path)
        except OSError:
            return self.artifact_path, 0

    def _commit(self, stream: StreamName, text: str) -> None:
        if not text:
            return
        if self._listener is not None and self._live_chars < LIVE_OUTPUT_MAX_CHARS:
            piece = text[: LIVE_OUTPUT_MAX_CHARS - self._live_chars]
            self._live_chars += len(piece)
            try:
                self._listener(stream, piece)
            except Exception:  # a view's failure is never the cell's
                log.exception("live output listener failed; it is dropped for this cell")
                self._listener = None
        bounded = self._texts[stream]
        bounded.add(text)
        if self._log is not None:
            self._log.append((stream, text))
            if bounded.overflowed:
                self._open_artifact()
        else:
            self._write_artifact(stream, text)

    def _open_artifact(self) -> None:
        assert self._log is not None
        log, self._log = self._log, None
        try:
            self.artifact_path.parent.mkdir(parents=True, exist_ok=True)
            self._artifact = open(  # noqa: SIM115 - closed in result()/close()
                self.artifact_path, "w", encoding="utf-8", errors="replace"
            )
        except OSError as exc:
            self._artifact_failed(exc)
            return
        self._artifact_saved = True
        for stream, text in log:
            self._write_artifact(stream, text)

    def _write_artifact(self, stream: StreamName, text: str) -> None:
        if self._artifact is None:
            return
        try:
            if stream != self._artifact_stream:
                header = ARTIFACT_STREAM_HEADER.format(name=stream)
                # Headers start on a line of their own.
                self._artifact.write(header if self._artifact_midline else header[1:])
                self._artifact_stream = stream
            self._artifact.write(text)
            self._artifact_midline = not text.endswith("\n")
        except OSError as exc:
            self._artifact_failed(exc)

    def _artifact_failed(self, exc: OSError) -> None:
        # A full disk must not fail the cell: the bounded output is still returned.
        self.note(f"[full output could not be saved: {exc.strerror or exc}]")
        if self._artifact is not None:
            with contextlib.suppress(OSError):
                self._artifact.close()
        self._artifact = None
        self._artifact_saved = False
