"""Slash commands typed in the chat's input box (docs/tui.md, "Slash commands").

``run_slash`` parses one line and makes its call(s) to the daemon through a ``SlashHost``
(the chat screen); the answer becomes one line in the chat (``host.say``), or the command opens
a screen. A misuse (an unknown command, a missing or extra argument, a command that needs a
session in a chat that has none yet) says one error line and calls nothing. The arguments mean
what they mean to the CLI's ``goal``, ``heartbeat``, ``refine``, ``model`` and ``harness``
commands.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

# The protocol's limits are checked here too, so that a too-long argument is a one-line
# misuse rather than the client's multi-line validation error.
from orchestrator.api import (
    COMPACT_INSTRUCTIONS_MAX_CHARS,
    GOAL_OBJECTIVE_MAX_CHARS,
    MAX_ID_CHARS,
    REFINE_INSTRUCTIONS_MAX_CHARS,
    SCHEDULE_PROMPT_MAX_CHARS,
    ApiCommandError,
    ConnectionClosed,
)
from tui import format as fmt

__all__ = ["COMMANDS", "SlashHost", "SlashSpec", "complete", "is_slash", "run_slash"]

PREFIX: Final = "/"
GOAL_ACTIONS: Final = ("status", "pause", "resume", "clear")
HEARTBEAT_ACTIONS: Final = ("status", "pause", "resume", "stop")
HEARTBEAT_EVERY: Final = "every"
AUTONOMOUS_ACTIONS: Final = ("on", "off", "status")
ROLLBACK_WORD: Final = "rollback"
HARNESS_ACTIONS: Final = ("accept", "reject")
# How many pending proposals `/harness` names in its one line (the rest are counted).
HARNESS_PROPOSALS_SHOWN: Final = 5
BUDGET_FLAG: Final = "--budget"
API_BASE_FLAG: Final = "--api-base"
EXPORT_SUFFIX: Final = ".jsonl"
# A session name made into a file name: anything but letters, digits, '.', '_', '-' becomes '-'.
UNSAFE_FILE_CHARS: Final = re.compile(r"[^\w.-]+")
# The first word of a slash command: '/' and letters (so "/usr/bin is gone" is a message).
SLASH_RE: Final = re.compile(r"/[A-Za-z_-]*(?:\s|$)")


@dataclass(frozen=True)
class SlashSpec:
    """One slash command: its name (without '/'), usage line, one-line summary, and the fixed
    words Tab completes after it."""

    name: str
    usage: str
    summary: str
    subwords: tuple[str, ...] = ()


COMMANDS: Final[tuple[SlashSpec, ...]] = (
    SlashSpec("compact", "/compact [INSTRUCTIONS]", "summarise the older part of the context"),
    SlashSpec(
        "refine",
        "/refine [INSTRUCTIONS] | /refine rollback ID",
        "improve the harness from this session (or undo a refinement)",
        (ROLLBACK_WORD,),
    ),
    SlashSpec(
        "harness",
        "/harness | /harness accept ID | /harness reject ID",
        "the pending global harness proposals; accept or reject one",
        HARNESS_ACTIONS,
    ),
    SlashSpec(
        "goal",
        "/goal OBJECTIVE [--budget N] | /goal [status|pause|resume|clear]",
        "work towards an objective within a token budget",
        GOAL_ACTIONS,
    ),
    SlashSpec(
        "heartbeat",
        "/heartbeat every 10m TEXT | /heartbeat [status|pause|resume|stop]",
        "tell the session TEXT at regular times",
        (HEARTBEAT_EVERY, *HEARTBEAT_ACTIONS),
    ),
    SlashSpec("tree", "/tree", "the session's event tree"),
    SlashSpec("fork", "/fork [EVENT]", "a new session from the path up to EVENT (the leaf)"),
    SlashSpec("clone", "/clone", "a new session with a copy of the active path"),
    SlashSpec("model", "/model PROVIDER/NAME [--api-base URL]", "switch the model"),
    SlashSpec(
        "autonomous",
        "/autonomous [on|off|status]",
        "keep working until a limit or a gate stops it",
        AUTONOMOUS_ACTIONS,
    ),
    SlashSpec("agents", "/agents", "every session: running, idle, inactive"),
    SlashSpec("usage", "/usage", "tokens, cost and time of the session tree"),
    SlashSpec("sweeps", "/sweeps", "benchmark sweeps: progress, cost, ETA, their cells"),
    SlashSpec("export", "/export [PATH]", "write the session as JSONL (./NAME.jsonl)"),
    SlashSpec("help", "/help", "the slash commands and keys"),
)
_BY_NAME: Final = {spec.name: spec for spec in COMMANDS}


class SlashHost(Protocol):
    """What a slash command needs from the screen that runs it (the chat)."""

    @property
    def session_id(self) -> str | None: ...  # None: a new chat with no session yet

    # ``ControlClient.call``: the result, or ApiCommandError / ConnectionClosed.
    async def call(self, command_type: str, /, **fields: Any) -> Any: ...

    def open_agents(self, parent: str | None = None) -> None: ...

    def open_usage(self) -> None: ...

    def open_tree(self) -> None: ...

    def open_help(self) -> None: ...

    def open_sweeps(self) -> None: ...

    def open_session(self, session_id: str) -> None: ...

    def say(self, text: str, *, error: bool = False) -> None: ...  # one line (red: error)

    @property
    def cwd(self) -> Path: ...  # where a relative /export path is resolved (the TUI's cwd)


class _Misuse(Exception):
    """The line is not a valid use of its command; the message says what to do."""


class _NoSession(Exception):
    """The command needs a session and the chat has none yet."""


@dataclass(frozen=True)
class _Run:
    spec: SlashSpec
    args: str
    host: SlashHost

    @property
    def words(self) -> list[str]:
        return self.args.split()

    @property
    def session(self) -> str:
        sid = self.host.session_id
        if sid is None:
            raise _NoSession
        return sid

    def no_args(self) -> None:
        if self.args:
            raise _Misuse(f"/{self.spec.name} takes no arguments")


def is_slash(text: str) -> bool:
    """Whether an input line is a slash command (and not a message such as "/usr is full")."""
    return SLASH_RE.match(text.strip()) is not None


def _split(text: str) -> tuple[str, str]:
    head, *rest = text.split(maxsplit=1) or [""]
    return head[len(PREFIX) :].lower(), rest[0].strip() if rest else ""


def complete(text: str) -> list[str]:
    """Completions of a partial input: command names before the first space ("/co" →
    ["/compact"]), then the command's fixed sub-words ("/goal pa" → ["/goal pause"])."""
    if not text.startswith(PREFIX):
        return []
    head, space, rest = text.partition(" ")
    if not space:
        stem = head[len(PREFIX) :].lower()
        return [PREFIX + s.name for s in COMMANDS if s.name.startswith(stem)]
    spec = _BY_NAME.get(head[len(PREFIX) :].lower())
    if spec is None or len(rest.split()) > 1 or (rest and rest[-1].isspace()):
        return []
    stem = rest.strip().lower()
    return [f"{PREFIX}{spec.name} {w}" for w in spec.subwords if w.startswith(stem)]


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _check_length(text: str, limit: int, what: str) -> None:
    if len(text) > limit:
        raise _Misuse(f"{what} has {len(text):,} characters; at most {limit:,}")


