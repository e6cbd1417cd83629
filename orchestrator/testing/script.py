"""The scripted-model language: parse a script into steps and walk it, one step per request.

A script is plain text, written inline in tests as a triple-quoted string (it is dedented
first). Steps are separated by lines of three or more dashes; each model request consumes the
next step. Inside a step, a directive that ends with ``:`` takes content: inline after the colon
or as an indented block on the following lines (blank lines inside a block are kept)::

    text: Let me compute that.
    code:
        x = 6 * 7
        print(x)
    usage in=120 out=30
    ---
    when "42": text: The answer is 42.
    else:
        code: print("retry")
    ---
    429 retry-after=2
    ---
    repeat 3:
        code: print(1)

docs/testing.md is the full reference. This module knows nothing about HTTP: the server
(``fake_model``) turns a ``Step`` into OpenAI wire format.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus

__all__ = [
    "DEFAULT_BAD_TOOL_ARGUMENTS",
    "DEFAULT_FILLER_TEXT",
    "FINISH_REASONS",
    "IPYTHON_TOOL_NAME",
    "MAX_STATUS",
    "MIN_STATUS",
    "CallPart",
    "CodePart",
    "Guarded",
    "HttpFault",
    "Item",
    "NoBranchMatched",
    "Part",
    "Repeat",
    "Script",
    "ScriptCursor",
    "ScriptError",
    "ScriptExhausted",
    "ScriptRuntimeError",
    "Step",
    "StepBody",
    "TextPart",
    "Usage",
    "WhenBranch",
    "fenced_json_call",
    "fenced_python",
    "parse_script",
]

IPYTHON_TOOL_NAME = "ipython"
# What ``bad-tool-json`` sends when no raw arguments are given: a JSON object missing its end.
DEFAULT_BAD_TOOL_ARGUMENTS = '{"code": "print(1)"'
# What a ``slow`` or ``cut`` step says when it has no content of its own.
DEFAULT_FILLER_TEXT = "This is a scripted reply from the fake model, long enough to stream."
FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})
MIN_STATUS = 400
MAX_STATUS = 599
STATUS_DIGITS = 3
SEPARATOR_MIN_DASHES = 3
USAGE_KEYS = ("in", "out", "cache_read")

_SEPARATOR_RE = re.compile(rf"^-{{{SEPARATOR_MIN_DASHES},}}\s*$")
_KEYWORD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*")
_WHEN_RE = re.compile(r"""^\s+(?:(re)\s+)?("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')\s*:(.*)$""")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_PREVIEW_CHARS = 200


class ScriptError(ValueError):
    """The script text is malformed; ``line`` is 1-based within the text given."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"fake model script, line {line}: {message}")
        self.line = line
        self.reason = message


class ScriptRuntimeError(Exception):
    """A request could not be answered from the script (the server replies HTTP 400)."""


class ScriptExhausted(ScriptRuntimeError):
    def __init__(self, served: int) -> None:
        super().__init__(f"fake model: script exhausted after {served} requests")
        self.served = served


class NoBranchMatched(ScriptRuntimeError):
    def __init__(self, line: int, last_text: str) -> None:
        preview = (
            last_text if len(last_text) <= _PREVIEW_CHARS else last_text[:_PREVIEW_CHARS] + "…"
        )
        super().__init__(
            f"fake model: no `when` branch of the step at script line {line} matched the last "
            f"message and there is no `else`; last message: {preview!r}"
        )
        self.line = line


# --- the step model -------------------------------------------------------------------------


@dataclass(frozen=True)
class TextPart:
    """Assistant prose (also the rendered ``raw-fenced`` variants)."""

    text: str


@dataclass(frozen=True)
class ThinkPart:
    """The model's reasoning before its reply (``think:``): streamed as ``reasoning_content``
    deltas ahead of the content, and in the message's ``reasoning_content`` when not streamed."""

    text: str


@dataclass(frozen=True)
class CodePart:
    """One ``ipython`` call: a native tool call, or a fenced python block when tools are absent."""

    code: str


