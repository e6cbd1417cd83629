"""The base system prompt: an immutable, versioned constant (docs/spec.md §6).

Later sections (Continual Harness notes, skills, MCP servers, environment facts) are appended
*after* the base text so a change there never alters the cache-stable prefix.
"""

from __future__ import annotations

import datetime as _dt
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = [
    "BASE_PROMPT_VERSION",
    "FENCED_TURN_REMINDER",
    "IPYTHON_TOOL",
    "MCP_SECTION_HEAD",
    "EnvironmentFacts",
    "build_system_prompt",
    "mcp_prompt_section",
]

BASE_PROMPT_VERSION = 1

_BASE = """\
You are Prime Agent, an autonomous agent that solves tasks by writing and running Python.

Your one tool is `ipython`: a persistent IPython kernel in your own sandbox.
- Variables, imports and the working directory persist between cells. Build on earlier cells.
- Top-level `await` works.
- `%%bash` as the very first line runs the rest of the cell in a fresh shell (nothing persists
  between bash cells); use `%cd DIR` or `os.chdir` to change directory for good.
- The value of the last expression is shown, as in Jupyter; print anything else you need.
- Long output is cut to its first 64 KiB per stream; the full text is saved to a file whose
  path the result names. Read it in slices instead of printing it again.
- Each cell has a time limit (default 600 s; pass `timeout` in seconds to change it). A cell
  past its limit is interrupted; if it cannot be interrupted the kernel restarts and the
  namespace is lost, and the next result says so.
- `edit(path, old, new)` replaces one exact occurrence of `old` in a file and returns the diff.

How to work:
- Look before you act: inspect files, data and errors instead of guessing.
- Prefer small cells that each do one thing; check each result before building on it.
- Verify your answer by running it. Do not claim what you have not checked.
- Ask nothing of the user unless the task cannot go on without it.

When the task is done, reply with the final answer as plain text and no tool call. That reply
is what the user receives, so make it complete and self-contained; keep it short unless the
task asks for more.
"""

# Small local models (the embedded 0.5B and 1.5B) lose the thread in a long prompt: measured
# here, the full base prompt made Qwen2.5-Coder-0.5B answer with a guessed number instead of
# code, while a short one gets code. Short as it is, it must still say what they got wrong on
# real tasks (docs/embedded-model.md, "Which embedded variant"): answering before running any
# code ("2000" for "the number in this file"), and redefining a buggy function in the session
# instead of editing the file the tests import. Two worked examples show both. Fenced-protocol
# models get this variant.
_COMPACT = """\
You solve tasks by running Python code in a persistent IPython session.
To run code, reply with one ```python block; you will then see its output. Use print() to see \
values. Variables persist between blocks.
Never guess: you know nothing about a file or data until your code has printed it. Run code \
first, then answer from its output.

Example: find the line of a file that states a number (use the real file name).
```python
import re
for i, line in enumerate(open("notes.txt").read().splitlines()):
    if re.search(r"[0-9]", line):
        print(i, line)
```

Example: fix a bug. Read the file, change the file on disk with edit(path, old, new) (a \
function defined in the session does not change the file the tests import), then run the tests.
```python
print(open("calc.py").read())
```
```python
edit("calc.py", "return a - b", "return a + b")
!python -m pytest -q
```

If an error repeats, read the file again instead of retrying the same code.
When the output answers the task, reply with the final answer only, without a code block.
"""

# What a fenced model reads last before it answers a user's (or a gate's) message: measured, the
# small models follow the last lines they read, and this made Qwen2.5-Coder-1.5B write the
# search code for tasks it had answered with a guessed number (docs/embedded-model.md). Added to
# the request only (agent/loop.py), never stored.
FENCED_TURN_REMINDER = (
    "\n\n(Reply with one ```python block first; answer only after you have seen its output.)"
)

IPYTHON_TOOL: dict[str, object] = {
    "type": "function",
    "function": {
        "name": "ipython",
        "description": "Run Python code in your persistent IPython kernel and return its output.",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The cell to run."},
                "timeout": {
                    "type": "number",
                    "description": "Time limit for this cell in seconds (default 600).",
                },
            },
            "required": ["code"],
        },
    },
}


@dataclass(frozen=True)
class EnvironmentFacts:
    cwd: str
    model: str
    backend: str
    today: str = ""

    def render(self) -> str:
        today = self.today or _dt.date.today().isoformat()
        return (
            "\n# Environment\n"
            f"- Working directory: {self.cwd}\n"
            f"- Sandbox backend: {self.backend}\n"
            f"- Model: {self.model}\n"
            f"- Date: {today}\n"
            f"- Python: {platform.python_version()}\n"
        )


MCP_LINE_MAX_CHARS: Final = 160  # one tool's line in the prompt: name, arguments, description
MCP_SECTION_HEAD: Final = (
    "\n# MCP servers\n"
    "Each server is a module in the REPL, run on the host: "
    "`await mcp.NAME.TOOL(arg=...)` calls a tool (keyword arguments only); "
    "`help(mcp.NAME)` shows every argument, resource and prompt.\n"
)


def mcp_prompt_section(servers: Sequence[Mapping[str, Any]]) -> str:
    """The servers and their tools, one line each (``mcp.list`` entries; docs/mcp.md)."""
    if not servers:
        return ""
    lines = [MCP_SECTION_HEAD]
    for server in servers:
        name = server.get("name")
        state = server.get("state")
        extra = "" if state == "ready" else f" ({state}: try again later)"
        lines.append(f"- mcp.{name}{extra}\n")
        for tool in server.get("tools") or []:
            schema = tool.get("input_schema") or {}
            props = schema.get("properties") or {}
            required = set(schema.get("required") or [])
            params = ", ".join(p if p in required else f"{p}=…" for p in props)
            about = str(tool.get("description") or "").strip().split("\n", 1)[0]
            line = f"  - {tool.get('name')}({params}): {about}"
            if len(line) > MCP_LINE_MAX_CHARS:
                line = line[: MCP_LINE_MAX_CHARS - 1] + "…"
            lines.append(line + "\n")
        for extra_kind in ("resources", "prompts"):
            count = len(server.get(extra_kind) or [])
            if count:
                lines.append(f"  - {count} {extra_kind}: see help(mcp.{name})\n")
    return "".join(lines)


def build_system_prompt(
    facts: EnvironmentFacts,
    *,
    tool_protocol: Literal["native", "fenced"],
    harness_section: str = "",
    mcp_section: str = "",
    base: str | None = None,
    appended: str | None = None,
) -> str:
    """Base prompt (compact for fenced-protocol models; ``base`` instead when a run gave one:
    ``--system-prompt``) | harness section | environment facts | ``appended``
    (``--append-system-prompt``)."""
    if base is not None:
        parts = [base.rstrip("\n") + "\n"]
    else:
        parts = [_COMPACT if tool_protocol == "fenced" else _BASE]
    if harness_section:
        parts.append("\n" + harness_section.strip() + "\n")
    if mcp_section:
        parts.append(mcp_section)
    parts.append(facts.render())
    if appended:
        parts.append("\n" + appended.strip() + "\n")
    return "".join(parts)
