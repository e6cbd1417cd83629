"""``prime-agent export ID --format jsonl``."""

from __future__ import annotations

import asyncio
import sys
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
