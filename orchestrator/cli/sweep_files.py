"""Rows written as Parquet, CSV or JSON lines: ``sweep export`` and a shard's export
(``cli/sweep_shards.py``). Parquet goes through DuckDB, each column with the type given
(``VARCHAR`` when none is)."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

__all__ = ["FORMATS", "read_parquet", "write_rows"]

FORMATS: Final = ("parquet", "csv", "jsonl")
_DEFAULT_TYPE: Final = "VARCHAR"


def write_rows(
    rows: Sequence[Mapping[str, Any]],
    path: Path,
    kind: str,
    fields: Sequence[str],
    types: Mapping[str, str],
) -> None:
    """``rows`` (their ``fields``, in that order) into ``path`` as ``kind``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "jsonl":
        with path.open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps({k: row.get(k) for k in fields}, ensure_ascii=False) + "\n")
        return
    if kind == "csv":
        with path.open("w", encoding="utf-8", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(fields), extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        return
    import duckdb

    staged = path.with_name(f".{path.name}.jsonl")
    write_rows(rows, staged, "jsonl", fields, types)
    try:
        con = duckdb.connect()
        try:
            columns = ", ".join(f"'{k}': '{types.get(k, _DEFAULT_TYPE)}'" for k in fields)
            # COPY takes no parameters: the paths are SQL string literals, quotes doubled.
            source, target = (str(p).replace("'", "''") for p in (staged, path))
            con.execute(
                f"COPY (SELECT * FROM read_json('{source}', format='newline_delimited', "
                f"columns={{{columns}}})) TO '{target}' (FORMAT parquet)"
            )
        finally:
            con.close()
    finally:
        staged.unlink(missing_ok=True)


def read_parquet(path: Path) -> list[dict[str, Any]]:
    """Every row of a Parquet file, as a dict by column name."""
    import duckdb

    con = duckdb.connect()
    try:
        result = con.execute("SELECT * FROM read_parquet($1)", [str(path)])
        names = [d[0] for d in result.description or ()]
        return [dict(zip(names, values, strict=True)) for values in result.fetchall()]
    finally:
        con.close()
