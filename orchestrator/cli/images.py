"""``prime-agent images build [session|rust|cuda|orchestrator|base-offline]``: build the
session images (and the orchestrator's own, for k8s/) offline, and ``prime-agent images list``:
which are there.

``images build cuda`` copies the toolkit of a CUDA base image when one is given (``--base``) or
the default one is here; otherwise it builds offline from Debian's ``nvidia-cuda-toolkit``
(``--base offline`` asks for that; ``--torch`` adds PyTorch from PyPI wheels). A given base that
is neither local nor pullable skips the build: one line saying why, exit status 0 (nothing is
wrong with the installation; docs/images.md)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from orchestrator.cli.common import guarded
from orchestrator.errors import UserError

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
    orchestrator = "orchestrator"
    base_offline = "base-offline"


@images_app.command(
    "build",
    help="Build an image (default: session, on the offline base). cuda: from a CUDA base "
    "image when one is given or here, else offline from Debian's CUDA toolkit; a given base "
    "that is neither here nor pullable is skipped with the reason.",
)
def build(
    kind: Annotated[
        ImageChoice, typer.Argument(help="session, rust, cuda, orchestrator or base-offline.")
    ] = ImageChoice.session,
    base: Annotated[
        str | None,
        typer.Option(
            "--base",
            help="Base image (e.g. python:3.11-slim-bookworm), or for cuda a CUDA base image "
            "or 'offline' (Debian's toolkit).",
        ),
    ] = None,
    torch: Annotated[
        str | None,
        typer.Option(
            "--torch",
            help="cuda, offline: add PyTorch from PyPI wheels; the pip requirement "
            "(torch, or e.g. 'torch==2.5.1' for an older CUDA user space).",
        ),
    ] = None,
    pull: Annotated[
        bool,
        typer.Option("--pull/--no-pull", help="cuda: try docker pull when the base is not here."),
    ] = True,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    from orchestrator.sandbox import images

    def progress(line: str) -> None:
        typer.echo(f"images: {line}", err=True)

    def run() -> images.BuildResult:
        if kind is ImageChoice.base_offline:
            return images.build_base_offline(base or images.BASE_OFFLINE_TAG)
        if kind is ImageChoice.orchestrator:
            from orchestrator.sandbox.orchestrator_image import build_orchestrator_image

            if base is not None or torch is not None:
                raise UserError("the orchestrator image takes neither --base nor --torch")
            return build_orchestrator_image(progress=progress)
        if torch is not None and kind is not ImageChoice.cuda:
            raise UserError("--torch is for the cuda image")
        return images.build_image(
            kind.value,  # type: ignore[arg-type]
            base=base,
            pull=pull,
            torch=torch,
            progress=progress,
        )

    result = guarded(run, debug=debug)
    timing = f" in {result.seconds:.0f} s" if result.built else ""
    typer.echo(f"{result.kind}: {result.tag}: {result.message}{timing}")


@images_app.command("list", help="The session images and whether each is built and current.")
def list_images(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    from orchestrator.sandbox import images

    def run() -> list[str]:
        client = images.docker_client()
        lines = []
        for kind in images.IMAGE_NAMES:
            tag = images.image_tag(kind)
            if not images.image_exists(tag, client):
                state = "not built"
            elif images.image_label(tag, images.SOURCE_HASH_LABEL, client) == images.source_hash(
                kind
            ):
                state = "built"
            else:
                state = "built, stale (sources changed)"
            lines.append(f"{kind:<8} {tag:<36} {state}")
        return lines

    for line in guarded(run, debug=debug):
        typer.echo(line)
