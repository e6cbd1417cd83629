"""``prime-agent images build [session|rust|cuda]``: build the session images offline."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from orchestrator.cli.common import guarded

__all__ = ["ImageChoice", "images_app"]

images_app = typer.Typer(
    help="Session images: build them offline (docs/images.md).",
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
)


class ImageChoice(StrEnum):
    session = "session"
    rust = "rust"
    cuda = "cuda"
    base_offline = "base-offline"


@images_app.command("build", help="Build an image (default: session, on the offline base).")
def build(
    kind: Annotated[ImageChoice, typer.Argument(help="session, rust, cuda or base-offline.")] = (
        ImageChoice.session
    ),
    base: Annotated[
        str | None,
        typer.Option("--base", help="Base image (e.g. python:3.11-slim-bookworm, or a CUDA base)."),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    from orchestrator.sandbox import images

    def progress(line: str) -> None:
        typer.echo(f"images: {line}", err=True)

    def run() -> images.BuildResult:
        if kind is ImageChoice.base_offline:
            return images.build_base_offline(base or images.BASE_OFFLINE_TAG)
        return images.build_image(kind.value, base=base, progress=progress)  # type: ignore[arg-type]

    result = guarded(run, debug=debug)
    timing = f" in {result.seconds:.0f} s" if result.built else ""
    typer.echo(f"{result.kind}: {result.tag}: {result.message}{timing}")
