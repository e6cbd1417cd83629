"""``model``, ``refine`` and ``harness``: a session's model and its Continual Harness, through
the daemon (docs/harness.md, docs/cli.md).

- ``model ID|NAME PROVIDER/NAME [--api-base URL]``: the session uses that model from its next
  turn on (``/model``); refused while it is in a turn.
- ``refine ID|NAME [INSTRUCTIONS] [--global] [--wait]``: ``/refine``. Planning runs in the
  background; the plan applies at the session's next turn boundary (at once when it is idle).
  ``--wait`` waits for the outcome and prints it.
- ``refine rollback REFINEMENT_ID``: restore what that refinement changed (recorded too).
- ``harness log [ID|NAME] [--limit N]``: who changed what, when and why; refinements with
  their intended and measured outcome.
- ``harness list [ID|NAME] [--kind K]``: the live entries a session sees (or the global ones),
  then the pending proposals: global writes a kernel (or a refinement the agent started)
  asked for, which reach no prompt until accepted.
- ``harness accept PROPOSAL_ID [--reason R]`` / ``harness reject PROPOSAL_ID``: decide on one.
- ``harness set KIND TITLE CONTENT [--session ID | --global] [--id ID] [--version N]`` and
  ``harness rm KIND ID [--session ID | --global]``: the user's own writes (source ``user``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Final

import typer

from orchestrator.cli.common import EXIT_ERROR, EXIT_OK, fail, guarded
from orchestrator.cli.connect import DaemonLink, require_daemon

__all__ = ["harness_app", "model", "refine"]

ROLLBACK_WORD: Final = "rollback"
REFINE_WAIT_TIMEOUT_S: Final = 600.0
REFINE_POLL_S: Final = 0.25  # --wait asks the daemon this often for the refinement's state
LOG_TEXT_CHARS: Final = 100
DONE_STATUSES: Final = frozenset({"applied", "failed", "discarded"})

harness_app = typer.Typer(
    help="The Continual Harness: entries, their versions, refinements.", no_args_is_help=True
)

Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks.")]
Json = Annotated[bool, typer.Option("--json", help="Print the daemon's answer as JSON.")]


def _run(command: str, work: Callable[[DaemonLink], Awaitable[Any]], debug: bool) -> Any:
    async def go() -> Any:
        async with DaemonLink() as link:
            return await work(link)

    def call() -> Any:
        require_daemon(command)
        return asyncio.run(go())

    return guarded(call, debug=debug)


def _short(text: object) -> str:
    line = " ".join(str(text or "").split())
    return line if len(line) <= LOG_TEXT_CHARS else line[: LOG_TEXT_CHARS - 1] + "…"


def model(
    session: Annotated[str, typer.Argument(help="Session id, unique id prefix or name.")],
    model_name: Annotated[str, typer.Argument(metavar="MODEL", help="provider/name")],
    api_base: Annotated[
        str | None, typer.Option("--api-base", help="An OpenAI-compatible endpoint for it.")
    ] = None,
    debug: Debug = False,
) -> None:
    fields: dict[str, Any] = {"session": session, "model": model_name}
    if api_base:
        fields["api_base"] = api_base
    result = _run("model", lambda link: link.mutate("set_model", **fields), debug)
    typer.echo(f"{result['session']}: {result['previous']} -> {result['model']} from its next turn")


# -- refine ---------------------------------------------------------------------------------


def _refinement_line(row: dict[str, Any]) -> str:
    edits = row.get("edits") or []
    applied = sum(1 for e in edits if e.get("applied"))
    proposed = [str(e["proposal"]) for e in edits if not e.get("applied") and e.get("proposal")]
    rejected = sum(1 for e in edits if e.get("applied") is False) - len(proposed)
    parts = [f"{row.get('id')} {row.get('status')}"]
    if row.get("rollback_of"):
        parts.append(f"(rollback of {row['rollback_of']})")
    if edits:
        parts.append(f"{applied} applied, {rejected} rejected")
    if proposed:
        parts.append(f"({len(proposed)} proposed: {', '.join(proposed)})")
    if row.get("summary"):
        parts.append(f"— {_short(row['summary'])}")
    if row.get("error"):
        parts.append(f"— {_short(row['error'])}")
    return " ".join(parts)


async def _wait_refinement(link: DaemonLink, session: str, ref_id: str) -> dict[str, Any]:
    """Poll the session's harness log until the refinement is applied, failed or discarded."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + REFINE_WAIT_TIMEOUT_S
    while True:
        log = await link.call("harness_log", session=session)
        for row in log.get("refinements") or []:
            if row.get("id") == ref_id and row.get("status") in DONE_STATUSES:
                return dict(row)
        if loop.time() > deadline:
            fail(f"refinement {ref_id} did not finish in {REFINE_WAIT_TIMEOUT_S:.0f} s", EXIT_ERROR)
        await asyncio.sleep(REFINE_POLL_S)


