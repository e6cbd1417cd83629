"""Event sinks for the CLI: JSON lines on stdout, or human progress on stderr."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

__all__ = ["JsonLinesSink", "ProgressSink"]

PREVIEW_CHARS = 160


class JsonLinesSink:
    """``--mode json``: every event as one JSON line, flushed at once."""

    def __init__(self, out: TextIO | None = None):
        self.out = out or sys.stdout

    def __call__(self, event: dict[str, Any]) -> None:
        self.out.write(json.dumps(event, ensure_ascii=False, default=str) + "\n")
        self.out.flush()


class ProgressSink:
    """Print mode on a terminal: streamed text dimmed, one line per cell, on stderr."""

    DIM = "\x1b[2m"
    RESET = "\x1b[0m"

    def __init__(self, err: TextIO | None = None):
        self.err = err or sys.stderr
        self._mid_line = False

    def _line(self, text: str) -> None:
        if self._mid_line:
            self.err.write("\n")
            self._mid_line = False
        self.err.write(text + "\n")
        self.err.flush()

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "text_delta":
            self.err.write(self.DIM + str(event.get("delta", "")) + self.RESET)
            self.err.flush()
            self._mid_line = True
        elif kind == "tool_start":
            try:
                code = json.loads(event.get("arguments") or "{}").get("code", "")
            except (ValueError, AttributeError):
                code = ""
            first = (code.strip().splitlines() or [""])[0][:PREVIEW_CHARS]
            self._line(f"» ipython: {first}")
        elif kind == "tool_result":
            payload = event.get("payload", {})
            first = (str(payload.get("text", "")).strip().splitlines() or [""])[0]
            mark = "✗" if payload.get("is_error") else "✓"
            self._line(f"  {mark} {first[:PREVIEW_CHARS]}")
        elif kind == "retry":
            payload = event.get("payload", {})
            self._line(
                f"  ↻ retrying in {payload.get('delay_s', 0):.1f} s: {payload.get('reason')}"
            )
        elif kind == "error":
            self._line(f"  ✗ {event.get('payload', {}).get('message', '')}")
        elif kind == "assistant_message" and self._mid_line:
            self.err.write("\n")
            self._mid_line = False
