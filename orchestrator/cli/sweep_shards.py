"""A shard's results as Parquet, and shards merged into one store (docs/sweeps.md, "Shards").

``sweep run FILE --shard i/N --export-dir DIR`` ends by writing its cells and trials as two
Parquet files (``sweeps/shards.py`` names them). Every row carries the sweep's name and digest
(the hash of its file), and each cell row the shard, the file's spec and how many cells the
whole file has, so a merge needs nothing but the files. A cell's ``position`` is its place in
the whole file (not in the shard), so a merged sweep lists its cells as a local run does.

``sweep merge DIR_OR_FILES... [--into FILE]`` reads the exports, refuses shards of different
sweep files, and folds them into a store (``store/sweep_merge.py``: each cell and trial once;
the more complete, then the later, result of a cell wins).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from orchestrator.cli.sweep_files import read_parquet, write_rows
from orchestrator.errors import UserError

if TYPE_CHECKING:
    from orchestrator.cli.connect import DaemonLink
    from orchestrator.store.sweep_merge import MergeCounts, ShardResults
    from orchestrator.sweeps.grid import Cell
    from orchestrator.sweeps.shards import Shard
    from orchestrator.sweeps.spec import SweepFile

__all__ = [
    "CELL_EXPORT_TYPES",
    "EXPORT_PAGE_CELLS",
    "export_shard",
    "find_exports",
    "merge_exports",
    "read_exports",
]

# Cells (with their trials) per sweep_status call while exporting: answers are long.
EXPORT_PAGE_CELLS: Final = 25
_IDENTITY: Final = ("sweep", "digest", "spec", "shard", "shards", "cells_total")
CELL_EXPORT_TYPES: Final = {
    "shard": "INTEGER",
    "shards": "INTEGER",
    "cells_total": "INTEGER",
    "seed": "BIGINT",
    "context_tokens": "INTEGER",
    "score": "DOUBLE",
    "tokens": "BIGINT",
    "cost_usd": "DOUBLE",
    "cost_known": "BOOLEAN",
    "wall_s": "DOUBLE",
    "truncated": "BOOLEAN",
    "trials": "INTEGER",
    "position": "INTEGER",
}
_TRIAL_TYPES: Final = {
    "score": "DOUBLE",
    "tokens_input": "BIGINT",
    "tokens_output": "BIGINT",
    "cost_usd": "DOUBLE",
    "cost_known": "BOOLEAN",
    "wall_s": "DOUBLE",
    "truncated": "BOOLEAN",
}
_TIMES: Final = ("updated_at", "started_at", "finished_at")


def _cell_fields() -> tuple[str, ...]:
    from orchestrator.store.sweep_merge import CELL_COLUMNS

    return (*_IDENTITY, *CELL_COLUMNS)


def _trial_fields() -> tuple[str, ...]:
    from orchestrator.store.sweeps import TRIAL_COLUMNS

    return ("digest", *TRIAL_COLUMNS)


async def export_shard(
    link: DaemonLink,
    spec: SweepFile,
    shard: Shard,
    every_cell: Sequence[Cell],
    export_dir: Path,
) -> Path:
    """Write the shard's cells and trials, as its store holds them, into ``export_dir``;
    the cells file. Written beside and renamed into place, so a reader never sees half."""
    from orchestrator.sweeps.grid import HARNESS_VERSION
    from orchestrator.sweeps.shards import CELLS_SUFFIX, TRIALS_SUFFIX

    places = {c.fingerprint: i for i, c in enumerate(every_cell)}
    cells: list[dict[str, Any]] = []
    trials: list[dict[str, Any]] = []
    total: int | None = None
    while total is None or len(cells) < total:
        page = await link.call(
            "sweep_status",
            name=spec.name,
            offset=len(cells),
            limit=EXPORT_PAGE_CELLS,
            trials=True,
        )
        total = int(page["cells_total"])
        if not page["cells"]:
            break
        cells.extend(page["cells"])
        trials.extend(page["trials"])
    identity = {
        "sweep": spec.name,
        "digest": spec.digest(),
        "spec": json.dumps({**spec.normalised(), "harness": HARNESS_VERSION}, sort_keys=True),
        "shard": shard.index,
        "shards": shard.count,
        "cells_total": len(every_cell),
    }
    mine = [
        {**c, **identity, "position": places[c["fingerprint"]]}
        for c in cells
        if c["fingerprint"] in places and shard.owns(c["fingerprint"])
    ]
    kept = {c["fingerprint"] for c in mine}
    digest = identity["digest"]
    their_trials = [{**t, "digest": digest} for t in trials if t["fingerprint"] in kept]
    stem = export_dir / shard.stem(spec.name)
    cells_path = stem.with_name(stem.name + CELLS_SUFFIX)
    trials_path = stem.with_name(stem.name + TRIALS_SUFFIX)
    # The trials first: a cells file is what a merge looks for, and it comes last.
    for path, rows, fields, types in (
        (trials_path, their_trials, _trial_fields(), _TRIAL_TYPES),
        (cells_path, mine, _cell_fields(), CELL_EXPORT_TYPES),
    ):
        staged = path.with_name(f".{path.name}.part")
        write_rows(rows, staged, "parquet", fields, types)
        staged.replace(path)
    return cells_path


def find_exports(sources: Sequence[Path]) -> list[Path]:
    """The shards' cells files: each given file, and every ``*.cells.parquet`` of each given
    directory (by name)."""
    from orchestrator.sweeps.shards import CELLS_SUFFIX

    found: list[Path] = []
    for source in sources:
        if source.is_dir():
            found.extend(sorted(p for p in source.iterdir() if p.name.endswith(CELLS_SUFFIX)))
        elif source.is_file():
            if not source.name.endswith(CELLS_SUFFIX):
                raise UserError(f"{source}: not a shard's cells file (*{CELLS_SUFFIX})")
            found.append(source)
        else:
            raise UserError(f"{source}: no such file or directory")
    if not found:
        shown = ", ".join(str(s) for s in sources)
        raise UserError(f"no shard exports (*{CELLS_SUFFIX}) in {shown}")
    return list(dict.fromkeys(p.resolve() for p in found))


def _times(row: dict[str, Any]) -> dict[str, Any]:
    from datetime import datetime

    for key in _TIMES:
        if isinstance(row.get(key), str):
            row[key] = datetime.fromisoformat(row[key])
    return row


def read_exports(paths: Sequence[Path]) -> list[ShardResults]:
    """Each cells file with the trials file beside it; every file of one sweep and one digest
    (else one line naming the two that differ)."""
    from orchestrator.store.sweep_merge import CELL_COLUMNS, ShardResults
    from orchestrator.sweeps.shards import CELLS_SUFFIX, TRIALS_SUFFIX

    results: list[ShardResults] = []
    first: tuple[Path, str, str] | None = None
    for path in paths:
        try:
            rows = read_parquet(path)
        except Exception as exc:  # DuckDB's own errors: not Parquet, unreadable
            raise UserError(f"{path}: cannot read it as Parquet: {exc}") from None
        if not rows:
            continue  # a shard with no cells (more shards than cells)
        missing = [c for c in (*_IDENTITY, *CELL_COLUMNS) if c not in rows[0]]
        if missing:
            raise UserError(
                f"{path}: not a shard export of sweep run --export-dir (no {missing[0]} column)"
            )
        name, digest = str(rows[0]["sweep"]), str(rows[0]["digest"])
        if first is None:
            first = (path, name, digest)
        for row in rows:
            if (row["sweep"], row["digest"]) != (first[1], first[2]):
                raise UserError(
                    f"{path} is a shard of another sweep file than {first[0]} "
                    f"({row['sweep']} {str(row['digest'])[:12]} vs {first[1]} "
                    f"{first[2][:12]}): merge shards of one sweep file at a time"
                )
        trials_path = path.with_name(path.name[: -len(CELLS_SUFFIX)] + TRIALS_SUFFIX)
        trials = read_parquet(trials_path) if trials_path.is_file() else []
        if any(t["digest"] != digest for t in trials):
            raise UserError(f"{trials_path} does not belong to {path} (another digest)")
        results.append(
            ShardResults(
                sweep=name,
                digest=digest,
                spec=json.loads(rows[0]["spec"]),
                cells_total=int(rows[0]["cells_total"]),
                cells=[_times({c: row[c] for c in CELL_COLUMNS}) for row in rows],
                trials=[_times({k: v for k, v in t.items() if k != "digest"}) for t in trials],
            )
        )
    return results


def missing_shards(paths: Sequence[Path]) -> list[str]:
    """The shards (``i/N``) of the counts seen in ``paths``' names that were not given."""
    import re

    seen: dict[int, set[int]] = {}
    for path in paths:
        match = re.search(r"\.shard-(\d+)-of-(\d+)\.cells\.parquet$", path.name)
        if match:
            seen.setdefault(int(match.group(2)), set()).add(int(match.group(1)))
    return [f"{i}/{n}" for n, have in sorted(seen.items()) for i in range(n) if i not in have]


async def merge_exports(
    shards: Sequence[ShardResults], into: Path
) -> tuple[MergeCounts, list[dict[str, Any]]]:
    """Fold ``shards`` into the store file ``into`` (made if new); the counts, and the sweep's
    cells as the store now holds them (for the report)."""
    from orchestrator.errors import StoreLocked
    from orchestrator.paths import ensure_private_dir
    from orchestrator.store.db import Store
    from orchestrator.store.queries import utcnow
    from orchestrator.store.sweep_merge import merge_shards
    from orchestrator.store.sweeps import select_cells

    ensure_private_dir(into.parent)
    try:
        store = await Store.open(into)
    except StoreLocked as exc:
        raise UserError(
            f"{exc} (a daemon holds its store: stop it with prime-agent daemon stop, or merge "
            "--into another file)"
        ) from None
    name = shards[0].sweep
    async with store:
        counts = await store.transaction(lambda con: merge_shards(con, shards, utcnow()))
        rows = await store.read(lambda con: select_cells(con, name))
    return counts, [r.to_wire() for r in rows]
