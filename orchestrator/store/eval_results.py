"""The ``eval_results`` table: one row per ``prime-agent run --config F`` (docs/control.md).

A result says what the run was asked (the normalised config and its fingerprint), how it
stopped (stop reason, exit code, the last gate results) and what it cost across the whole
session tree: the root and every descendant, tokens and cost summed from the ``usage`` rows,
which carry their tree's ``root_id``. Cost stays honest as in ``UsageSummary``: ``cost_usd`` is
the sum of the calls whose price is known (None when no call's was), and ``cost_known`` is
False as soon as one call's price was unknown.

The same row is written as a JSON file next to the config (``write_result_json``) so a
person or a sweep can read it without the database.

Like ``queries``, the table functions take the DuckDB connection and run on the store's writer
thread (``Store.read`` / ``Store.transaction``); ``build_result`` and ``save_result`` are the
async entry points for the CLI.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import duckdb
from pydantic import BaseModel

from orchestrator.errors import StoreError
from orchestrator.ids import new_event_id
from orchestrator.store.queries import from_db_ts, to_db_ts

if TYPE_CHECKING:
    from orchestrator.store.db import Store

__all__ = [
    "EVAL_RESULT_FILE_MODE",
    "EVAL_RESULT_ID_PREFIX",
    "EvalResultRow",
    "RunConfig",
    "TreeUsage",
    "build_result",
    "insert_eval_result",
    "new_eval_result_id",
    "save_result",
    "select_eval_result",
    "select_recent_eval_results",
    "select_tree_usage",
    "write_result_json",
]

EVAL_RESULT_ID_PREFIX: Final = "e-"
EVAL_RESULT_FILE_MODE: Final = 0o600  # results name commands and paths; keep them private

_JSON_FIELDS = frozenset({"config", "gates"})
_TIME_FIELDS = frozenset({"started_at", "finished_at"})


class RunConfig(Protocol):
    """What a result needs of the config the run was asked with (``EvalConfig`` of
    ``control/eval_config.py`` is one): the record it stores, the normalised config and its
    fingerprint as JSON types. The store reads nothing else of it."""

    def record(self) -> dict[str, Any]: ...


def new_eval_result_id() -> str:
    """``e-`` and a sortable unique suffix: ids sort in creation order, like event ids."""
    return EVAL_RESULT_ID_PREFIX + new_event_id()


@dataclass(frozen=True)
class EvalResultRow:
    """One row of ``eval_results``; the migration (0006) documents each column."""

    id: str
    config_path: str | None
    config: dict[str, Any]
    session_id: str
    stop_reason: str
    exit_code: int
    gates: list[dict[str, Any]]
    sessions: int
    tokens_input: int
    tokens_output: int
    cost_usd: float | None
    cost_known: bool
    started_at: datetime
    finished_at: datetime
    wall_s: float

    @property
    def tokens(self) -> int:
        return self.tokens_input + self.tokens_output

    def to_wire(self) -> dict[str, Any]:
        """JSON types, keys in a fixed order (the config last, its keys sorted): the JSON file
        and the control API show the same thing."""
        wire: dict[str, Any] = {}
        for name in _WIRE_ORDER:
            value = getattr(self, name)
            wire[name] = value.isoformat() if isinstance(value, datetime) else _sorted(value)
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> EvalResultRow:
        """The row ``to_wire`` gave (as the daemon answers ``record_eval_result``)."""
        data = {name: wire[name] for name in _COLUMNS}
        for name in _TIME_FIELDS:
            data[name] = datetime.fromisoformat(str(data[name]))
        return cls(**data)


_COLUMNS: Final = tuple(f.name for f in fields(EvalResultRow))
_COLUMN_LIST = ", ".join(_COLUMNS)
# The run's outcome first, then what it cost, then what it was asked.
_ASKED: Final = ("config_path", "config")
_WIRE_ORDER: Final = (*(n for n in _COLUMNS if n not in _ASKED), *_ASKED)


def _sorted(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _sorted(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [_sorted(v) for v in value]
    return value


def _to_db(name: str, value: Any) -> Any:
    if name in _JSON_FIELDS:
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    if name in _TIME_FIELDS:
        return to_db_ts(value)
    return value


def _row(values: Sequence[Any]) -> EvalResultRow:
    data = dict(zip(_COLUMNS, values, strict=True))
    for name in _JSON_FIELDS:
        data[name] = json.loads(data[name])
    for name in _TIME_FIELDS:
        data[name] = from_db_ts(data[name])
    return EvalResultRow(**data)


def insert_eval_result(con: duckdb.DuckDBPyConnection, row: EvalResultRow) -> EvalResultRow:
    placeholders = ", ".join(f"${i}" for i in range(1, len(_COLUMNS) + 1))
    con.execute(
        f"INSERT INTO eval_results ({_COLUMN_LIST}) VALUES ({placeholders})",
        [_to_db(name, getattr(row, name)) for name in _COLUMNS],
    )
    return row


def select_eval_result(con: duckdb.DuckDBPyConnection, result_id: str) -> EvalResultRow | None:
    values = con.execute(
        f"SELECT {_COLUMN_LIST} FROM eval_results WHERE id = $1", [result_id]
    ).fetchone()
    return None if values is None else _row(values)


def select_recent_eval_results(con: duckdb.DuckDBPyConnection, limit: int) -> list[EvalResultRow]:
    """The newest ``limit`` results, newest first (by finish time)."""
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    rows = con.execute(
        f"SELECT {_COLUMN_LIST} FROM eval_results ORDER BY finished_at DESC, id DESC LIMIT $1",
        [limit],
    ).fetchall()
    return [_row(values) for values in rows]


# -- the tree's usage ------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeUsage:
    """Model-call totals of one session tree (the root and all its descendants)."""

    sessions: int
    calls: int
    input: int
    output: int
    cost_usd: float | None  # known prices only; None when no call had one (and calls > 0)
    unknown_cost_calls: int

    @property
    def cost_known(self) -> bool:
        return self.unknown_cost_calls == 0


_TREE_USAGE_SQL = """
SELECT
    (SELECT count(*) FROM sessions WHERE root_id = $1),
    count(*),
    coalesce(sum(input), 0),
    coalesce(sum(output), 0),
    sum(cost_usd) FILTER (WHERE cost_known),
    count(*) FILTER (WHERE NOT cost_known)