def _take_option(words: list[str], flag: str) -> tuple[list[str], str | None]:
    """``words`` without ``flag VALUE`` (or ``flag=VALUE``), and VALUE (None: absent)."""
    rest: list[str] = []
    value: str | None = None
    it = iter(words)
    for word in it:
        if word == flag:
            value = next(it, None)
            if value is None:
                raise _Misuse(f"{flag} needs a value")
        elif word.startswith(flag + "="):
            value = word[len(flag) + 1 :]
        else:
            rest.append(word)
    return rest, value


# ---------------------------------------------------------------------------------- commands


async def _compact(run: _Run) -> None:
    _check_length(run.args, COMPACT_INSTRUCTIONS_MAX_CHARS, "the instructions")
    fields: dict[str, Any] = {"session": run.session}
    if run.args:
        fields["instructions"] = run.args
    result = await run.host.call("compact", **fields)
    if result.get("compacted"):
        before, after = result.get("tokens_before", 0), result.get("tokens_after", 0)
        run.host.say(f"compacted: {before:,} → {after:,} tokens")
    elif result.get("scheduled"):
        run.host.say("compaction scheduled: at the turn's next step")
    else:
        why = result.get("message") or result.get("reason") or "nothing was compacted"
        run.host.say(f"/compact: {why}", error=result.get("reason") != "nothing_to_compact")


