"""The session tree (docs/tree.md): leaf pointers, branch, fork, clone, listing.

Every event has a parent event (``events.parent_event_id``; NULL for a root) and the session's
``sessions.leaf_event_id`` names the end of its active path. Nothing here deletes or rewrites an
event:

- **branch** moves the leaf to an earlier event of the session, optionally recording a
  ``branch_summary`` event there first (its parent is the branch point, and it becomes the
  leaf), so the abandoned path stays summarized in the context;
- **fork** copies the path root → a chosen event into a NEW session: new event ids, ``seq``
  1..n, the same types, payloads and timestamps; ``forked_from``/``forked_at`` say where it
  came from. The copy is resumable (model, cwd, backend and budget copied; status inactive);
- **clone** is a fork at the leaf: a copy of the whole active path.

Copies, not references: a session's events stay a closed tree (``queries.check_parent`` and the
active-path query are restricted to one session), so every other reader works on a fork
unchanged. Usage rows are not copied: the copied history was paid for by the source, and usage
totals count each model call once.

A session with events but no leaf (a damaged or hand-edited row) gets its newest event as its
leaf: ``leaves.repair_leaves`` runs at every writable open, and the readers here use
``leaves.effective_leaf``.

The ``*_sql`` functions take the DuckDB connection and run on the store's writer thread (through
``Store.read`` / ``Store.transaction``); callers use the coroutines.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Final

import duckdb

from orchestrator.errors import UserError
from orchestrator.ids import new_event_id, new_session_id
from orchestrator.store import queries
from orchestrator.store.db import Store
from orchestrator.store.events import BranchSummaryPayload
from orchestrator.store.leaves import effective_leaf
from orchestrator.store.queries import ACTIVE_PATH_MAX_DEPTH, SessionRecord

__all__ = [
    "BRANCH_SUMMARY_MAX_CHARS",
    "CLONE_NAME_SUFFIX",
    "FORK_NAME_SUFFIX",
    "SESSION_NAME_MAX_CHARS",
    "TREE_TEXT_CHARS",
    "BranchResult",
    "TreeNode",
    "TreePage",
    "branch",
    "clone",
    "copy_path_sql",
    "find_session_sql",
    "fork",
    "path_ids_sql",
    "render_tree",
    "resolve_event_sql",
    "tree_page",
    "unique_name_sql",
]

# The first line of each event's text is cut to this many characters in a tree listing.
TREE_TEXT_CHARS: Final = 72
# ... read from the database at most this long (a cell's output can be 64 KiB).
_SNIPPET_SQL_CHARS: Final = 400
# A branch summary is prose about the abandoned path, not a transcript.
BRANCH_SUMMARY_MAX_CHARS: Final = 100_000
# Names of copies: "NAME (fork)", "NAME (clone)", then "NAME (fork 2)" ... when taken, so a name
# keeps selecting one session (find_session refuses an ambiguous name).
FORK_NAME_SUFFIX: Final = "fork"
CLONE_NAME_SUFFIX: Final = "clone"
SESSION_NAME_MAX_CHARS: Final = 64
_FIRST_DUPLICATE: Final = 2
# An event reference of more digits than this cannot be a seq (BIGINT); it is taken as an id.
_MAX_SEQ_DIGITS: Final = 18
_ELLIPSIS: Final = "…"


# -- lookups ---------------------------------------------------------------------------------


def find_session_sql(con: duckdb.DuckDBPyConnection, selector: str) -> SessionRecord:
    """A session by id, unique id prefix or name; ``UserError`` when none or several match."""
    found = queries.find_session(con, selector)
    if found is None:
        raise UserError(f"no session matches {selector!r}")
    return found


def resolve_event_sql(con: duckdb.DuckDBPyConnection, session_id: str, ref: str) -> tuple[str, int]:
    """``(event id, seq)`` of ``ref``: a seq number as ``tree`` prints it, or an event id."""
    text = ref.strip()
    if text.isdigit() and len(text) <= _MAX_SEQ_DIGITS:
        sql = "SELECT id, seq FROM events WHERE session_id = $1 AND seq = $2"
        row = con.execute(sql, [session_id, int(text)]).fetchone()
    else:
        sql = "SELECT id, seq FROM events WHERE session_id = $1 AND id = $2"
        row = con.execute(sql, [session_id, text]).fetchone()
    if row is None:
        raise UserError(
            f"session {session_id} has no event {ref[:80]!r}; prime-agent tree {session_id} "
            "lists them (give the seq number or the event id)"
        )
    return str(row[0]), int(row[1])


# The events from ``$2`` up to the root, restricted to the session's rows like the active-path
# query in ``queries`` (same cycle guard), ids only: a fork copies payloads inside DuckDB.
_PATH_IDS_SQL = f"""
WITH RECURSIVE path(id, parent_event_id, depth) AS (
    SELECT id, parent_event_id, 0 FROM events WHERE id = $2 AND session_id = $1
    UNION ALL
    SELECT e.id, e.parent_event_id, p.depth + 1
    FROM events e JOIN path p ON e.id = p.parent_event_id
    WHERE e.session_id = $1 AND p.depth < {ACTIVE_PATH_MAX_DEPTH}
)
SELECT id FROM path ORDER BY depth DESC
"""


def path_ids_sql(con: duckdb.DuckDBPyConnection, session_id: str, event_id: str) -> list[str]:
    """Ids of the events from the root down to ``event_id`` (root first)."""
    return [str(row[0]) for row in con.execute(_PATH_IDS_SQL, [session_id, event_id]).fetchall()]


def unique_name_sql(con: duckdb.DuckDBPyConnection, base: str | None, suffix: str) -> str | None:
    """``"BASE (SUFFIX)"``, or ``"BASE (SUFFIX 2)"`` ... when taken; None for an unnamed base."""
    if not base:
        return None
    room = SESSION_NAME_MAX_CHARS - len(suffix) - len(" ( 99)")
    stem = base if len(base) <= room else base[: max(room, 1)]
    rows = con.execute(
        "SELECT name FROM sessions WHERE name IS NOT NULL AND starts_with(name, $1)", [stem]
    ).fetchall()
    taken = {str(row[0]) for row in rows}
    name = f"{stem} ({suffix})"
    counter = _FIRST_DUPLICATE
    while name in taken:
        name = f"{stem} ({suffix} {counter})"
        counter += 1
    return name


# -- copying a path into a new session -------------------------------------------------------

_COPY_EVENTS_SQL = """
INSERT INTO events (session_id, seq, id, parent_event_id, type, ts, payload)
SELECT $1, m.seq, m.new_id, m.new_parent, e.type, e.ts, e.payload
FROM (SELECT unnest($3::VARCHAR[]) AS old_id, unnest($4::VARCHAR[]) AS new_id,
             unnest($5::VARCHAR[]) AS new_parent, unnest($6::BIGINT[]) AS seq) AS m