FROM usage WHERE root_id = $1
"""


def select_tree_usage(con: duckdb.DuckDBPyConnection, root_id: str) -> TreeUsage:
    """Totals over every ``usage`` row of the tree rooted at ``root_id``, in one statement
    (one snapshot: sessions and usage are counted at the same instant)."""
    row = con.execute(_TREE_USAGE_SQL, [root_id]).fetchone()
    assert row is not None  # an aggregate always returns one row
    sessions, calls, inp, out, cost, unknown = row
    calls = int(calls)
    if cost is None and calls == 0:
        cost = 0.0  # nothing was called: that costs nothing, and that is known
    return TreeUsage(
        sessions=int(sessions),
        calls=calls,
        input=int(inp),
        output=int(out),
        cost_usd=None if cost is None else float(cost),
        unknown_cost_calls=int(unknown),
    )


def _root_of(con: duckdb.DuckDBPyConnection, session_id: str) -> str | None:
    row = con.execute("SELECT root_id FROM sessions WHERE id = $1", [session_id]).fetchone()
    return None if row is None else str(row[0])


# -- building, storing and writing a result --------------------------------------------------


def _gate_dict(gate: Mapping[str, Any] | BaseModel) -> dict[str, Any]:
    if isinstance(gate, BaseModel):
        return gate.model_dump(mode="json")
    return dict(gate)


async def build_result(
    store: Store,
    *,
    config: RunConfig,
    config_path: Path | str | None,
    root_session_id: str,
    stop_reason: str,
    exit_code: int,
    gates: Sequence[Mapping[str, Any] | BaseModel],
    started_at: datetime,
    finished_at: datetime,
) -> EvalResultRow:
    """The result of one run whose root session is ``root_session_id``: tokens and cost
    summed over the whole tree. ``gates`` are the last gate results (``GateResultPayload``s or
    their dicts). Nothing is written: ``save_result`` does that."""
    if not stop_reason:
        raise ValueError("stop_reason must not be empty")

    def read(con: duckdb.DuckDBPyConnection) -> tuple[str | None, TreeUsage]:
        return _root_of(con, root_session_id), select_tree_usage(con, root_session_id)

    root, usage = await store.read(read)
    if root is None:
        raise StoreError(f"no session {root_session_id!r}")
    if root != root_session_id:
        raise ValueError(
            f"session {root_session_id} is not a root (its tree's root is {root}); "
            "a result covers a whole tree"
        )
    return EvalResultRow(
        id=new_eval_result_id(),
        config_path=None if config_path is None else str(Path(config_path).resolve()),
        config=config.record(),
        session_id=root_session_id,
        stop_reason=stop_reason,
        exit_code=exit_code,
        gates=[_gate_dict(g) for g in gates],
        sessions=usage.sessions,
        tokens_input=usage.input,
        tokens_output=usage.output,
        cost_usd=usage.cost_usd,
        cost_known=usage.cost_known,
        started_at=started_at,
        finished_at=finished_at,
        wall_s=max(0.0, (finished_at - started_at).total_seconds()),
    )


def write_result_json(row: EvalResultRow, path: Path) -> Path:
    """Write ``row`` as JSON to ``path``: mode 0600, replaced atomically (a reader sees the
    old file or the new one, never half of it), keys in a stable order."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(row.to_wire(), indent=2, ensure_ascii=False) + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{new_event_id()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, EVAL_RESULT_FILE_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        # os.open's mode is masked by the umask; the file must end up 0600 whatever it is.
        os.chmod(tmp, EVAL_RESULT_FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


async def save_result(store: Store, row: EvalResultRow, json_path: Path | None) -> None:
    """Insert ``row`` into ``eval_results`` and, when ``json_path`` is given, write the JSON
    file (after the row commits, so a file never names a result the database lacks)."""
    await store.transaction(lambda con: insert_eval_result(con, row))
    if json_path is not None:
        write_result_json(row, json_path)
