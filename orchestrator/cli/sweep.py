"""``prime-agent sweep``: run, watch, export and cancel benchmark sweeps (docs/sweeps.md).

- ``sweep run FILE.yaml`` creates the sweep of the file's name, or continues it: only cells
  without a score run (``cli/sweep_runner.py``).
- ``sweep status NAME`` shows counts and a score table per model × variant; ``--json`` prints
  one JSON object per cell (task, model, variant, seed, state, score, tokens, cost_usd, wall_s,
  stop_reason, session_id).
- ``sweep report NAME --out DIR`` writes ``index.html`` (self-contained), PNGs (score vs cost
  with the Pareto frontier, mean scores with 95 % bootstrap intervals, a task × model matrix,
  score vs context length), ``report.md`` and ``summary.json``; the table also goes to stdout.
- ``sweep export NAME --format parquet|csv|jsonl`` writes every cell (``--out`` or
  ``NAME.cells.FORMAT`` here).
- ``sweep cancel NAME`` starts no more trials and aborts the running ones.

Each goes through the daemon (started when autostart is on), which keeps the tables.
"""

from __future__ import annotations

import asyncio
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any, Final

import typer

from orchestrator.cli.common import EXIT_ABORTED, guarded
from orchestrator.cli.connect import DaemonLink, require_daemon

__all__ = ["CELL_FIELDS", "sweep_app"]

# What `status --json` and the exports show of a cell, in this order.
CELL_FIELDS: Final = (
    "task_id",
    "suite",
    "context_tokens",
    "model",
    "variant",
    "seed",
    "state",
    "score",
    "tokens",
    "cost_usd",
    "cost_known",
    "wall_s",
    "stop_reason",
    "error_class",
    "truncated",
    "trials",
    "session_id",
    "fingerprint",
)

sweep_app = typer.Typer(
    help="Benchmark sweeps: suites × models × variants × seeds, resumable by cell.",
    no_args_is_help=True,
)


