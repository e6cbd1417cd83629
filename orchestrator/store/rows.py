"""One table of dataclass rows keyed by ``id``: how its columns go to DuckDB and back.

``refinements`` and ``harness_proposals`` share this shape: JSON columns stored as text, times
as UTC without a zone (``queries.to_db_ts``), a ``status`` from a fixed set, rows inserted
whole and updated by naming columns. ``RowTable`` holds that once; each store module keeps its
own row type, statuses and queries.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import duckdb

from orchestrator.errors import HarnessNotFound
from orchestrator.store.queries import from_db_ts, to_db_ts

__all__ = ["RowTable"]

R = TypeVar("R")


@dataclass(frozen=True)
class RowTable(Generic[R]):
    """``table``'s rows as ``make(**columns)``; ``what`` names one row in messages."""

    table: str
    what: str
    columns: tuple[str, ...]
    make: Callable[..., R]
    json_fields: frozenset[str]
    time_fields: frozenset[str]
    statuses: tuple[str, ...]

    @property
    def column_list(self) -> str:
        return ", ".join(self.columns)

    def check_status(self, value: object) -> None:
        if value not in self.statuses:
            raise ValueError(
                f"unknown {self.what} status {value!r}: expected one of {', '.join(self.statuses)}"
            )

    def to_db(self, name: str, value: Any) -> Any:
        if value is None:
            return None
        if name in self.json_fields:
            return json.dumps(value, ensure_ascii=False)
        if name in self.time_fields:
            return to_db_ts(value)
        return value

    def row(self, values: Sequence[Any]) -> R:
        data = dict(zip(self.columns, values, strict=True))
        for name in self.json_fields:
            if data[name] is not None:
                data[name] = json.loads(data[name])
        for name in self.time_fields:
            if data[name] is not None:
                data[name] = from_db_ts(data[name])
        return self.make(**data)

    def insert(self, con: duckdb.DuckDBPyConnection, row: R) -> R:
        self.check_status(getattr(row, "status"))  # noqa: B009 - every row type has one
        placeholders = ", ".join(f"${i}" for i in range(1, len(self.columns) + 1))
        con.execute(
            f"INSERT INTO {self.table} ({self.column_list}) VALUES ({placeholders})",
            [self.to_db(name, getattr(row, name)) for name in self.columns],
        )
        return row

    def select(self, con: duckdb.DuckDBPyConnection, row_id: str) -> R | None:
        values = con.execute(
            f"SELECT {self.column_list} FROM {self.table} WHERE id = $1", [row_id]
        ).fetchone()
        return None if values is None else self.row(values)

    def update(self, con: duckdb.DuckDBPyConnection, row_id: str, changes: dict[str, Any]) -> R:
        """Set the named columns of one row; the row as stored afterwards. ``ValueError`` for
        a name that is not a column (or ``id``) or an unknown status; ``HarnessNotFound``
        when there is no such row."""
        unknown = sorted(name for name in changes if name not in self.columns or name == "id")
        if unknown:
            raise ValueError(f"{self.what}s have no updatable field(s) {', '.join(unknown)}")
        if "status" in changes:
            self.check_status(changes["status"])
        if changes:
            names = list(changes)
            assignments = ", ".join(f"{name} = ${i}" for i, name in enumerate(names, start=2))
            con.execute(
                f"UPDATE {self.table} SET {assignments} WHERE id = $1",
                [row_id, *(self.to_db(name, changes[name]) for name in names)],
            )
        row = self.select(con, row_id)
        if row is None:
            raise HarnessNotFound(f"no {self.what} {row_id!r}")
        return row