@dataclass(frozen=True)
class CallPart:
    """A tool call whose name and raw argument string are sent exactly as written."""

    name: str
    arguments: str


Part = TextPart | CodePart | CallPart | ThinkPart


@dataclass(frozen=True)
class Usage:
    """Token counts for one reply; ``None`` fields are estimated from the text."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cache_read_tokens: int | None = None


@dataclass(frozen=True)
class HttpFault:
    """Answer with an HTTP error instead of a completion."""

    status: int
    retry_after_s: float | None = None
    message: str | None = None
    overflow: bool = False  # 400 context_length_exceeded in OpenAI's words
    garbage: bool = False  # 200 with a body that is no completion (``GARBAGE_BODY``)


@dataclass(frozen=True)
class Step:
    """One reply (or one fault) served to one request."""

    line: int
    parts: tuple[Part, ...] = ()
    fault: HttpFault | None = None
    usage: Usage | None = None
    finish_reason: str | None = None
    delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    cut: bool = False
    cut_after: int | None = None  # stream chunks sent before the cut; None = half


@dataclass(frozen=True)
class WhenBranch:
    needle: str
    regex: bool
    body: StepBody

    def matches(self, text: str) -> bool:
        if self.regex:
            return re.search(self.needle, text) is not None
        return self.needle in text


@dataclass(frozen=True)
class Guarded:
    """Alternatives chosen by the text of the request's last message."""

    line: int
    branches: tuple[WhenBranch, ...]
    otherwise: StepBody | None

    def select(self, last_text: str) -> Step:
        for branch in self.branches:
            if branch.matches(last_text):
                step = _resolve(branch.body, last_text)
                return _expand_groups(step, branch, last_text) if branch.regex else step
        if self.otherwise is None:
            raise NoBranchMatched(self.line, last_text)
        return _resolve(self.otherwise, last_text)


StepBody = Step | Guarded


@dataclass(frozen=True)
class Repeat:
    """Serve ``body`` ``count`` times in order; ``count`` None repeats forever."""

    line: int
    count: int | None
    body: tuple[Item, ...]


Item = Step | Guarded | Repeat


@dataclass(frozen=True)
class Script:
    items: tuple[Item, ...]

    def __len__(self) -> int:
        return len(self.items)


def _resolve(body: StepBody, last_text: str) -> Step:
    return body if isinstance(body, Step) else body.select(last_text)


def _expand_groups(step: Step, branch: WhenBranch, last_text: str) -> Step:
    """A ``when re`` branch's text may repeat what its pattern captured: ``\\1`` … ``\\9``
    (and ``\\g<name>``) are the groups of the match in the last message."""
    match = re.search(branch.needle, last_text)
    if match is None or not match.re.groups:
        return step
    parts = tuple(
        TextPart(match.expand(part.text)) if isinstance(part, TextPart) else part
        for part in step.parts
    )
    return dataclasses.replace(step, parts=parts)


# --- rendering helpers shared with the server -----------------------------------------------


def fenced_python(code: str, *, closed: bool = True) -> str:
    fence = "```python\n" + code.rstrip("\n") + "\n"
    return fence + "```" if closed else fence


def fenced_json_call(name: str, arguments: str) -> str:
    """The ```json {"name", "arguments"} block small local models write instead of tool calls."""
    return '```json\n{"name": ' + json.dumps(name) + ', "arguments": ' + arguments + "}\n```"


# --- walking a script -----------------------------------------------------------------------


def _walk(items: tuple[Item, ...]) -> Iterator[StepBody]:
    for item in items:
        if isinstance(item, Repeat):
            if item.count is None:
                while True:
                    yield from _walk(item.body)
            else:
                for _ in range(item.count):
                    yield from _walk(item.body)
        else:
            yield item


_END = object()


