"""``--mode acp`` and ``--mode rpc``: their command lines, turned into the options of the ACP
agent (``acp_mode.py``) and of the RPC server (``rpc_mode.py``). Both take
``--model`` / ``--api-base``, or ``--provider NAME --model ID`` from Prime Agent's models.json;
``--daemon-socket``; ``--max-turns``, ``--system-prompt``, ``--append-system-prompt``;
``--autonomous`` (ACP; its gates and limits); ``--cwd`` (RPC: ACP takes the client's);
``--skill`` (the session's choices, with ``--max-turns`` and the system prompts).
``--offline`` changes nothing: sandboxes have no network unless a session asks for one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.cli.controls import Controls
from orchestrator.cli.session_choices import SessionChoices

__all__ = ["ProtocolRun", "run_protocol"]


def _model_choice(
    model: str | None, provider: str | None, settings: dict[str, Any]
) -> tuple[str | None, str | None, dict[str, str]]:
    """(model, api_base, client env): ``--provider NAME --model ID`` from models.json, else
    ``--model`` with this shell's values of the variables resolving it may read."""
    import os

    from orchestrator.cli.client_config import load_client_config
    from orchestrator.errors import UserError
    from orchestrator.model_names import client_env_names
    from orchestrator.paths import Paths

    if provider is not None:
        if model is None:
            raise UserError("--provider needs --model ID (a model of that provider)")
        from orchestrator.cli.coding_agent_models import resolve_provider_model

        chosen = resolve_provider_model(provider, model)
        if chosen.api_key_env is not None:
            settings["model"] = {"api_key_env": chosen.api_key_env}
        return chosen.model, chosen.api_base, dict(chosen.client_env)
    config = load_client_config(Paths.from_env().config_file)
    names = client_env_names(model, config.default_model, config.models)
    return model, None, {n: os.environ[n] for n in sorted(names) if os.environ.get(n)}


@dataclass(frozen=True)
class ProtocolRun:
    """What ``--mode acp`` / ``--mode rpc`` were given on the command line."""

    mode: str  # "acp" or "rpc"
    cwd: Path | None
    model: str | None
    api_base: str | None
    provider: str | None
    daemon_socket: str | None
    choices: SessionChoices
    controls: Controls


def run_protocol(run: ProtocolRun) -> int:
    """Serve the protocol on stdio until the client closes it; the exit code."""
    settings: dict[str, Any] = dict(run.choices.fields())
    model, chosen_base, client_env = _model_choice(run.model, run.provider, settings)
    api_base = chosen_base or run.api_base
    if run.mode == "rpc":
        from orchestrator.cli.rpc_mode import RpcOptions, serve_rpc
        from orchestrator.errors import UserError

        workdir = (run.cwd or Path.cwd()).expanduser()
        if not workdir.is_dir():
            raise UserError(f"--cwd {workdir} is not a directory")
        return serve_rpc(
            RpcOptions(
                cwd=str(workdir.resolve()),
                model=model,
                api_base=api_base,
                socket_path=run.daemon_socket,
                settings=settings or None,
                client_env=client_env,
            )
        )
    from orchestrator.cli.acp_mode import AcpOptions, serve

    return serve(
        AcpOptions(
            model=model,
            api_base=api_base,
            socket_path=run.daemon_socket,
            settings=settings or None,
            autonomous=run.controls.autonomous,
            client_env=client_env,
        )
    )