JOIN events e ON e.id = m.old_id AND e.session_id = $2
"""


def copy_path_sql(
    con: duckdb.DuckDBPyConnection, selector: str, ref: str | None, suffix: str
) -> SessionRecord:
    """Fork ``selector`` at ``ref`` (None: its leaf) into a new inactive root session.

    Runs inside ``Store.transaction``: the session row and every copied event commit together.
    """
    source = find_session_sql(con, selector)
    target = (
        effective_leaf(con, source) if ref is None else resolve_event_sql(con, source.id, ref)[0]
    )
    old_ids = path_ids_sql(con, source.id, target) if target is not None else []
    new_ids = [new_event_id() for _ in old_ids]
    session_id = new_session_id()
    record = SessionRecord(
        id=session_id,
        root_id=session_id,
        cwd=source.cwd,
        model=source.model,
        backend=source.backend,
        name=unique_name_sql(con, source.name, suffix),
        status="inactive",
        leaf_event_id=new_ids[-1] if new_ids else None,
        budget_tokens=source.budget_tokens,
        model_spec=source.model_spec,  # a copy talks to the same endpoint, in the same sandbox
        sandbox_policy=source.sandbox_policy,
        run_settings=source.run_settings,  # ... with the settings its run chose
        forked_from=source.id,
        forked_at=target,
    )
    stored = queries.insert_session(con, record)
    if old_ids:
        # A path is a chain: each copy's parent is the copy before it.
        parents: list[str | None] = [None, *new_ids[:-1]]
        seqs = list(range(1, len(new_ids) + 1))
        con.execute(_COPY_EVENTS_SQL, [session_id, source.id, old_ids, new_ids, parents, seqs])
        _remap_event_refs(con, session_id, dict(zip(old_ids, new_ids, strict=True)))
    return stored


# Payload fields that name another event of the same session: a copy must point at the copies
# (context assembly looks for a compaction's kept span and pinned turn on the session's path).
_EVENT_REF_FIELDS: dict[str, tuple[str, ...]] = {
    "compaction": ("first_kept_event_id", "pinned_event_id"),
    "branch_summary": ("from_event_id",),
}


def _remap_event_refs(
    con: duckdb.DuckDBPyConnection, session_id: str, mapping: dict[str, str]
) -> None:
    """Rewrite the copied events' references to source events (see ``_EVENT_REF_FIELDS``);
    a reference outside the copied path (an abandoned branch) is left as it was."""
    rows = con.execute(
        "SELECT id, type, payload FROM events WHERE session_id = $1 AND type IN "
        "(SELECT unnest($2::VARCHAR[]))",
        [session_id, list(_EVENT_REF_FIELDS)],
    ).fetchall()
    for event_id, type_, raw in rows:
        payload = json.loads(raw) if isinstance(raw, str) else dict(raw)
        changed = False
        for name in _EVENT_REF_FIELDS[str(type_)]:
            ref = payload.get(name)
            if isinstance(ref, str) and ref in mapping:
                payload[name] = mapping[ref]
                changed = True
        if changed:
            con.execute(
                "UPDATE events SET payload = $1 WHERE id = $2", [json.dumps(payload), event_id]
            )


async def fork(store: Store, selector: str, ref: str | None = None) -> SessionRecord:
    """A new session whose history is ``selector``'s path up to event ``ref`` (default: leaf)."""
    suffix = FORK_NAME_SUFFIX
    return await store.transaction(lambda con: copy_path_sql(con, selector, ref, suffix))


