"""A shard's results as Parquet, and shards merged into one store (docs/sweeps.md,
"Shards, merge and Kubernetes").

``sweep run FILE --shard i/N --export-dir DIR`` writes its cells and trials as two Parquet
files (``sweeps/shards.py`` names them) as it goes and at its end (``ShardExporter``). Every
row carries the sweep's name and digest (the hash of its file), and each cell row the shard,
the file's spec and how many cells the whole file has, so a merge needs nothing but the files.
A cell's ``position`` is its place in the whole file (not in the shard), so a merged sweep
lists its cells as a local run does. A shard started where its export already is (a retried
pod, whose store is new) carries the cells that export holds scored instead of running them.

``sweep merge DIR_OR_FILES... [--into FILE]`` reads the exports, refuses shards of different
sweep files, and folds them into a store (``store/sweep_merge.py``: each cell and trial once;
the more complete, then the later, result of a cell wins).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
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
    "EXPORT_EVERY_S",
    "EXPORT_PAGE_CELLS",
    "TRIAL_EXPORT_TYPES",
    "ShardExporter",
    "find_exports",
    "merge_exports",
    "missing_shards",
    "read_exports",
]

# Cells (with their trials) per sweep_status call while exporting: answers are long.
EXPORT_PAGE_CELLS: Final = 25
# A running shard rewrites its export at most this often (and after its first trial, and at
# its end).
EXPORT_EVERY_S: Final = 30.0
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
TRIAL_EXPORT_TYPES: Final = {
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


@dataclass
class ShardExporter:
    """Writes a shard's results into the export directory as the run goes: after the first
    finished trial, then at most every ``EXPORT_EVERY_S``, and at the end. So a shard whose pod
    is killed leaves what it finished, and its retry — a new pod with an empty store — starts
    from that export: the cells it holds scored are carried into the next export, not run."""

    link: DaemonLink
    spec: SweepFile
    shard: Shard
    every_cell: Sequence[Cell]
    export_dir: Path
    earlier_cells: dict[str, dict[str, Any]] = field(default_factory=dict)
    earlier_trials: list[dict[str, Any]] = field(default_factory=list)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _last: float | None = None

    @property
    def cells_path(self) -> Path:
        from orchestrator.sweeps.shards import CELLS_SUFFIX

        return self.export_dir / (self.shard.stem(self.spec.name) + CELLS_SUFFIX)

    @property
    def trials_path(self) -> Path:
        from orchestrator.sweeps.shards import TRIALS_SUFFIX

        return self.export_dir / (self.shard.stem(self.spec.name) + TRIALS_SUFFIX)

    def read_earlier(self) -> str | None:
        """Take in this shard's earlier export, if there is one: only cells of this file (by
        fingerprint: a cell whose inputs are the same is the same cell). Why it could not be
        read, if it could not (it is then left aside)."""
        import duckdb

        if not self.cells_path.is_file():
            return None
        mine = {c.fingerprint for c in self.shard.take(self.every_cell)}
        try:
            cells = read_parquet(self.cells_path)
            trials = read_parquet(self.trials_path) if self.trials_path.is_file() else []
        except duckdb.Error as exc:  # not Parquet, or not whole
            return f"{self.cells_path}: {' '.join(str(exc).split())}"
        self.earlier_cells = {
            str(c["fingerprint"]): _times(dict(c)) for c in cells if c.get("fingerprint") in mine
        }
        self.earlier_trials = [
            _times(dict(t)) for t in trials if t.get("fingerprint") in self.earlier_cells
        ]
        return None

    def scored_earlier(self) -> set[str]:
        return {f for f, c in self.earlier_cells.items() if c.get("state") == "scored"}

    def _due(self) -> bool:
        return self._last is None or time.monotonic() - self._last >= EXPORT_EVERY_S

    async def write_soon(self) -> None:
        """``write`` if none ran in the last ``EXPORT_EVERY_S`` (or none yet)."""
        if self._due():
            async with self._lock:
                if self._due():  # not written meanwhile by another trial's end
                    await self._write_now()

    async def write(self) -> Path:
        """The shard's cells and trials, as its store holds them and as its earlier export
        had them (the more complete result of each cell); the cells file."""
        async with self._lock:
            await self._write_now()
        return self.cells_path

    async def _write_now(self) -> None:
        self._last = time.monotonic()
        cells, trials = await self._from_store()
        await asyncio.to_thread(self._write, cells, trials)

    async def _from_store(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        cells: list[dict[str, Any]] = []
        trials: list[dict[str, Any]] = []
        total: int | None = None
        while total is None or len(cells) < total:
            page = await self.link.call(
                "sweep_status",
                name=self.spec.name,
                offset=len(cells),
                limit=EXPORT_PAGE_CELLS,
                trials=True,
            )
            total = int(page["cells_total"])
            if not page["cells"]:
                break
            cells.extend(page["cells"])
            trials.extend(page["trials"])
        return cells, trials

    def _write(self, stored: list[dict[str, Any]], stored_trials: list[dict[str, Any]]) -> None:
        from orchestrator.store.sweep_merge import completeness
        from orchestrator.sweeps.grid import HARNESS_VERSION

        places = {c.fingerprint: i for i, c in enumerate(self.every_cell)}
        best = dict(self.earlier_cells)
        for cell in stored:
            fingerprint = str(cell["fingerprint"])
            if fingerprint not in places or not self.shard.owns(fingerprint):
                continue
            cell = _times(dict(cell))
            held = best.get(fingerprint)
            if held is None or completeness(cell) > completeness(held):
                best[fingerprint] = cell
        digest = self.spec.digest()
        identity = {
            "sweep": self.spec.name,
            "digest": digest,
            "spec": json.dumps(
                {**self.spec.normalised(), "harness": HARNESS_VERSION}, sort_keys=True
            ),
            "shard": self.shard.index,
            "shards": self.shard.count,
            "cells_total": len(self.every_cell),
        }
        cells = [
            _wire({**cell, **identity, "position": places[fingerprint]})
            for fingerprint, cell in sorted(best.items(), key=lambda item: places[item[0]])
        ]
        trials_by_id = {str(t["id"]): t for t in self.earlier_trials}
        for trial in stored_trials:
            if trial["fingerprint"] in best:
                trials_by_id.setdefault(str(trial["id"]), _times(dict(trial)))
        trials = [_wire({**t, "digest": digest}) for t in trials_by_id.values()]
        # The trials first: a cells file is what a merge looks for, and it comes last; each is
        # written beside and renamed into place, so a reader never sees half of one.
        for path, rows, fields, types in (
            (self.trials_path, trials, _trial_fields(), TRIAL_EXPORT_TYPES),
            (self.cells_path, cells, _cell_fields(), CELL_EXPORT_TYPES),
        ):
            staged = path.with_name(f".{path.name}.part")
            write_rows(rows, staged, "parquet", fields, types)
            staged.replace(path)


def _wire(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}


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
    for key in _TIMES:
        if isinstance(row.get(key), str):
            row[key] = datetime.fromisoformat(row[key])
    return row


def read_exports(paths: Sequence[Path]) -> list[ShardResults]:
    """Each cells file with the trials file beside it; every file of one sweep and one digest
    (else one line naming the two that differ)."""
    import duckdb

    from orchestrator.store.sweep_merge import CELL_COLUMNS, ShardResults
    from orchestrator.sweeps.shards import CELLS_SUFFIX, TRIALS_SUFFIX

    results: list[ShardResults] = []
    first: tuple[Path, str, str] | None = None
    for path in paths:
        try:
            rows = read_parquet(path)
        except duckdb.Error as exc:  # not Parquet, or not whole
            raise UserError(
                f"{path}: cannot read it as Parquet: {' '.join(str(exc).split())}"
            ) from None
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