class ScriptCursor:
    """Thread-safe position in a script; each ``next_step`` consumes one step."""

    def __init__(self, script: Script) -> None:
        self._lock = threading.Lock()
        self._iter = _walk(script.items)
        self._peeked: object = next(self._iter, _END)
        self._served = 0

    @property
    def served(self) -> int:
        """Steps consumed so far (the number of requests answered from the script)."""
        with self._lock:
            return self._served

    @property
    def done(self) -> bool:
        """True when every step has been consumed (never, for ``repeat forever``)."""
        with self._lock:
            return self._peeked is _END

    def next_step(self, last_text: str) -> Step:
        """Consume the next step, choosing guarded alternatives by ``last_text``.

        Raises ``ScriptExhausted`` when nothing is left and ``NoBranchMatched`` when a guarded
        step has no branch for ``last_text`` (the step is consumed either way).
        """
        with self._lock:
            current = self._peeked
            if current is _END:
                raise ScriptExhausted(self._served)
            self._peeked = next(self._iter, _END)
            self._served += 1
        assert isinstance(current, Step | Guarded)
        return _resolve(current, last_text)


# --- parsing --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Line:
    no: int
    text: str

    @property
    def blank(self) -> bool:
        return not self.text.strip()

    @property
    def indented(self) -> bool:
        return self.text[:1].isspace()


@dataclass(frozen=True)
class _Directive:
    line: int
    keyword: str
    rest: str  # text after the keyword, unstripped
    block: tuple[_Line, ...]  # the dedented indented block that follows, if any


def parse_script(text: str) -> Script:
    """Parse script text (dedented first); raise ``ScriptError`` with the line number."""
    dedented = textwrap.dedent(text)
    lines = tuple(_Line(i + 1, raw.rstrip()) for i, raw in enumerate(dedented.split("\n")))
    if not _has_content(lines):
        return Script(())  # every request is answered "script exhausted"
    return Script(_parse_items(lines, enclosing_line=1))


def _dedent_block(lines: list[_Line]) -> tuple[_Line, ...]:
    while lines and lines[-1].blank:
        lines.pop()
    if not lines:
        return ()
    body = textwrap.dedent("\n".join(line.text for line in lines)).split("\n")
    return tuple(_Line(line.no, raw) for line, raw in zip(lines, body, strict=True))


def _is_comment(line: _Line) -> bool:
    return line.text.lstrip().startswith("#")


def _split_groups(lines: tuple[_Line, ...]) -> list[tuple[int, list[_Line]]]:
    """Split at ``---`` lines that are not inside a block; returns (separator line, lines)."""
    groups: list[tuple[int, list[_Line]]] = []
    current: list[_Line] = []
    start = lines[0].no if lines else 1
    for line in lines:
        if not line.indented and _SEPARATOR_RE.match(line.text):
            groups.append((start, current))
            current = []
            start = line.no
        else:
            current.append(line)
    groups.append((start, current))
    return groups


def _directives(lines: list[_Line] | tuple[_Line, ...]) -> list[_Directive]:
    out: list[_Directive] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.blank or (not line.indented and _is_comment(line)):
            continue
        if line.indented:
            raise ScriptError(
                line.no, "unexpected indented line (only a directive ending in ':' takes a block)"
            )
        m = _KEYWORD_RE.match(line.text)
        if m is None:
            raise ScriptError(line.no, f"expected a directive, got {line.text!r}")
        block: list[_Line] = []
        while i < len(lines) and (lines[i].blank or lines[i].indented):
            block.append(lines[i])
            i += 1
        out.append(_Directive(line.no, m.group(0), line.text[m.end() :], _dedent_block(block)))
    return out


def _has_content(lines: list[_Line] | tuple[_Line, ...]) -> bool:
    return any(not line.blank and not _is_comment(line) for line in lines)


def _parse_items(lines: tuple[_Line, ...], enclosing_line: int) -> tuple[Item, ...]:
    items: list[Item] = []
    for start, group in _split_groups(lines):
        if not _has_content(group):
            continue
        if items and isinstance(items[-1], Repeat) and items[-1].count is None:
            raise ScriptError(start, "steps after `repeat forever` can never run")
        items.append(_parse_group(group))
    if not items:
        raise ScriptError(enclosing_line, "the script has no steps")
    return tuple(items)