def _refinement_line(row: dict[str, Any]) -> str:
    edits = row.get("edits") or []
    applied = sum(1 for e in edits if e.get("applied"))
    parts = [f"refinement {row.get('id')} {row.get('status')}"]
    parts += [f"(rollback of {row['rollback_of']})"] if row.get("rollback_of") else []
    parts += [f"{applied} of {len(edits)} edits applied"] if edits else []
    parts += [f"— {_one_line(row[k])}" for k in ("summary", "error") if row.get(k)]
    return " ".join(parts)


async def _refine(run: _Run) -> None:
    words = run.words
    if words and words[0].lower() == ROLLBACK_WORD:
        if len(words) != 2:
            raise _Misuse("say which refinement: /refine rollback ID")
        _check_length(words[1], MAX_ID_CHARS, "the refinement id")
        row = await run.host.call("refine_rollback", id=words[1])
        run.host.say(_refinement_line(row), error=row.get("status") != "applied")
        return
    _check_length(run.args, REFINE_INSTRUCTIONS_MAX_CHARS, "the instructions")
    fields: dict[str, Any] = {"session": run.session}
    if run.args:
        fields["instructions"] = run.args
    answer = await run.host.call("refine", **fields)
    if answer.get("scheduled"):
        run.host.say(f"refinement {answer.get('id')} planning; it applies at the turn's end")
    else:
        run.host.say(f"/refine: not refined: {answer.get('reason')}", error=True)


def _proposal_text(p: dict[str, Any]) -> str:
    return f"{p.get('id')} {p.get('action')} {p.get('target')} (from {p.get('source')})"


async def _harness(run: _Run) -> None:
    """``/harness``: the pending proposals (global writes a kernel asked for); ``/harness
    accept ID`` writes one, ``/harness reject ID`` drops it."""
    words = run.words
    if not words:
        found = await run.host.call("harness_list")
        pending = list(found.get("proposals") or [])
        if not pending:
            run.host.say("no pending harness proposals")
            return
        shown = "; ".join(_proposal_text(p) for p in pending[:HARNESS_PROPOSALS_SHOWN])
        more = len(pending) - HARNESS_PROPOSALS_SHOWN
        tail = f"; and {more} more (prime-agent harness list)" if more > 0 else ""
        run.host.say(f"{len(pending)} pending proposal(s): {shown}{tail}")
        return
    action = words[0].lower()
    if action not in HARNESS_ACTIONS or len(words) != 2:
        raise _Misuse("say accept or reject and one proposal id")
    _check_length(words[1], MAX_ID_CHARS, "the proposal id")
    answer = await run.host.call(f"harness_{action}", id=words[1])
    proposal = answer.get("proposal") or {}
    entry = answer.get("entry")
    if entry is not None:
        what = "deleted" if entry.get("deleted") else f"v{entry.get('version')}"
        run.host.say(f"accepted {words[1]}: {proposal.get('target')} {what}")
    else:
        run.host.say(f"rejected {words[1]}: {proposal.get('target')} stays as it is")


