"""What a run's own flags choose for its session over config.toml: ``--max-turns N`` (model
calls per user prompt), ``--system-prompt TEXT`` (instead of the built-in base prompt),
``--append-system-prompt TEXT`` (after it) and ``--skill PATH`` (repeatable: a skill's
directory, its SKILL.md, or a directory of skills, added for the family). A prompt value naming
an existing file is read from it, as Prime Agent's flags are. ``--mcp-config FILE``: MCP
servers for the run's family (docs/mcp.md).

They travel as ``SessionSettings`` fields to the daemon (stored with the session, so a wake or
another daemon keeps them) or as ``StoredRunSettings`` to an in-process run; the system
prompts apply to the root only (its subagents keep their own), ``--max-turns`` to the family.
Plain data here: the lean ``-p`` path imports no pydantic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError

if TYPE_CHECKING:
    from orchestrator.session_specs import StoredRunSettings

__all__ = ["SKILL_FILE", "SessionChoices", "mcp_servers_of", "prompt_text", "skill_path"]

SKILL_FILE = "SKILL.md"  # harness/skills.py's SKILL_FILE_NAME (the lean client imports no yaml)


def prompt_text(value: str | None, flag: str) -> str | None:
    """``value``, or the text of the file it names; ``UserError`` for one that is empty."""
    if value is None:
        return None
    path = Path(value).expanduser()
    try:
        text = path.read_text(encoding="utf-8") if len(value) < 4096 and path.is_file() else value
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{flag}: cannot read {path}: {exc}") from None
    if not text.strip():
        raise UserError(f"{flag} is empty")
    return text


def mcp_servers_of(path: str | None) -> dict[str, Any] | None:
    """``--mcp-config FILE`` (Claude Code's ``{"mcpServers": {...}}``) as plain JSON servers by
    the names the kernel reads them by; checked here, so a bad file is one line now."""
    if path is None:
        return None
    from orchestrator.mcp_config import load_mcp_config_file

    servers = load_mcp_config_file(Path(path).expanduser())
    return {
        name: config.model_dump(mode="json", exclude_defaults=True)
        for name, config in servers.items()
    }


def skill_path(value: str) -> str:
    """``--skill``'s value as the absolute directory the daemon reads: a skill's directory,
    a directory of skills, or a skill's SKILL.md (its directory); ``UserError`` otherwise."""
    path = Path(value).expanduser().absolute()
    if path.name == SKILL_FILE and path.is_file():
        path = path.parent
    if not path.is_dir():
        raise UserError(
            f"--skill {value}: not a skill (a directory with {SKILL_FILE}) "
            "nor a directory of skills"
        )
    return str(path.resolve())


@dataclass(frozen=True)
class SessionChoices:
    max_turn_steps: int | None = None
    system_prompt: str | None = None
    append_system_prompt: str | None = None
    skill_paths: tuple[str, ...] = ()
    mcp_servers: dict[str, Any] | None = None  # --mcp-config (docs/mcp.md)

    @classmethod
    def from_flags(
        cls,
        max_turns: int | None,
        system_prompt: str | None,
        append_system_prompt: str | None,
        skills: Sequence[str] = (),
        mcp_config: str | None = None,
    ) -> SessionChoices:
        if max_turns is not None and max_turns < 1:
            raise UserError("--max-turns must be at least 1")
        return cls(
            max_turn_steps=max_turns,
            system_prompt=prompt_text(system_prompt, "--system-prompt"),
            append_system_prompt=prompt_text(append_system_prompt, "--append-system-prompt"),
            skill_paths=tuple(dict.fromkeys(skill_path(value) for value in skills)),
            mcp_servers=mcp_servers_of(mcp_config),
        )

    def fields(self) -> dict[str, Any]:
        chosen = {
            "max_turn_steps": self.max_turn_steps,
            "system_prompt": self.system_prompt,
            "append_system_prompt": self.append_system_prompt,
            "skill_paths": list(self.skill_paths) or None,
            "mcp_servers": self.mcp_servers or None,
        }
        return {k: v for k, v in chosen.items() if v is not None}

    def settings(self) -> dict[str, Any] | None:
        """``create_session``'s ``settings`` (``SessionSettings`` fields); None: none chosen."""
        return self.fields() or None

    def stored(self) -> StoredRunSettings | None:
        """What an in-process run stores with its root; None: none chosen."""
        fields = self.fields()
        if not fields:
            return None
        from orchestrator.session_specs import StoredRunSettings

        return StoredRunSettings(**fields)