def refine(
    session: Annotated[
        str, typer.Argument(help="Session id, prefix or name; or 'rollback' and a refinement id.")
    ],
    instructions: Annotated[
        str | None, typer.Argument(help="What to look at (or, after 'rollback', the id).")
    ] = None,
    global_scope: Annotated[
        bool, typer.Option("--global", help="Edit the global harness (later sessions).")
    ] = False,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the outcome.")] = False,
    debug: Debug = False,
) -> None:
    if session == ROLLBACK_WORD:
        if not instructions:
            fail("say which refinement: prime-agent refine rollback REFINEMENT_ID")
        target = instructions
        row = _run("refine", lambda link: link.mutate("refine_rollback", id=target), debug)
        typer.echo(_refinement_line(row))
        raise SystemExit(EXIT_OK if row.get("status") == "applied" else EXIT_ERROR)
    fields: dict[str, Any] = {"session": session, "scope": "global" if global_scope else "local"}
    if instructions:
        fields["instructions"] = instructions

    async def work(link: DaemonLink) -> dict[str, Any]:
        answer: dict[str, Any] = await link.mutate("refine", **fields)
        if wait and answer.get("scheduled"):
            answer["result"] = await _wait_refinement(link, session, str(answer["id"]))
        return answer

    answer = _run("refine", work, debug)
    if not answer.get("scheduled"):
        typer.echo(f"not refined: {answer.get('reason')}")
        raise SystemExit(EXIT_ERROR)
    result = answer.get("result")
    if result is None:
        typer.echo(f"refinement {answer['id']} planning; it applies at the next turn boundary")
        raise SystemExit(EXIT_OK)
    typer.echo(_refinement_line(result))
    raise SystemExit(EXIT_OK if result.get("status") == "applied" else EXIT_ERROR)


# -- harness --------------------------------------------------------------------------------


