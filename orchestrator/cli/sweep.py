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
- ``sweep run FILE --shard i/N --export-dir DIR`` runs one shard and writes its results as
  Parquet; ``sweep merge DIR...`` joins shards into one store and reports
  (``cli/sweep_shards.py``); ``sweep submit FILE --shards N`` runs the shards as a Kubernetes
  Indexed Job (``cli/sweep_submit.py``).

Each goes through the daemon (started when autostart is on), which keeps the tables; but
``merge``, which writes a store file itself, and ``submit``, which talks to Kubernetes.
"""

from __future__ import annotations

import asyncio
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
    shard_text: Annotated[
        str | None,
        typer.Option(
            "--shard", help="Run only shard i of N (i/N, from 0): the cells whose hash says so."
        ),
    ] = None,
    export_dir: Annotated[
        Path | None,
        typer.Option(
            "--export-dir", help="At the end, write the shard's cells and trials here (Parquet)."
        ),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Create the sweep, or continue it: only cells without a score run."""

    def go() -> int:
        from orchestrator.cli.interrupts import run_interruptible
        from orchestrator.cli.sweep_runner import check_models, run_sweep
        from orchestrator.paths import Paths
        from orchestrator.settings import load_settings
        from orchestrator.sweeps.shards import parse_shard
        from orchestrator.sweeps.spec import load_sweep

        shard = None if shard_text is None else parse_shard(shard_text)
        spec = load_sweep(file)
        paths = Paths.from_env()
        settings = load_settings(paths.config_file)
        check_models(spec, settings)
        require_daemon("sweep run")

        async def main(abort: asyncio.Event) -> int:
            work = asyncio.ensure_future(
                run_sweep(
                    spec,
                    settings,
                    paths.data_dir,
                    link_factory=DaemonLink,
                    shard=shard,
                    export_dir=export_dir,
                )
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
        from orchestrator.cli.sweep_reports import write_sweep_report

        _, cells = _fetch(name)
        return write_sweep_report(name, cells, out)

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
        from orchestrator.cli.sweep_files import write_rows
        from orchestrator.errors import UserError

        kind = fmt.lower()
        if kind not in ("parquet", "csv", "jsonl"):
            raise UserError(f"--format {fmt}: use parquet, csv or jsonl")
        _, cells = _fetch(name)
        path = out or Path(f"{name}.cells.{kind}")
        rows = [{k: cell.get(k) for k in CELL_FIELDS} for cell in cells]
        write_rows(rows, path, kind, CELL_FIELDS, _PARQUET_TYPES)
        return path

    path = guarded(go, debug=debug)
    typer.echo(f"wrote {path}")


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


@sweep_app.command("merge")
def merge(
    sources: Annotated[
        list[Path],
        typer.Argument(help="Shards' export directories, or their *.cells.parquet files."),
    ],
    into: Annotated[
        Path | None,
        typer.Option("--into", help="The store (DuckDB file) to merge into; default: yours."),
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="The report's directory.")] = Path(
        "sweep-report"
    ),
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Join shards' results (sweep run --shard --export-dir) into one store, and report."""

    def go() -> str:
        from orchestrator.cli.sweep_reports import write_sweep_report
        from orchestrator.cli.sweep_shards import (
            find_exports,
            merge_exports,
            missing_shards,
            read_exports,
        )
        from orchestrator.errors import UserError
        from orchestrator.paths import Paths

        files = find_exports(sources)
        shards = read_exports(files)
        if not shards:
            raise UserError(f"the {len(files)} shard export(s) given hold no cells")
        target = into or Paths.from_env().database_file
        counts, cells = asyncio.run(merge_exports(shards, target))
        name = shards[0].sweep
        missing = missing_shards(files)
        typer.echo(
            f"sweep {name}: merged {len(files)} shard file(s) into {target}: "
            f"{counts.cells_added} cell(s) added, {counts.cells_replaced} replaced, "
            f"{counts.cells_kept} already there; {counts.trials_added} trial(s) added; "
            f"{counts.state}",
            err=True,
        )
        if missing:
            shown = ", ".join(missing[:5]) + (" …" if len(missing) > 5 else "")
            typer.echo(f"sweep {name}: shard(s) not given: {shown}", err=True)
        return write_sweep_report(name, cells, out)

    table = guarded(go, debug=debug)
    typer.echo(table, nl=False)
    typer.echo(f"report: {out / 'index.html'}", err=True)


@sweep_app.command("submit")
def submit(
    file: Annotated[Path, typer.Argument(help="The sweep file (YAML).")],
    shards: Annotated[int, typer.Option("--shards", help="How many shards (Job indexes).")],
    parallelism: Annotated[
        int | None, typer.Option("--parallelism", help="Shards running at once (default: all).")
    ] = None,
    retries: Annotated[
        int | None, typer.Option("--retries", help="Retries per shard (backoffLimitPerIndex).")
    ] = None,
    image: Annotated[
        str | None, typer.Option("--image", help="The image with prime-agent in it.")
    ] = None,
    results_claim: Annotated[
        str | None,
        typer.Option("--pvc", help="The PersistentVolumeClaim the shards export to."),
    ] = None,
    namespace: Annotated[
        str | None, typer.Option("--namespace", help="Default: the current context's.")
    ] = None,
    env_secret: Annotated[
        str | None,
        typer.Option("--env-secret", help="A Secret whose keys become the shards' environment."),
    ] = None,
    runtime_class: Annotated[
        str | None, typer.Option("--runtime-class", help="The pods' runtimeClassName (gVisor).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the manifests as YAML; submit nothing.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Run the sweep on Kubernetes as an Indexed Job: one shard per index."""

    def go() -> str:
        from orchestrator.cli.sweep_submit import manifests_yaml
        from orchestrator.cli.sweep_submit import submit as send
        from orchestrator.sweeps.k8s_job import (
            DEFAULT_IMAGE,
            DEFAULT_RESULTS_CLAIM,
            DEFAULT_RETRIES_PER_SHARD,
            JobRequest,
            sweep_manifests,
        )
        from orchestrator.sweeps.spec import load_sweep

        spec = load_sweep(file)
        request = JobRequest(
            spec=spec,
            sweep_text=file.read_text(encoding="utf-8"),
            shards=shards,
            parallelism=parallelism,
            retries_per_shard=DEFAULT_RETRIES_PER_SHARD if retries is None else retries,
            image=image or DEFAULT_IMAGE,
            results_claim=results_claim or DEFAULT_RESULTS_CLAIM,
            namespace=namespace,
            env_secret=env_secret,
            runtime_class=runtime_class,
        )
        manifests = sweep_manifests(request)
        if dry_run:
            return manifests_yaml(manifests)
        where = send(manifests, namespace)
        job = manifests[-1]["metadata"]["name"]
        return (
            f"sweep {spec.name}: submitted job {job} ({shards} shard(s)) in namespace {where}; "
            f"when it is done, copy {results_claim or DEFAULT_RESULTS_CLAIM}:/{spec.name} here "
            f"and run prime-agent sweep merge DIR\n"
        )

    typer.echo(guarded(go, debug=debug), nl=False)


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