def _parse_group(group: list[_Line]) -> Item:
    directives = _directives(group)
    first = directives[0]
    if first.keyword == "repeat":
        if len(directives) > 1:
            raise ScriptError(
                directives[1].line, "`repeat` must be the only directive of its step; add ---"
            )
        return _parse_repeat(first)
    return _parse_step(directives)


def _parse_repeat(d: _Directive) -> Repeat:
    head, inline = _split_colon(d, "repeat")
    if head in ("", "forever"):
        count: int | None = None
    else:
        count = _parse_count(head, d.line, "repeat count")
        if count < 1:
            raise ScriptError(d.line, "repeat count must be at least 1")
    body_lines = _body_lines(d, inline, "repeat")
    return Repeat(d.line, count, _parse_items(body_lines, d.line))


def _body_lines(d: _Directive, inline: str, what: str) -> tuple[_Line, ...]:
    if inline and _has_content(d.block):
        raise ScriptError(d.line, f"`{what}` has both inline content and an indented block")
    if inline:
        return (_Line(d.line, inline),)
    if not _has_content(d.block):
        raise ScriptError(d.line, f"`{what}` needs a body: inline after ':' or an indented block")
    return d.block


def _parse_step(directives: list[_Directive]) -> StepBody:
    if directives[0].keyword == "when":
        return _parse_guarded(directives)
    for d in directives:
        if d.keyword in ("when", "else"):
            raise ScriptError(d.line, f"`{d.keyword}` must start its step (separate steps by ---)")
        if d.keyword == "repeat":
            raise ScriptError(d.line, "`repeat` must be the only directive of its step; add ---")
    return _StepBuilder(directives[0].line).build(directives)


def _parse_body(d: _Directive, inline: str, what: str) -> StepBody:
    lines = _body_lines(d, inline, what)
    for line in lines:
        if not line.indented and _SEPARATOR_RE.match(line.text):
            raise ScriptError(line.no, f"--- is not allowed inside `{what}`")
    directives = _directives(lines)
    if any(x.keyword == "repeat" for x in directives):
        raise ScriptError(d.line, f"`repeat` is not allowed inside `{what}`")
    return _parse_step(directives)


def _parse_guarded(directives: list[_Directive]) -> Guarded:
    branches: list[WhenBranch] = []
    otherwise: StepBody | None = None
    for d in directives:
        if d.keyword == "when":
            if otherwise is not None:
                raise ScriptError(d.line, "`when` after `else`")
            m = _WHEN_RE.match(d.rest)
            if m is None:
                raise ScriptError(d.line, 'expected `when "TEXT":` or `when re "PATTERN":`')
            regex = m.group(1) is not None
            needle = _literal(m.group(2), d.line)
            if regex:
                try:
                    re.compile(needle)
                except re.error as exc:
                    raise ScriptError(d.line, f"bad regular expression: {exc}") from None
            body = _parse_body(d, m.group(3).strip(), "when")
            branches.append(WhenBranch(needle, regex, body))
        elif d.keyword == "else":
            if otherwise is not None:
                raise ScriptError(d.line, "a second `else`")
            head, inline = _split_colon(d, "else")
            if head:
                raise ScriptError(d.line, "expected `else:`")
            otherwise = _parse_body(d, inline, "else")
        else:
            raise ScriptError(
                d.line, f"a step that starts with `when` holds only when/else, not `{d.keyword}`"
            )
    return Guarded(directives[0].line, tuple(branches), otherwise)


def _literal(token: str, line: int) -> str:
    try:
        value = ast.literal_eval(token)
    except (ValueError, SyntaxError):
        raise ScriptError(line, f"bad string {token}") from None
    if not isinstance(value, str):
        raise ScriptError(line, f"expected a string, got {token}")
    return value


