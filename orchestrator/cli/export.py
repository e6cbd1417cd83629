"""``prime-agent export ID --format jsonl``: through the daemon when one runs (it owns the
database then), else straight from the database."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.common import guarded
from orchestrator.errors import UserError
from orchestrator.paths import Paths

__all__ = ["export"]


class Format(StrEnum):
    jsonl = "jsonl"


def export(
    session: Annotated[str, typer.Argument(help="Session id (or unique prefix or name).")],
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.jsonl,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="File to write (default stdout).")
    ] = None,
    debug: Annotated[bool, typer.Option("--debug")] = False,
) -> None:
    guarded(lambda: asyncio.run(_export(session, output)), debug=debug)


async def _export(selector: str, output: Path | None) -> None:
    from orchestrator.cli.connect import ensure_daemon

    # A running daemon owns the database: the export goes through it (never started for it).
    if await asyncio.to_thread(ensure_daemon, autostart=False):
        await _export_via_daemon(selector, output)
    else:
        await _export_from_store(selector, output)


async def _export_via_daemon(selector: str, output: Path | None) -> None:
    """The daemon writes the file (same user); for stdout, a private temporary file is copied
    out and removed."""
    from orchestrator.cli.connect import DaemonLink

    async with DaemonLink() as link:
        if output is not None:
            await link.call("export_session", session=selector, path=str(output.absolute()))
            return
        scratch = Paths.from_env().runtime_dir
        with tempfile.TemporaryDirectory(prefix="export-", dir=scratch) as tmp:
            target = Path(tmp) / "session.jsonl"
            await link.call("export_session", session=selector, path=str(target))
            with open(target, encoding="utf-8") as fh:
                shutil.copyfileobj(fh, sys.stdout)


async def _export_from_store(selector: str, output: Path | None) -> None:
    from orchestrator.store.db import Store
    from orchestrator.store.jsonl import export_session_jsonl

    paths = Paths.from_env()
    if not paths.database_file.exists():
        raise UserError("no sessions yet")
    store = await Store.open(paths.database_file, read_only=True)
    try:
        found = await store.find_session(selector)
        if found is None:
            raise UserError(f"no session matches {selector!r}")
        if output is None:
            await export_session_jsonl(store, found.id, sys.stdout)
        else:
            with open(output, "w", encoding="utf-8") as fh:
                await export_session_jsonl(store, found.id, fh)
    finally:
        await store.close()
