"""The fenced-code tool protocol for models that do not emit native tool calls.

The first ```python block of a reply (an unclosed one too) is the ``ipython`` call. As a
fallback a ```json block naming the tool (``{"name": "ipython", "arguments": {"code": ...}}``,
the shape small Qwen models produce when shown a tool schema) is accepted. Everything after the
first block is ignored: small models add prose after the code even when told not to.
"""

from __future__ import annotations

import json
import re

__all__ = ["extract_fenced_call", "render_fenced_result"]

_PY_FENCE = re.compile(r"```[ \t]*(?:python3?|py|ipython)[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)
_JSON_FENCE = re.compile(r"```[ \t]*json[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)
TOOL_NAME = "ipython"


def _from_json_block(body: str) -> str | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("name") != TOOL_NAME:
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if isinstance(args, dict) and isinstance(args.get("code"), str):
        return str(args["code"])
    return None


def extract_fenced_call(text: str) -> tuple[str, str] | None:
    """Return ``(code, text_before_block)`` for the first call in ``text``, or None."""
    match = _PY_FENCE.search(text)
    if match is not None:
        code = match.group(1).rstrip()
        if code.strip():
            return code, text[: match.start()].rstrip()
    for jmatch in _JSON_FENCE.finditer(text):
        code = _from_json_block(jmatch.group(1).strip())
        if code is not None and code.strip():
            return code, text[: jmatch.start()].rstrip()
    return None


def render_fenced_result(result_text: str) -> str:
    """How a tool result is shown to a fenced-protocol model (as a user message)."""
    return f"Output of your code:\n```\n{result_text}\n```"