def _split_colon(d: _Directive, what: str) -> tuple[str, str]:
    idx = d.rest.find(":")
    if idx < 0:
        raise ScriptError(d.line, f"`{what}` needs ':'")
    return d.rest[:idx].strip(), d.rest[idx + 1 :].strip()


def _content(d: _Directive, inline: str) -> str:
    if inline and _has_content(d.block):
        raise ScriptError(d.line, f"`{d.keyword}` has both inline content and an indented block")
    if inline:
        return inline
    if d.block:
        return "\n".join(line.text for line in d.block)
    raise ScriptError(d.line, f"`{d.keyword}:` needs content, inline or as an indented block")


def _parse_count(token: str, line: int, what: str) -> int:
    try:
        value = int(token)
    except ValueError:
        raise ScriptError(line, f"{what} must be a whole number, got {token!r}") from None
    if value < 0:
        raise ScriptError(line, f"{what} must not be negative")
    return value


def _parse_seconds(token: str, line: int, what: str) -> float:
    try:
        value = float(token)
    except ValueError:
        raise ScriptError(line, f"{what} must be a number of seconds, got {token!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ScriptError(line, f"{what} must be a finite, non-negative number of seconds")
    return value


class _StepBuilder:
    """Collects one step's directives and checks that they make sense together."""

    def __init__(self, line: int) -> None:
        self.line = line
        self.parts: list[Part] = []
        self.fault: HttpFault | None = None
        self.usage: Usage | None = None
        self.finish: str | None = None
        self.delay_s: float | None = None
        self.chunk_delay_s: float | None = None
        self.cut: bool = False
        self.cut_after: int | None = None
        self.empty = False
        self.seen: set[str] = set()

    def build(self, directives: list[_Directive]) -> Step:
        for d in directives:
            self._one(d)
        if self.fault is not None:
            extra = self.parts or self.usage or self.finish or self.cut or self.empty
            if extra or self.chunk_delay_s is not None:
                raise ScriptError(
                    self.line,
                    "a fault step (status code, overflow, garbage) takes only `slow`, nothing else",
                )
        elif self.empty and self.parts:
            raise ScriptError(self.line, "`empty` cannot be combined with content")
        elif not self.parts and not self.empty:
            if self.delay_s is None and not self.cut:
                raise ScriptError(
                    self.line, "the step has no reply: add text:, code:, a fault, or `empty`"
                )
            self.parts.append(TextPart(DEFAULT_FILLER_TEXT))
        return Step(
            line=self.line,
            parts=tuple(self.parts),
            fault=self.fault,
            usage=self.usage,
            finish_reason=self.finish,
            delay_s=self.delay_s or 0.0,
            chunk_delay_s=self.chunk_delay_s or 0.0,
            cut=self.cut,
            cut_after=self.cut_after,
        )

    def _once(self, d: _Directive, key: str) -> None:
        if key in self.seen:
            raise ScriptError(d.line, f"`{d.keyword}` given twice in one step")
        self.seen.add(key)

    def _no_block(self, d: _Directive) -> None:
        if _has_content(d.block):
            raise ScriptError(d.block[0].no, f"`{d.keyword}` does not take an indented block")

    def _set_fault(self, d: _Directive, fault: HttpFault) -> None:
        self._once(d, "fault")
        self._no_block(d)
        self.fault = fault

    def _one(self, d: _Directive) -> None:
        kw = d.keyword
        args = d.rest.strip()
        if kw in ("text", "code", "think"):
            head, inline = _split_colon(d, kw)
            if head:
                raise ScriptError(d.line, f"expected `{kw}:` followed by the content")
            content = _content(d, inline)
            part: Part = (
                TextPart(content)
                if kw == "text"
                else CodePart(content)
                if kw == "code"
                else ThinkPart(content)
            )
            self.parts.append(part)
        elif kw == "call":
            name, inline = _split_colon(d, kw)
            if not _NAME_RE.match(name):
                raise ScriptError(d.line, "expected `call NAME: RAW_ARGUMENTS`")
            self.parts.append(CallPart(name, _content(d, inline)))
        elif kw == "bad-tool-json":
            raw = DEFAULT_BAD_TOOL_ARGUMENTS
            if d.rest.strip():
                raw = _content(d, _split_colon(d, kw)[1])
            else:
                self._no_block(d)
            self.parts.append(CallPart(IPYTHON_TOOL_NAME, raw))
        elif kw == "raw-fenced":
            self.parts.append(TextPart(_raw_fenced(d)))
        elif kw == "usage":
            self._once(d, kw)
            self._no_block(d)
            self.usage = _parse_usage(args, d.line)
        elif kw == "finish":
            self._once(d, kw)
            self._no_block(d)
            if args not in FINISH_REASONS:
                choices = ", ".join(sorted(FINISH_REASONS))
                raise ScriptError(d.line, f"finish reason must be one of {choices}")
            self.finish = args
        elif kw == "slow":
            self._once(d, kw)
            self._no_block(d)
            self.delay_s = _parse_seconds(args, d.line, "slow")
        elif kw == "chunk-delay":
            self._once(d, kw)
            self._no_block(d)
            self.chunk_delay_s = _parse_seconds(args, d.line, "chunk-delay")
        elif kw == "cut":
            self._once(d, kw)
            self._no_block(d)
            self.cut = True
            if args:
                self.cut_after = _parse_count(args, d.line, "cut chunk count")
        elif kw == "empty":
            self._once(d, kw)
            self._no_block(d)
            self._no_args(d, args)
            self.empty = True
        elif kw == "garbage":
            self._no_args(d, args)
            self._set_fault(d, HttpFault(status=HTTPStatus.OK, garbage=True))
        elif kw == "overflow":
            self._no_args(d, args)
            self._set_fault(d, HttpFault(status=HTTPStatus.BAD_REQUEST, overflow=True))
        elif kw.isdigit() and len(kw) == STATUS_DIGITS:
            self._set_fault(d, _parse_status(kw, args, d.line))
        else:
            raise ScriptError(d.line, f"unknown directive `{kw}`")

    @staticmethod
    def _no_args(d: _Directive, args: str) -> None:
        if args:
            raise ScriptError(d.line, f"`{d.keyword}` takes no arguments")


def _raw_fenced(d: _Directive) -> str:
    variant, inline = _split_colon(d, "raw-fenced")
    code = _content(d, inline)
    if variant == "python":
        return fenced_python(code)
    if variant == "unclosed":
        return fenced_python(code, closed=False)
    if variant == "json":
        return fenced_json_call(IPYTHON_TOOL_NAME, json.dumps({"code": code}))
    raise ScriptError(d.line, "expected `raw-fenced python:`, `raw-fenced unclosed:` or `json:`")


def _parse_usage(args: str, line: int) -> Usage:
    values: dict[str, int] = {}
    for token in args.split():
        key, sep, value = token.partition("=")
        if not sep or key not in USAGE_KEYS:
            raise ScriptError(line, f"usage takes {' '.join(k + '=N' for k in USAGE_KEYS)}")
        if key in values:
            raise ScriptError(line, f"usage {key}= given twice")
        values[key] = _parse_count(value, line, f"usage {key}")
    if not values:
        raise ScriptError(line, "usage needs at least one of in=N out=N cache_read=N")
    return Usage(values.get("in"), values.get("out"), values.get("cache_read"))


def _parse_status(code: str, args: str, line: int) -> HttpFault:
    status = int(code)
    if not MIN_STATUS <= status <= MAX_STATUS:
        raise ScriptError(line, f"status must be {MIN_STATUS}..{MAX_STATUS}, got {status}")
    retry_after: float | None = None
    words = args.split()
    if words and words[0].startswith("retry-after="):
        retry_after = _parse_seconds(words[0].partition("=")[2], line, "retry-after")
        words = words[1:]
    return HttpFault(status, retry_after, " ".join(words) or None)
