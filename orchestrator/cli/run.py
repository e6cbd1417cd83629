"""The run command: print mode (``-p``) and ``--mode json`` (typer's side; the run itself is
``cli/print_run.py``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.common import fail, guarded
from orchestrator.cli.controls import controls_from_flags
from orchestrator.cli.interrupts import install_handlers
from orchestrator.cli.print_run import read_stdin, run_print
from orchestrator.cli.run_options import Backend, Mode, Workspace
from orchestrator.cli.session_choices import SessionChoices

__all__ = ["Backend", "Mode", "Workspace", "run"]


def run(
    task: Annotated[
        list[str] | None, typer.Argument(help="The task (or pipe it on stdin).")
    ] = None,
    print_mode: Annotated[
        bool, typer.Option("-p", "--print", help="Run to the end; print only the final answer.")
    ] = False,
    mode: Annotated[
        Mode,
        typer.Option(
            "--mode",
            help="text, json (every event as a line), acp (an Agent Client Protocol agent "
            "on stdio) or rpc (Prime Agent's JSONL RPC protocol on stdio).",
        ),
    ] = Mode.text,
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume",
            "-r",
            help="Continue this session (id, prefix or name): run the task as a follow-up, or "
            "attach when there is none.",
        ),
    ] = None,
    continue_last: Annotated[
        bool,
        typer.Option(
            "--continue", "-c", help="Like --resume, with the newest session of this directory."
        ),
    ] = False,
    model: Annotated[
        str | None, typer.Option("--model", help="provider/name, e.g. openai/gpt-4o-mini.")
    ] = None,
    api_base: Annotated[
        str | None, typer.Option("--api-base", help="Base URL of an OpenAI-compatible server.")
    ] = None,
    cwd: Annotated[
        Path | None, typer.Option("--cwd", help="Working directory of the session.")
    ] = None,
    backend: Annotated[
        Backend,
        typer.Option(
            "--backend",
            envvar="PRIME_AGENT_BACKEND",
            help="Sandbox backend: auto (docker when an engine and the session image are "
            "there, else bwrap when bubblewrap works here, else an error), docker, bwrap, "
            "local (not isolated; a warning says so), or kubernetes (a pod per session in the "
            "cluster of [kubernetes]; never picked by auto). `prime-agent doctor` says which "
            "work.",
        ),
    ] = Backend.auto,
    network: Annotated[
        bool,
        typer.Option(
            "--network/--no-network",
            help="Let sandboxes reach the network (default: no network; docker and bwrap).",
        ),
    ] = False,
    no_daemon: Annotated[
        bool,
        typer.Option("--no-daemon", help="Run in this process even when a daemon is running."),
    ] = False,
    nats_url: Annotated[
        str | None,
        typer.Option(
            "--nats-url",
            help="Use this external NATS server (operator mode; the account signing key "
            "comes from [nats] in config.toml) instead of starting one.",
        ),
    ] = None,
    workspace: Annotated[
        Workspace | None,
        typer.Option(
            "--workspace",
            help="Project directory in the sandbox: rw, ro (read-only) or copy (a private "
            "copy synced back at the end). Default: sandbox.workspace in config.toml, rw.",
        ),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            help="Sandbox image (docker): session, rust, cuda or an image tag. Default: "
            "sandbox.image in config.toml, session.",
        ),
    ] = None,
    no_refine: Annotated[
        bool,
        typer.Option("--no-refine", help="This session may not /refine its harness."),
    ] = False,
    autonomous: Annotated[
        bool,
        typer.Option("--autonomous", help="Keep the agent working until a gate passes or a limit."),
    ] = False,
    gates: Annotated[
        list[str] | None,
        typer.Option(
            "--autonomous-gate",
            help="Shell command that must exit 0 before the run may finish (repeatable; runs "
            "in the sandbox, in the workspace).",
        ),
    ] = None,
    max_turns: Annotated[
        int | None, typer.Option("--autonomous-max-turns", min=1, help="Default 12.")
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--autonomous-max-tokens", min=1, help="Default 80000.")
    ] = None,
    timeout_ms: Annotated[
        int | None,
        typer.Option("--autonomous-timeout-ms", min=1, help="Default 1800000 (30 min)."),
    ] = None,
    goal: Annotated[
        str | None, typer.Option("--goal", help="An objective to keep working toward.")
    ] = None,
    goal_budget: Annotated[
        int | None, typer.Option("--goal-budget", min=1, help="The goal's token budget.")
    ] = None,
    max_turn_steps: Annotated[
        int | None,
        typer.Option("--max-turns", min=1, help="Model calls per prompt (default: config.toml's)."),
    ] = None,
    system_prompt: Annotated[
        str | None,
        typer.Option(
            "--system-prompt", help="The system prompt (text or a file) instead of the built-in."
        ),
    ] = None,
    append_system_prompt: Annotated[
        str | None,
        typer.Option(
            "--append-system-prompt", help="Text (or a file) added to the end of the system prompt."
        ),
    ] = None,
    mcp_config: Annotated[
        str | None,
        typer.Option(
            "--mcp-config",
            help='MCP servers for this run: a JSON file {"mcpServers": {...}} (docs/mcp.md).',
        ),
    ] = None,
    provider: Annotated[
        str | None,
        typer.Option(
            "--provider",
            help="With --model ID: a provider of Prime Agent's models.json "
            "($PRIME_AGENT_CODING_AGENT_DIR).",
        ),
    ] = None,
    daemon_socket: Annotated[
        str | None, typer.Option("--daemon-socket", help="The daemon's control socket.")
    ] = None,
    offline: Annotated[
        bool,
        typer.Option("--offline", help="No network for the sandboxes (the default already)."),
    ] = False,
    skills: Annotated[
        list[str] | None,
        typer.Option(
            "--skill",
            help="A skill for this session and its subagents: its directory, its SKILL.md, or "
            "a directory of skills (repeatable).",
        ),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    choices = guarded(
        lambda: SessionChoices.from_flags(
            max_turn_steps, system_prompt, append_system_prompt, skills or (), mcp_config
        ),
        debug=debug,
    )
    controls = guarded(
        lambda: controls_from_flags(
            autonomous, gates, max_turns, max_tokens, timeout_ms, goal, goal_budget
        ),
        debug=debug,
    )
    if mode in (Mode.acp, Mode.rpc):  # stdin is the protocol's: read nothing from it here
        from orchestrator.cli.acp_run import ProtocolRun, run_protocol

        protocol_run = ProtocolRun(
            mode=mode.value,
            cwd=cwd,
            model=model,
            api_base=api_base,
            provider=provider,
            daemon_socket=daemon_socket,
            choices=choices,
            controls=controls,
        )
        raise SystemExit(guarded(lambda: run_protocol(protocol_run), debug=debug))
    if provider is not None or daemon_socket is not None:
        fail(
            "--provider and --daemon-socket are for --mode acp and --mode rpc; "
            "for a run, use --model openai/ID --api-base URL"
        )
    text = " ".join(task or []).strip()
    piped = read_stdin()
    if piped.strip():
        text = f"{text}\n\n{piped}".strip() if text else piped.strip()
    if resume is not None or continue_last:
        from orchestrator.cli.resume import ResumeRequest, resume_session

        request = ResumeRequest(
            resume, continue_last, text, cwd, mode is Mode.json, model, api_base, no_daemon
        )
        if text:  # a follow-up run (without a task it attaches: Ctrl-C detaches there)
            install_handlers()
        raise SystemExit(guarded(lambda: resume_session(request), debug=debug))
    if not text and controls.goal is None:
        if sys.stdin is not None and sys.stdin.isatty() and not print_mode:
            from orchestrator.cli.tui_cmd import open_tui

            chosen = backend.value
            raise SystemExit(
                guarded(
                    lambda: open_tui(cwd=cwd, model=model, backend=chosen, api_base=api_base),
                    debug=debug,
                )
            )
        fail('no task given: prime-agent -p "your task" (or pipe the task on stdin)')
    workdir = (cwd or Path.cwd()).expanduser()
    if not workdir.is_dir():
        fail(f"--cwd {workdir} is not a directory")
    install_handlers()  # from here on a signal is an abort (cli/interrupts.py)
    code = guarded(
        lambda: run_print(
            text,
            model,
            api_base,
            workdir.resolve(),
            backend.value,
            mode,
            debug,
            network,
            no_daemon,
            nats_url,
            workspace.value if workspace is not None else None,
            image,
            no_refine,
            controls,
            choices=choices,
        ),
        debug=debug,
    )
    raise SystemExit(code)