@sweep_app.command("run")
def run(
    file: Annotated[Path, typer.Argument(help="The sweep file (YAML).")],
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Create the sweep, or continue it: only cells without a score run."""

    def go() -> int:
        from orchestrator.cli.interrupts import run_interruptible
        from orchestrator.cli.sweep_runner import check_models, run_sweep
        from orchestrator.paths import Paths
        from orchestrator.settings import load_settings
        from orchestrator.sweeps.spec import load_sweep

        spec = load_sweep(file)
        paths = Paths.from_env()
        settings = load_settings(paths.config_file)
        check_models(spec, settings)
        require_daemon("sweep run")

        async def main(abort: asyncio.Event) -> int:
            work = asyncio.ensure_future(
                run_sweep(spec, settings, paths.data_dir, link_factory=DaemonLink)
            )
            stop = asyncio.ensure_future(abort.wait())
            await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if work.done():
                return work.result()
            work.cancel()
            print(
                f"sweep {spec.name}: interrupted; trials in flight run again next time "
                f"(prime-agent sweep run {file})",
                file=sys.stderr,
            )
            return EXIT_ABORTED

        return run_interruptible(main)

    raise SystemExit(guarded(go, debug=debug))


async def _all_cells(link: DaemonLink, name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    first: dict[str, Any] = await link.call("sweep_status", name=name)
    cells = list(first["cells"])
    while len(cells) < int(first["cells_total"]):
        page = await link.call("sweep_status", name=name, offset=len(cells))
        if not page["cells"]:
            break
        cells.extend(page["cells"])
    return first, cells


def _fetch(name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    require_daemon("sweep")

    async def go() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        async with DaemonLink() as link:
            return await _all_cells(link, name)

    return asyncio.run(go())


def _table(cells: list[dict[str, Any]]) -> list[str]:
    """Mean score, scored cells, cost and tokens per model × variant."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for cell in cells:
        groups[(cell["model"], cell["variant"])].append(cell)
    rows = [("model", "variant", "score", "scored", "cost_usd", "tokens")]
    for (model, variant), members in sorted(groups.items()):
        scored = [c for c in members if c["state"] == "scored"]
        mean = sum(float(c["score"] or 0) for c in scored) / len(scored) if scored else None
        rows.append(
            (
                model,
                variant,
                "-" if mean is None else f"{mean:.3f}",
                f"{len(scored)}/{len(members)}",
                f"{sum(float(c['cost_usd'] or 0) for c in members):.4f}",
                str(sum(int(c["tokens"] or 0) for c in members)),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]


@sweep_app.command("status")
def status(
    name: Annotated[str, typer.Argument(help="The sweep's name.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per cell.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Counts, cost and a score table (or every cell as JSON lines)."""
    head, cells = guarded(lambda: _fetch(name), debug=debug)
    if as_json:
        for cell in cells:
            typer.echo(json.dumps({k: cell.get(k) for k in CELL_FIELDS}, ensure_ascii=False))
        return
    sweep = head["sweep"]
    counts = head["counts"]
    runner = " (running)" if sweep.get("runner_alive") else ""
    summary = ", ".join(f"{counts[s]} {s}" for s in sorted(counts)) or "no cells"
    typer.echo(
        f"sweep {name}: {sweep['state']}{runner}; {head['cells_total']} cells: {summary}; "
        f"${head['cost_usd']:.4f}, {head['tokens']} tokens"
    )
    for line in _table(cells):
        typer.echo(line)


@sweep_app.command("report")
def report(
    name: Annotated[str, typer.Argument(help="The sweep's name.")],
    out: Annotated[Path, typer.Option("--out", help="The directory to write into.")] = Path(
        "sweep-report"
    ),
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """An HTML page, PNG plots, report.md and summary.json; the table on stdout."""

    def go() -> str:
        from orchestrator.sweeps.plots import markdown_table, write_report
        from orchestrator.sweeps.summary import summarise

        _, cells = _fetch(name)
        summary = summarise(cells)
        write_report(summary, name, out)
        numbers = {
            "sweep": name,
            "groups": summary.table(),
            "frontier": summary.frontier,
            "matrix": summary.matrix,
            "by_context": {
                k: {str(n): v for n, v in s.items()} for k, s in summary.by_context.items()
            },
        }
        (out / "summary.json").write_text(json.dumps(numbers, indent=2) + "\n", encoding="utf-8")
        return markdown_table(summary.table())

    table = guarded(go, debug=debug)
    typer.echo(table, nl=False)
    typer.echo(f"report: {out / 'index.html'}", err=True)


@sweep_app.command("export")
def export(
    name: Annotated[str, typer.Argument(help="The sweep's name.")],
    fmt: Annotated[
        str, typer.Option("--format", help="parquet, csv or jsonl.", case_sensitive=False)
    ] = "parquet",
    out: Annotated[Path | None, typer.Option("--out", help="The file to write.")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Every cell of the sweep, as Parquet, CSV or JSON lines."""

    def go() -> Path:
        from orchestrator.errors import UserError

        kind = fmt.lower()
        if kind not in ("parquet", "csv", "jsonl"):
            raise UserError(f"--format {fmt}: use parquet, csv or jsonl")
        _, cells = _fetch(name)
        path = out or Path(f"{name}.cells.{kind}")
        rows = [{k: cell.get(k) for k in CELL_FIELDS} for cell in cells]
        _write(rows, path, kind)
        return path

    path = guarded(go, debug=debug)
    typer.echo(f"wrote {path}")


def _write(rows: list[dict[str, Any]], path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "jsonl":
        with path.open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        return
    if kind == "csv":
        with path.open("w", encoding="utf-8", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(CELL_FIELDS))
            writer.writeheader()
            writer.writerows(rows)
        return
    import duckdb

    staged = path.with_name(f".{path.name}.jsonl")
    _write(rows, staged, "jsonl")
    try:
        con = duckdb.connect()
        try:
            columns = ", ".join(f"'{k}': '{_PARQUET_TYPES.get(k, 'VARCHAR')}'" for k in CELL_FIELDS)
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


_PARQUET_TYPES: Final = {
    "context_tokens": "INTEGER",
    "seed": "BIGINT",
    "score": "DOUBLE",
    "tokens": "BIGINT",
    "cost_usd": "DOUBLE",
    "cost_known": "BOOLEAN",
    "wall_s": "DOUBLE",
    "truncated": "BOOLEAN",
    "trials": "INTEGER",
}


@sweep_app.command("cancel")
def cancel(
    name: Annotated[str, typer.Argument(help="The sweep's name.")],
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Start no more trials of the sweep, and abort its running ones."""

    def go() -> dict[str, Any]:
        require_daemon("sweep cancel")

        async def call() -> dict[str, Any]:
            async with DaemonLink() as link:
                result: dict[str, Any] = await link.mutate("sweep_cancel", name=name)
                return result

        return asyncio.run(call())

    result = guarded(go, debug=debug)
    typer.echo(f"sweep {name}: cancelled; {len(result['aborted'])} running trial(s) aborted")