@harness_app.command("log")
def log(
    session: Annotated[str | None, typer.Argument(help="Session id, prefix or name.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
    as_json: Json = False,
    debug: Debug = False,
) -> None:
    fields: dict[str, Any] = {"limit": limit}
    if session:
        fields["session"] = session
    result = _run("harness log", lambda link: link.call("harness_log", **fields), debug)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    rows: list[tuple[str, str]] = []
    for v in result.get("versions") or []:
        what = "deleted" if v.get("deleted") else f"v{v.get('version')}"
        origin = f" by {v['refinement_id']}" if v.get("refinement_id") else ""
        rows.append(
            (
                str(v.get("updated_at")),
                f"{v.get('scope')}:{v.get('kind')}:{v.get('id')} {what} "
                f"[{v.get('source')}{origin}] {_short(v.get('reason'))}",
            )
        )
    for p in result.get("proposals") or []:
        rows.extend(_proposal_log_rows(p))
    for r in result.get("refinements") or []:
        line = f"refine {_refinement_line(r)}"
        if r.get("expected_outcome"):
            line += f"; expected: {_short(r['expected_outcome'])}"
        if r.get("outcome_line"):
            line += f"; measured: {r['outcome_line']}"
        rows.append((str(r.get("created_at")), line))
    if not rows:
        typer.echo("no harness changes")
        return
    for when, line in sorted(rows, reverse=True):
        typer.echo(f"{when[:19]}  {line}")


def _proposal_line(p: dict[str, Any]) -> str:
    """``proposal p-… global:prompt:be_brief create [agent, session s-…] pending``."""
    origin = f"{p.get('source')}, session {p.get('session_id')}"
    if p.get("refinement_id"):
        origin += f", {p['refinement_id']}"
    head = f"proposal {p.get('id')} {p.get('target')} {p.get('action')}"
    return f"{head} [{origin}] {p.get('status')}"


def _proposal_log_rows(p: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [(str(p.get("created_at")), f"{_proposal_line(p)} {_short(p.get('reason'))}".rstrip())]
    if p.get("decided_at"):
        written = f" -> v{p['result_version']}" if p.get("result_version") is not None else ""
        note = f": {_short(p['decision_note'])}" if p.get("decision_note") else ""
        rows.append(
            (
                str(p.get("decided_at")),
                f"proposal {p.get('id')} {p.get('status')} by {p.get('decided_by')}{written}{note}",
            )
        )
    return rows


@harness_app.command("list")
def list_entries(
    session: Annotated[str | None, typer.Argument(help="Session id, prefix or name.")] = None,
    kind: Annotated[str | None, typer.Option("--kind", help="prompt|memory|skill|subagent")] = None,
    as_json: Json = False,
    debug: Debug = False,
) -> None:
    fields: dict[str, Any] = {}
    if session:
        fields["session"] = session
    if kind:
        fields["kind"] = kind
    result = _run("harness list", lambda link: link.call("harness_list", **fields), debug)
    entries = result.get("entries") or []
    proposals = result.get("proposals") or []
    if as_json:
        typer.echo(json.dumps(entries, indent=2))
        return
    if not entries:
        typer.echo("no entries")
    for e in entries:
        typer.echo(
            f"{e['scope']}:{e['kind']}:{e['id']} v{e['version']}  {_short(e['title'])}: "
            f"{_short(e['content'])}"
        )
    if proposals:
        typer.echo(
            f"{len(proposals)} pending proposal(s), in no prompt until accepted "
            "(prime-agent harness accept ID | reject ID):"
        )
    for p in proposals:
        fields_ = p.get("fields") or {}
        what = f"{_short(fields_.get('title'))}: {_short(fields_.get('content'))}"
        typer.echo(f"{_proposal_line(p)}  {what if fields_ else ''}".rstrip())


def _decide(command: str, proposal_id: str, reason: str | None, debug: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {"id": proposal_id}
    if reason:
        fields["reason"] = reason
    answer: dict[str, Any] = _run(
        f"harness {command}",
        lambda link: link.mutate(f"harness_{command}", **fields),
        debug,
    )
    return answer


@harness_app.command("accept")
def accept(
    proposal_id: Annotated[str, typer.Argument(metavar="ID", help="The proposal (p-…).")],
    reason: Annotated[str | None, typer.Option("--reason")] = None,
    debug: Debug = False,
) -> None:
    """Accept a pending proposal: its write happens now (later prompts show it)."""
    answer = _decide("accept", proposal_id, reason, debug)
    e = answer["entry"]
    what = "deleted" if e.get("deleted") else f"v{e['version']}"
    typer.echo(f"accepted {proposal_id}: {e['scope']}:{e['kind']}:{e['id']} {what}")


@harness_app.command("reject")
def reject(
    proposal_id: Annotated[str, typer.Argument(metavar="ID", help="The proposal (p-…).")],
    reason: Annotated[str | None, typer.Option("--reason")] = None,
    debug: Debug = False,
) -> None:
    """Reject a pending proposal: nothing is written."""
    answer = _decide("reject", proposal_id, reason, debug)
    typer.echo(f"rejected {proposal_id}: {answer['proposal']['target']} stays as it is")


def _scope_fields(session: str | None, global_scope: bool) -> dict[str, Any]:
    if global_scope:
        return {"scope": "global"}
    if not session:
        fail("say where: --session ID (its tree's local harness) or --global")
    return {"scope": "local", "session": session}


@harness_app.command("set")
def set_entry(
    kind: Annotated[str, typer.Argument(help="prompt|memory|subagent")],
    title: Annotated[str, typer.Argument()],
    content: Annotated[str, typer.Argument()],
    session: Annotated[str | None, typer.Option("--session", help="Session id or name.")] = None,
    global_scope: Annotated[bool, typer.Option("--global")] = False,
    entry_id: Annotated[str | None, typer.Option("--id", help="Update this entry.")] = None,
    version: Annotated[
        int | None, typer.Option("--version", help="The version you read (else: the newest).")
    ] = None,
    reason: Annotated[str | None, typer.Option("--reason")] = None,
    debug: Debug = False,
) -> None:
    fields = _scope_fields(session, global_scope)
    fields.update(
        kind=kind, title=title, content=content, action="update" if entry_id else "create"
    )
    for key, value in (("id", entry_id), ("version", version), ("reason", reason)):
        if value is not None:
            fields[key] = value
    result = _run("harness set", lambda link: link.mutate("harness_edit", **fields), debug)
    e = result["entry"]
    typer.echo(f"{e['scope']}:{e['kind']}:{e['id']} v{e['version']}")


@harness_app.command("rm")
def remove_entry(
    kind: Annotated[str, typer.Argument()],
    entry_id: Annotated[str, typer.Argument(metavar="ID")],
    session: Annotated[str | None, typer.Option("--session")] = None,
    global_scope: Annotated[bool, typer.Option("--global")] = False,
    reason: Annotated[str | None, typer.Option("--reason")] = None,
    debug: Debug = False,
) -> None:
    fields = _scope_fields(session, global_scope)
    fields.update(kind=kind, id=entry_id, action="delete")
    if reason:
        fields["reason"] = reason
    result = _run("harness rm", lambda link: link.mutate("harness_edit", **fields), debug)
    e = result["entry"]
    typer.echo(f"{e['scope']}:{e['kind']}:{e['id']} deleted (v{e['version']})")
