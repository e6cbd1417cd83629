"""``--mode acp``'s command line, turned into the options of the agent (``acp_mode.py``):
``--model`` / ``--api-base``, or ``--provider NAME --model ID`` from Prime Agent's models.json;
``--daemon-socket``; ``--max-turns``, ``--system-prompt``, ``--append-system-prompt``;
``--autonomous`` (and its gates and limits); ``--offline`` / ``--network``; ``--skill``.
"""

from __future__ import annotations

import sys
from typing import Any

from orchestrator.cli.controls import Controls
from orchestrator.cli.session_choices import SessionChoices

__all__ = ["run_acp"]


def run_acp(
    *,
    model: str | None,
    api_base: str | None,
    provider: str | None,
    daemon_socket: str | None,
    network: bool,
    skills: list[str],
    choices: SessionChoices,
    controls: Controls,
) -> int:
    import os

    from orchestrator.cli.acp_mode import AcpOptions, serve
    from orchestrator.cli.client_config import load_client_config
    from orchestrator.errors import UserError
    from orchestrator.model_names import client_env_names
    from orchestrator.paths import Paths

    settings: dict[str, Any] = dict(choices.fields())
    client_env: dict[str, str] = {}
    if provider is not None:
        if model is None:
            raise UserError("--provider needs --model ID (a model of that provider)")
        from orchestrator.cli.coding_agent_models import resolve_provider_model

        chosen = resolve_provider_model(provider, model)
        model, api_base = chosen.model, chosen.api_base
        client_env.update(chosen.client_env)
        if chosen.api_key_env is not None:
            settings["model"] = {"api_key_env": chosen.api_key_env}
    else:
        config = load_client_config(Paths.from_env().config_file)
        names = client_env_names(model, config.default_model, config.models)
        client_env.update({n: os.environ[n] for n in sorted(names) if os.environ.get(n)})
    if skills:
        print(
            "prime-agent: note: --skill is accepted but skills come from the harness's skill "
            "directories (docs/harness.md); these were not added",
            file=sys.stderr,
        )
    if network:
        print("prime-agent: note: --network is not passed to ACP sessions", file=sys.stderr)
    options = AcpOptions(
        model=model,
        api_base=api_base,
        socket_path=daemon_socket,
        settings=settings or None,
        autonomous=controls.autonomous,
        client_env=client_env,
    )
    return serve(options)
