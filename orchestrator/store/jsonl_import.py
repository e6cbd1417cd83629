"""Import a pi / Prime Agent session file as a new session: the ``ParsedSession`` that
``jsonl_parse.py`` read and validated is written in ONE transaction (the session's row, every
event, the usage rows), so a file that fails anywhere imports nothing (``UserError`` naming the
line: the CLI prints one line and exits 2). docs/tree.md.

- Nothing of an entry is lost: each message, compaction, branch summary and model change keeps
  the file's entry in its payload's ``source_entry``, and an export writes it back under its own
  id. The header line is kept whole in the session's ``imported_header``, so an export writes it
  back too: import → export → import → export gives the same file twice.
- The file's entry ids become new event ids; payload fields that name another entry
  (``PAYLOAD_REFERENCES``, and a ``custom`` entry's reference fields) are remapped with them.
- The model is the file's newest on the active path unless given; the name is the file's
  ``session_info`` name, else its first user line (``NAME (import)`` when taken).
- Each assistant message with usage becomes a usage row marked ``imported``: ``usage`` shows
  the file's tokens and cost, and no budget counts them (another installation made the calls).
- A file whose cwd does not exist here is imported into the fallback directory; the original is
  kept (the header) and the result carries a ``notice`` saying so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import duckdb
from pydantic import ValidationError

from orchestrator.errors import UserError
from orchestrator.ids import new_event_id, new_session_id
from orchestrator.store import queries
from orchestrator.store.events import EVENT_PAYLOADS
from orchestrator.store.jsonl import REFERENCE_FIELDS
from orchestrator.store.jsonl_parse import (
    PAYLOAD_REFERENCES,
    Draft,
    ParsedSession,
    validation_reason,
)
from orchestrator.store.queries import SessionRecord, to_db_ts
from orchestrator.store.tree import SESSION_NAME_MAX_CHARS, unique_name_sql

if TYPE_CHECKING:
    from orchestrator.store.db import Store

__all__ = [
    "IMPORT_NAME_SUFFIX",
    "ImportOptions",
    "ImportResult",
    "import_session_jsonl",
]

# An imported session whose name is taken is named "NAME (import)", "NAME (import 2)" ...
IMPORT_NAME_SUFFIX: Final = "import"


@dataclass(frozen=True)
class ImportOptions:
    model: str | None = None  # None: the file's newest model, else default_model
    default_model: str = ""
    cwd: str | None = None  # None: the file's cwd when it is a directory here, else fallback_cwd
    fallback_cwd: str = "/"
    backend: str = "local"
    name: str | None = None  # None: the file's session_info name, else its first user line


@dataclass(frozen=True)
class ImportResult:
    session: SessionRecord
    version: int
    events: int
    custom: int  # entries kept as custom events (no event type of their own)
    usage_rows: int = 0  # imported calls (usage rows marked imported)
    # The file's cwd when the session could not use it (it does not exist here).
    original_cwd: str | None = None

    @property
    def notice(self) -> str | None:
        if self.original_cwd is None:
            return None
        return (
            f"the file's directory {self.original_cwd} does not exist here: the session works "
            f"in {self.session.cwd} (the original stays recorded and an export writes it back)"
        )

    def as_dict(self) -> dict[str, Any]:
        s = self.session
        return {
            "session": s.id,
            "name": s.name,
            "model": s.model,
            "cwd": s.cwd,
            "backend": s.backend,
            "version": self.version,
            "events": self.events,
            "custom": self.custom,
            "usage_rows": self.usage_rows,
            "original_cwd": self.original_cwd,
            "notice": self.notice,
        }


_INSERT_EVENTS = """
INSERT INTO events (session_id, seq, id, parent_event_id, type, ts, payload)
SELECT unnest($1::VARCHAR[]), unnest($2::BIGINT[]), unnest($3::VARCHAR[]),
       unnest($4::VARCHAR[]), unnest($5::VARCHAR[]), unnest($6::TIMESTAMP[]),
       unnest($7::VARCHAR[])::JSON
"""


def _clean(text: str) -> str:
    """Lone surrogates (from ``\\udc80`` escapes) → U+FFFD: DuckDB refuses them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


_INSERT_USAGE = """
INSERT INTO usage (event_id, session_id, root_id, provider, model, input, output, cache_read,
                   cache_write, cost_usd, cost_known, latency_ms, ts, imported)
SELECT unnest($1::VARCHAR[]), $2, $2, unnest($3::VARCHAR[]), unnest($4::VARCHAR[]),
       unnest($5::BIGINT[]), unnest($6::BIGINT[]), unnest($7::BIGINT[]), unnest($8::BIGINT[]),
       unnest($9::DOUBLE[]), unnest($10::BOOLEAN[]), 0, unnest($11::TIMESTAMP[]), true
"""