def _goal_line(row: dict[str, Any] | None) -> str:
    if row is None:
        return "no goal"
    used = f"{int(row.get('tokens_used') or 0):,}"
    if row.get("token_budget"):
        used += f"/{int(row['token_budget']):,}"
    return f"goal {row.get('status')}: {_one_line(row.get('objective') or '')} ({used} tokens)"


async def _goal(run: _Run) -> None:
    words, budget_text = _take_option(run.words, BUDGET_FLAG)
    fields: dict[str, Any] = {"session": run.session}
    if len(words) == 1 and words[0].lower() in GOAL_ACTIONS:
        if budget_text is not None:
            raise _Misuse(f"{BUDGET_FLAG} goes with a new objective")
        fields["action"] = words[0].lower()
    elif words:
        objective = " ".join(words)
        _check_length(objective, GOAL_OBJECTIVE_MAX_CHARS, "the objective")
        fields.update(action="set", objective=objective)
        if budget_text is not None:
            if not budget_text.isdigit() or int(budget_text) < 1:
                raise _Misuse(f"{BUDGET_FLAG} needs a whole number of tokens, at least 1")
            fields["token_budget"] = int(budget_text)
    elif budget_text is not None:
        raise _Misuse("say the objective")
    result = await run.host.call("goal", **fields)
    run.host.say(_goal_line(result.get("goal")))


async def _heartbeat(run: _Run) -> None:
    words = run.words
    first = words[0].lower() if words else ""
    if first in HEARTBEAT_ACTIONS and len(words) > 1:
        raise _Misuse(f"/heartbeat {first} takes nothing after it")
    if first == HEARTBEAT_EVERY and len(words) < 3:
        raise _Misuse("say how often and what: /heartbeat every 10m TEXT")
    _check_length(run.args, SCHEDULE_PROMPT_MAX_CHARS, "the heartbeat")
    result = await run.host.call("heartbeat", session=run.session, text=run.args)
    run.host.say(_one_line(result.get("message") or result.get("action") or "done"))


def _label(result: dict[str, Any]) -> str:
    name = f" · {result['name']}" if result.get("name") else ""
    return f"{result['session']}{name}"


async def _copy(run: _Run) -> None:
    """``/fork [EVENT]`` and ``/clone``: a new session, opened."""
    fields: dict[str, Any] = {"session": run.session}
    words = run.words
    if run.spec.name == "clone":
        run.no_args()
    elif len(words) > 1:
        raise _Misuse("/fork takes at most one event (a seq number or an event id)")
    elif words:
        _check_length(words[0], MAX_ID_CHARS, "the event")
        fields["event"] = words[0]
    made = await run.host.call(run.spec.name, **fields)
    run.host.open_session(made["session"])
    name = f" · {made['name']}" if made.get("name") else ""
    verb = "cloned" if run.spec.name == "clone" else "forked"
    run.host.say(f"{verb} {fields['session']} into {made['session']}{name}")


async def _model(run: _Run) -> None:
    words, api_base = _take_option(run.words, API_BASE_FLAG)
    if len(words) != 1:
        raise _Misuse("name one model: /model PROVIDER/NAME")
    _check_length(words[0], MAX_ID_CHARS, "the model name")
    fields: dict[str, Any] = {"session": run.session, "model": words[0]}
    if api_base:
        fields["api_base"] = api_base
    result = await run.host.call("set_model", **fields)
    run.host.say(f"model: {result.get('previous')} → {result.get('model')} from the next turn")


def _from_ms(ms: float) -> str:
    return fmt.duration(ms / fmt.MS_PER_S)