async def clone(store: Store, selector: str) -> SessionRecord:
    """A new session holding a copy of ``selector``'s whole active path."""
    suffix = CLONE_NAME_SUFFIX
    return await store.transaction(lambda con: copy_path_sql(con, selector, None, suffix))


# -- branching -------------------------------------------------------------------------------


@dataclass(frozen=True)
class BranchResult:
    session_id: str
    target_seq: int  # the branch point
    leaf_id: str  # the new leaf: the branch point, or the summary recorded on it
    leaf_seq: int
    summary_seq: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def branch(
    store: Store, selector: str, ref: str, *, summary: str | None = None
) -> BranchResult:
    """Move ``selector``'s leaf to event ``ref``; with ``summary``, record it there first.

    The caller makes sure nobody appends to the session meanwhile (the daemon refuses a running
    session and unloads an idle one: its in-memory context was built from the old leaf).
    """
    if summary is not None and not summary.strip():
        raise UserError("the branch summary is empty")
    if summary is not None and len(summary) > BRANCH_SUMMARY_MAX_CHARS:
        raise UserError(f"the branch summary is longer than {BRANCH_SUMMARY_MAX_CHARS} characters")

    def locate(con: duckdb.DuckDBPyConnection) -> tuple[SessionRecord, str | None, str, int]:
        session = find_session_sql(con, selector)
        target_id, target_seq = resolve_event_sql(con, session.id, ref)
        return session, effective_leaf(con, session), target_id, target_seq

    session, old_leaf, target_id, target_seq = await store.read(locate)
    if summary is None:
        await store.update_session(session.id, leaf_event_id=target_id)
        return BranchResult(session.id, target_seq, target_id, target_seq, None)
    payload = BranchSummaryPayload(summary=summary, from_event_id=old_leaf)
    rec = await store.append(session.id, "branch_summary", payload, parent_event_id=target_id)
    return BranchResult(session.id, target_seq, rec.id, rec.seq, rec.seq)


