"""``prime-agent import FILE.jsonl``: a pi / Prime Agent session file (versions 1 to 3) as a new
session (``orchestrator/store/jsonl_import.py``; docs/tree.md).

It prints the new session's id; the session is inactive and resumes with ``prime-agent --resume
ID -p "..."``. A malformed file imports nothing and fails with one line naming the line (exit
2). The session's model is the newest one named on the file's active path unless ``--model``
says otherwise (a model this installation cannot reach only fails when the session is resumed,
so ``--model`` is how to pick one that can); its directory is the file's when it exists here,
else the current one, with a notice on stderr (``--cwd`` overrides both; the file's directory
stays recorded and an export writes it back).

Through the daemon when one runs (it owns the database, and reads the file itself: same user),
otherwise straight into the database.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator.cli.common import guarded
from orchestrator.cli.run import Backend
from orchestrator.cli.tree import through_daemon_or_store
from orchestrator.errors import UserError
from orchestrator.paths import Paths

if TYPE_CHECKING:
    from orchestrator.cli.connect import DaemonLink
    from orchestrator.store.db import Store

__all__ = ["import_session"]


def import_session(
    file: Annotated[Path, typer.Argument(help="The session file (.jsonl).")],
    model: Annotated[
        str | None, typer.Option("--model", help="provider/name for the imported session.")
    ] = None,
    cwd: Annotated[
        Path | None, typer.Option("--cwd", help="Its working directory (default: the file's).")
    ] = None,
    backend: Annotated[
        Backend,
        typer.Option(
            "--backend",
            envvar="PRIME_AGENT_BACKEND",
            help="Sandbox backend when it is resumed: auto, docker, bwrap, local or kubernetes.",
        ),
    ] = Backend.auto,
    name: Annotated[
        str | None, typer.Option("--name", help="Its name (default: the file's).")
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    def run() -> dict[str, Any]:
        if not file.is_file():
            raise UserError(f"{file} is not a file")
        workdir = None
        if cwd is not None:
            if not cwd.expanduser().is_dir():
                raise UserError(f"--cwd {cwd} is not a directory")
            workdir = str(cwd.expanduser().resolve())
        return asyncio.run(_import(file, model, workdir, backend.value, name))

    result = guarded(run, debug=debug)
    if result.get("warning"):
        print(f"prime-agent: warning: {result['warning']}", file=sys.stderr)
    if result.get("notice"):  # the file's directory is not here (kept, exported back)
        print(f"prime-agent: notice: {result['notice']}", file=sys.stderr)
    typer.echo(result["session"])
    if sys.stderr.isatty():
        print(
            f"prime-agent: imported {file} (version {result['version']}, {result['events']} "
            f"events, {result['custom']} kept as custom) as {result['session']} "
            f"({result.get('name') or 'unnamed'}, model {result['model']}, cwd {result['cwd']}); "
            f'resume it with prime-agent --resume {result["session"]} -p "..."',
            file=sys.stderr,
        )


async def _import(
    file: Path, model: str | None, cwd: str | None, backend: str, name: str | None
) -> dict[str, Any]:
    path = file.expanduser().absolute()
    here = str(Path.cwd())

    async def via_daemon(link: DaemonLink) -> dict[str, Any]:
        fields: dict[str, Any] = {"path": str(path), "fallback_cwd": here}
        extra = {"model": model, "cwd": cwd, "name": name}
        fields.update({k: v for k, v in extra.items() if v is not None})
        if backend != Backend.auto.value:
            fields["backend"] = backend
        answer: dict[str, Any] = await link.mutate("import_session", **fields)
        return answer

    async def direct(store: Store) -> dict[str, Any]:
        from orchestrator.models.registry import resolve_model
        from orchestrator.sandbox.choice import choose_backend
        from orchestrator.sandbox.k8s_status import kubernetes_usable
        from orchestrator.settings import EMBEDDED_MODEL_NAME, load_settings
        from orchestrator.store.jsonl_import import ImportOptions, import_session_jsonl
        from orchestrator.store.jsonl_parse import read_session_file

        settings = load_settings(Paths.from_env().config_file)
        if model is not None:  # refuse a model this installation cannot use, now
            resolve_model(model, settings)
        parsed = await asyncio.to_thread(read_session_file, path)
        choice = choose_backend(
            backend,
            _docker_status,
            _bwrap_status,
            kubernetes_status=lambda: kubernetes_usable(settings.kubernetes),
        )
        options = ImportOptions(
            model=model,
            default_model=settings.default_model or EMBEDDED_MODEL_NAME,
            cwd=cwd,
            fallback_cwd=here,
            backend=choice.name,
            name=name,
        )
        result = await import_session_jsonl(store, parsed, options)
        return {**result.as_dict(), "warning": choice.warning or None}

    return await through_daemon_or_store(via_daemon, direct, write=True, create=True)


def _docker_status() -> tuple[bool, str]:
    from orchestrator.sandbox.docker import docker_usable  # the docker SDK: only when asked

    return docker_usable()


def _bwrap_status() -> tuple[bool, str]:
    from orchestrator.sandbox.bwrap_probe import bwrap_usable

    return bwrap_usable()