def _autonomous_line(state: dict[str, Any]) -> str:
    """``autonomous: on · turns 2/50 · tokens 1.2k/2.0M · 3m 05s/1h 00m · 1 gate(s)``; a
    run's counters stay after it stopped or was turned off."""
    parts = [f"autonomous: {state.get('mode', 'off')}"]
    if state.get("started_at"):
        limits = state.get("limits") or {}

        def cap(key: str, show: Callable[[Any], str]) -> str:
            return f"/{show(limits[key])}" if limits.get(key) else ""

        parts.append(f"turns {state.get('turns', 0)}{cap('max_turns', str)}")
        parts.append(f"tokens {fmt.tokens(state.get('tokens', 0))}{cap('max_tokens', fmt.tokens)}")
        if state.get("elapsed_s") is not None:
            parts.append(f"{fmt.duration(state['elapsed_s'])}{cap('timeout_ms', _from_ms)}")
        if state.get("gates"):
            parts.append(f"{len(state['gates'])} gate(s)")
    if state.get("stop_reason"):
        parts.append(f"stopped: {state['stop_reason']}")
    return " · ".join(parts)


async def _autonomous(run: _Run) -> None:
    words = run.words
    action = words[0].lower() if words else "status"
    if len(words) > 1 or action not in AUTONOMOUS_ACTIONS:
        raise _Misuse("say on, off or status")
    result = await run.host.call("autonomous", session=run.session, action=action)
    run.host.say(_autonomous_line(result.get("autonomous") or {}))


def _file_name(session: dict[str, Any]) -> str:
    stem = UNSAFE_FILE_CHARS.sub("-", str(session.get("name") or "")).strip("-.")
    return (stem or str(session["id"])) + EXPORT_SUFFIX


async def _export(run: _Run) -> None:
    sid = run.session
    typed = run.args
    if len(typed) > 1 and typed[0] == typed[-1] and typed[0] in "'\"":
        typed = typed[1:-1]  # a quoted path: the quotes are not part of it
    path = Path(os.path.normpath(run.host.cwd / Path(typed or ".").expanduser()))
    if not typed or typed.endswith(os.sep) or path.is_dir():
        found = await run.host.call("get_session", session=sid)
        path = path / _file_name(found["session"])
    result = await run.host.call("export_session", session=sid, path=str(path))
    run.host.say(f"exported {result.get('bytes', 0):,} bytes to {result.get('path', path)}")


async def _screen(run: _Run) -> None:
    """``/tree`` (of this session), ``/agents``, ``/usage``, ``/sweeps``: open the screen; it
    loads its own data."""
    run.no_args()
    if run.spec.name == "tree":
        _ = run.session
        run.host.open_tree()
    elif run.spec.name == "agents":
        run.host.open_agents()
    elif run.spec.name == "sweeps":
        run.host.open_sweeps()
    else:
        run.host.open_usage()


async def _help(run: _Run) -> None:
    run.no_args()
    run.host.open_help()


_HANDLERS: Final[dict[str, Callable[[_Run], Awaitable[None]]]] = {
    "compact": _compact,
    "refine": _refine,
    "harness": _harness,
    "goal": _goal,
    "heartbeat": _heartbeat,
    "tree": _screen,
    "fork": _copy,
    "clone": _copy,
    "model": _model,
    "autonomous": _autonomous,
    "agents": _screen,
    "usage": _screen,
    "sweeps": _screen,
    "export": _export,
    "help": _help,
}


async def run_slash(text: str, host: SlashHost) -> None:
    """Run one slash command line; everything it has to say goes to ``host.say``."""
    name, args = _split(text)
    spec = _BY_NAME.get(name)
    if spec is None:
        shown = f"{PREFIX}{name}" if name else PREFIX
        host.say(f"unknown command {shown}: /help lists them", error=True)
        return
    try:
        await _HANDLERS[name](_Run(spec, args, host))
    except _Misuse as exc:
        host.say(f"/{name}: {exc}; usage: {spec.usage}", error=True)
    except _NoSession:
        host.say(f"/{name} needs a session: send a message first to start one", error=True)
    except (ApiCommandError, ConnectionClosed) as exc:
        host.say(f"/{name}: {_one_line(exc.message)}", error=True)