# -- listing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeNode:
    seq: int
    id: str
    parent_seq: int | None
    type: str
    text: str  # the first line of the event's text, cut to TREE_TEXT_CHARS
    active: bool  # on the path from the root to the leaf

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TreePage:
    session_id: str
    name: str | None
    leaf_seq: int | None
    total: int  # events in the session
    nodes: list[TreeNode]
    next_after: int | None  # pass as after_seq for the next page; None: this was the last

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["nodes"] = [n.as_dict() for n in self.nodes]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TreePage:
        nodes = [TreeNode(**n) for n in data.get("nodes") or []]
        return cls(
            session_id=str(data["session_id"]),
            name=data.get("name"),
            leaf_seq=data.get("leaf_seq"),
            total=int(data.get("total") or 0),
            nodes=nodes,
            next_after=data.get("next_after"),
        )


_CALL_ARGS = "e.payload->'tool_calls'->0->>'arguments'"
_TREE_SQL = f"""
SELECT e.seq, e.id, p.seq, e.type,
       left(e.payload->>'text', {_SNIPPET_SQL_CHARS}),
       left(e.payload->>'summary', {_SNIPPET_SQL_CHARS}),
       left(e.payload->>'message', {_SNIPPET_SQL_CHARS}),
       e.payload->>'reason',
       e.payload->>'entry_type',
       left(e.payload->'fields'->>'customType', {_SNIPPET_SQL_CHARS}),
       left(CASE WHEN json_valid({_CALL_ARGS}) THEN json_extract_string({_CALL_ARGS}, '$.code')
                 ELSE {_CALL_ARGS} END, {_SNIPPET_SQL_CHARS}),
       e.payload->>'model'
FROM events e LEFT JOIN events p ON p.id = e.parent_event_id AND p.session_id = $1
WHERE e.session_id = $1 AND e.seq > $2
ORDER BY e.seq
LIMIT $3
"""
_ACTIVE_IDS_SQL = f"""
WITH RECURSIVE path(id, parent_event_id, depth) AS (
    SELECT id, parent_event_id, 0 FROM events WHERE id = $2 AND session_id = $1
    UNION ALL
    SELECT e.id, e.parent_event_id, p.depth + 1
    FROM events e JOIN path p ON e.id = p.parent_event_id
    WHERE e.session_id = $1 AND p.depth < {ACTIVE_PATH_MAX_DEPTH}
)
SELECT id FROM path WHERE id IN (SELECT unnest($3::VARCHAR[]))
"""


def _first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        line = " ".join(line.split())
        if line:
            return line if len(line) <= TREE_TEXT_CHARS else line[: TREE_TEXT_CHARS - 1] + _ELLIPSIS
    return ""


def _snippet(type_: str, fields: tuple[Any, ...]) -> str:
    text, summary, message, reason, entry_type, custom_type, code, model = fields
    if type_ == "assistant_message" and not (text or "").strip() and code:
        return "» ipython: " + _first_line(code)
    if type_ == "custom":
        return _first_line(" ".join(str(x) for x in (entry_type, custom_type) if x))
    if type_ in ("usage", "model_change"):
        return _first_line(model)
    for candidate in (text, summary, message, reason):
        line = _first_line(candidate)
        if line:
            return line
    return ""


