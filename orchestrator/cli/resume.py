"""``prime-agent --resume ID|NAME`` and ``prime-agent --continue``: back to an existing session.

With a task (``-p "…"``, a task argument or stdin) it runs as a follow-up turn on that session,
through the daemon, and prints like print mode (the answer, or ``--mode json`` events) with
print mode's exit codes. Without one it attaches (``prime-agent attach``). ``--continue`` picks
the root session of the current directory (``--cwd``) that was active last. Both need the
daemon and start it unless autostart is off.

A resumed session talks to the endpoint it stored (docs/models.md), whatever ``OPENAI_BASE_URL``
the daemon was started with. ``--model``/``--api-base`` with a task switch it explicitly first
(``set_model``: a ``model_change`` event naming both endpoints), then run the task.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path

from orchestrator.cli.common import EXIT_ABORTED
from orchestrator.cli.interrupts import run_interruptible
from orchestrator.errors import UserError

__all__ = ["ResumeRequest", "resume_session"]


@dataclass(frozen=True)
class ResumeRequest:
    selector: str | None  # --resume's value; None with --continue
    continue_last: bool
    text: str  # the follow-up task; empty: attach
    cwd: Path | None
    json_mode: bool
    model: str | None
    api_base: str | None
    no_daemon: bool


def resume_session(request: ResumeRequest) -> int:
    from orchestrator.cli.connect import require_daemon

    if request.selector is not None and request.continue_last:
        raise UserError("--resume and --continue exclude each other; give one")
    if request.selector is not None and not request.selector.strip():
        raise UserError("--resume needs a session id or name (prime-agent agents lists them)")
    switching = request.model is not None or request.api_base is not None
    if switching and not request.text:
        raise UserError(
            "--model/--api-base switch a resumed session's model for a task: give one "
            '(-p "…"), or use /model once attached'
        )
    if request.no_daemon:
        raise UserError("--resume and --continue run through the daemon; drop --no-daemon")
    workdir = (request.cwd or Path.cwd()).expanduser()
    if not workdir.is_dir():
        raise UserError(f"--cwd {workdir} is not a directory")
    what = "--resume" if request.selector is not None else "--continue"
    require_daemon(what)
    if not request.text:
        return _attach(request.selector, workdir.resolve())
    return _follow_up(request, workdir.resolve())


def _attach(selector: str | None, cwd: Path) -> int:
    from orchestrator.cli.sessions import attach_session

    if selector is None:
        selector = asyncio.run(_latest(cwd))
    return attach_session(selector)


async def _latest(cwd: Path) -> str:
    from orchestrator.cli.connect import DaemonLink
    from orchestrator.cli.via_daemon import latest_root

    async with DaemonLink() as link:
        return await latest_root(link, cwd)


def _follow_up(request: ResumeRequest, cwd: Path) -> int:
    from orchestrator.cli.via_daemon import continue_via_daemon
    from orchestrator.paths import Paths
    from orchestrator.settings import load_settings

    settings = load_settings(Paths.from_env().config_file)
    # SIGINT / SIGTERM abort the turn (and its subagents') as in print mode (cli/interrupts.py).
    code = run_interruptible(
        lambda abort: continue_via_daemon(
            selector=request.selector,
            text=request.text,
            cwd=cwd,
            json_mode=request.json_mode,
            wait_timeout_s=settings.family_wait_timeout_s,
            model=request.model,
            api_base=request.api_base,
            abort=abort,
        )
    )
    if code == EXIT_ABORTED:
        print("prime-agent: interrupted; the session history is kept", file=sys.stderr)
    return code