def _insert_usage(
    con: duckdb.DuckDBPyConnection,
    session_id: str,
    drafts: list[Draft],
    new_ids: dict[str, str],
) -> int:
    """A usage row (marked imported) for each assistant message that reports usage."""
    rows = [
        (new_ids[d.key], d.payload["usage"], d.ts)
        for d in drafts
        if d.type == "assistant_message" and d.payload.get("usage")
    ]
    if rows:
        con.execute(
            _INSERT_USAGE,
            [
                [event_id for event_id, _, _ in rows],
                session_id,
                [str(u["provider"]) for _, u, _ in rows],
                [str(u["model"]) for _, u, _ in rows],
                [int(u["input"]) for _, u, _ in rows],
                [int(u["output"]) for _, u, _ in rows],
                [int(u["cache_read"]) for _, u, _ in rows],
                [int(u["cache_write"]) for _, u, _ in rows],
                [u["cost_usd"] for _, u, _ in rows],
                [u["cost_usd"] is not None for _, u, _ in rows],
                [to_db_ts(ts) for _, _, ts in rows],
            ],
        )
    return len(rows)


def _remap(payload: dict[str, Any], type_: str, new_ids: dict[str, str]) -> dict[str, Any]:
    """The file's entry ids inside a payload → the new event ids (None: no such entry)."""
    keys = PAYLOAD_REFERENCES.get(type_)
    if keys is not None:
        return {**payload, **{k: new_ids.get(payload.get(k) or "") for k in keys}}
    if type_ == "custom":
        fields = dict(payload["fields"])
        for key in REFERENCE_FIELDS:
            value = fields.get(key)
            if isinstance(value, str) and value in new_ids:
                fields[key] = new_ids[value]
        return {**payload, "fields": fields}
    return payload


def _payload_json(source: str, draft: Draft, payload: dict[str, Any]) -> str:
    model = EVENT_PAYLOADS[draft.type]
    try:
        dumped = model.model_validate(payload).model_dump(mode="json")
    except ValidationError as exc:
        raise UserError(f"{source} line {draft.line}: {validation_reason(exc)}") from None
    return _clean(json.dumps(dumped, ensure_ascii=False, allow_nan=False))


def _default_name(parsed: ParsedSession) -> str | None:
    if parsed.name:
        return parsed.name.strip()[:SESSION_NAME_MAX_CHARS] or None
    for draft in parsed.drafts:
        if draft.type == "user_message":
            for line in str(draft.payload.get("text", "")).splitlines():
                if line.strip():
                    return line.strip()[:SESSION_NAME_MAX_CHARS]
    return None


def _cwd(parsed: ParsedSession, options: ImportOptions) -> tuple[str, str | None]:
    """(the session's directory, the file's when it could not be used: for the notice)."""
    if options.cwd is not None:
        return options.cwd, None
    here = Path(parsed.cwd) if parsed.cwd else None
    try:
        usable = here is not None and here.is_absolute() and here.is_dir()
    except (OSError, ValueError):
        usable = False
    if usable and here is not None:
        return str(here), None
    return options.fallback_cwd, parsed.cwd or None


def _insert_sql(
    con: duckdb.DuckDBPyConnection, parsed: ParsedSession, options: ImportOptions
) -> ImportResult:
    drafts = parsed.drafts
    new_ids = {d.key: new_event_id() for d in drafts}
    texts = [
        _payload_json(
            parsed.source,
            d,
            {**_remap(d.payload, d.type, new_ids), "source_entry": d.entry}
            if d.entry is not None
            else _remap(d.payload, d.type, new_ids),
        )
        for d in drafts
    ]
    name = _clean(options.name) if options.name else _default_name(parsed)
    if name is not None:
        taken = con.execute("SELECT count(*) FROM sessions WHERE name = $1", [name]).fetchone()
        if taken is not None and int(taken[0]) > 0:
            name = unique_name_sql(con, name, IMPORT_NAME_SUFFIX)
    session_id = new_session_id()
    cwd, original_cwd = _cwd(parsed, options)
    record = SessionRecord(
        id=session_id,
        root_id=session_id,
        cwd=cwd,
        model=options.model or parsed.model or options.default_model,
        backend=options.backend,
        name=name,
        status="inactive",
        leaf_event_id=new_ids.get(parsed.leaf or ""),
        created_at=parsed.created_at,
    )
    stored = queries.insert_session(con, record)
    header = _clean(json.dumps(parsed.header, ensure_ascii=False, allow_nan=False))
    con.execute(
        "UPDATE sessions SET imported_header = $2::JSON WHERE id = $1", [session_id, header]
    )
    if drafts:
        con.execute(
            _INSERT_EVENTS,
            [
                [session_id] * len(drafts),
                list(range(1, len(drafts) + 1)),
                [new_ids[d.key] for d in drafts],
                [new_ids[d.parent] if d.parent is not None else None for d in drafts],
                [d.type for d in drafts],
                [to_db_ts(d.ts) for d in drafts],
                texts,
            ],
        )
    usage_rows = _insert_usage(con, session_id, drafts, new_ids)
    custom = sum(1 for d in drafts if d.type == "custom")
    return ImportResult(stored, parsed.version, len(drafts), custom, usage_rows, original_cwd)


async def import_session_jsonl(
    store: Store, parsed: ParsedSession, options: ImportOptions
) -> ImportResult:
    """Write ``parsed`` as a new inactive session, all of it or (on any error) nothing."""
    return await store.transaction(lambda con: _insert_sql(con, parsed, options))