def tree_page_sql(
    con: duckdb.DuckDBPyConnection, selector: str, after_seq: int, limit: int | None
) -> TreePage:
    session = find_session_sql(con, selector)
    leaf = effective_leaf(con, session)
    count_row = con.execute(
        "SELECT count(*) FROM events WHERE session_id = $1", [session.id]
    ).fetchone()
    total = int(count_row[0]) if count_row is not None else 0
    # LIMIT NULL is "no limit" in DuckDB.
    rows = con.execute(_TREE_SQL, [session.id, after_seq, limit]).fetchall()
    ids = [str(row[1]) for row in rows]
    active: set[str] = set()
    if leaf is not None and ids:
        found = con.execute(_ACTIVE_IDS_SQL, [session.id, leaf, ids]).fetchall()
        active = {str(row[0]) for row in found}
    leaf_row = (
        con.execute("SELECT seq FROM events WHERE id = $1", [leaf]).fetchone() if leaf else None
    )
    nodes = [
        TreeNode(
            seq=int(row[0]),
            id=str(row[1]),
            parent_seq=int(row[2]) if row[2] is not None else None,
            type=str(row[3]),
            text=_snippet(str(row[3]), tuple(row[4:])),
            active=str(row[1]) in active,
        )
        for row in rows
    ]
    more = limit is not None and len(nodes) == limit and nodes[-1].seq < _last_seq(con, session.id)
    return TreePage(
        session_id=session.id,
        name=session.name,
        leaf_seq=int(leaf_row[0]) if leaf_row is not None else None,
        total=total,
        nodes=nodes,
        next_after=nodes[-1].seq if more else None,
    )


def _last_seq(con: duckdb.DuckDBPyConnection, session_id: str) -> int:
    row = con.execute(
        "SELECT coalesce(max(seq), 0) FROM events WHERE session_id = $1", [session_id]
    ).fetchone()
    return int(row[0]) if row is not None else 0


async def tree_page(
    store: Store, selector: str, *, after_seq: int = 0, limit: int | None = None
) -> TreePage:
    """The session's events after ``after_seq`` (at most ``limit``) as tree nodes."""
    return await store.read(lambda con: tree_page_sql(con, selector, after_seq, limit))


def render_tree(page: TreePage) -> list[str]:
    """The lines ``prime-agent tree`` prints: one per event, a branch point's children drawn
    with ``├─``/``└─`` and indented; ``*`` marks the active path, ``← leaf`` its end."""
    nodes = page.nodes
    seqs = {n.seq for n in nodes}
    children: dict[int | None, list[TreeNode]] = {}
    for node in nodes:  # seq order, so each child list is in seq order
        parent = node.parent_seq if node.parent_seq in seqs else None
        children.setdefault(parent, []).append(node)
    width = len(str(nodes[-1].seq)) if nodes else 1
    lines: list[str] = []
    # (node, what precedes it on its own line, what precedes its descendants' lines); a stack,
    # not recursion: a 100,000-event chain is 100,000 levels deep.
    stack: list[tuple[TreeNode, str, str]] = []

    def push_children(kids: list[TreeNode], rest: str) -> None:
        if len(kids) == 1:
            stack.append((kids[0], rest, rest))
            return
        for index in range(len(kids) - 1, -1, -1):
            last = index == len(kids) - 1
            lead = rest + ("└─ " if last else "├─ ")
            stack.append((kids[index], lead, rest + ("   " if last else "│  ")))

    push_children(children.get(None, []), "")
    while stack:
        node, lead, rest = stack.pop()
        mark = "*" if node.active else " "
        tail = "  ← leaf" if node.seq == page.leaf_seq else ""
        text = f"  {node.text}" if node.text else ""
        lines.append(f"{mark} {lead}{node.seq:>{width}} {node.type}{text}{tail}")
        push_children(children.get(node.seq, []), rest)
    return lines
