"""XDG file layout: config, data, cache and runtime directories (docs/design.md, "State and
storage").

Every directory is created 0700 on first use; nothing here touches the disk at import time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "APP_DIR_NAME",
    "CONTROL_SOCKET_FILE_NAME",
    "DATABASE_FILE_NAME",
    "SKILLS_DIR_NAME",
    "Paths",
    "ensure_private_dir",
]

APP_DIR_NAME = "prime-agent"
DATABASE_FILE_NAME = "prime-agent.duckdb"
CONFIG_FILE_NAME = "config.toml"
# The daemon's control socket, in the runtime dir (orchestrator/api/server.py serves it).
CONTROL_SOCKET_FILE_NAME = "orchestrator.sock"
SKILLS_DIR_NAME = "skills"  # the user's skills (SKILL.md folders): orchestrator/harness/skills.py
PRIVATE_DIR_MODE = 0o700


def _xdg(var: str, default: Path) -> Path:
    value = os.environ.get(var, "")
    # The XDG spec says relative paths are invalid and must be ignored.
    if value and os.path.isabs(value):
        return Path(value)
    return default


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and make the leaf 0700."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    os.chmod(path, PRIVATE_DIR_MODE)
    return path


@dataclass(frozen=True)
class Paths:
    config_dir: Path
    data_dir: Path
    cache_dir: Path
    runtime_dir: Path

    @classmethod
    def from_env(cls) -> Paths:
        home = Path.home()
        runtime_base = _xdg("XDG_RUNTIME_DIR", Path("/tmp") / f"{APP_DIR_NAME}-{os.getuid()}")
        return cls(
            config_dir=_xdg("XDG_CONFIG_HOME", home / ".config") / APP_DIR_NAME,
            data_dir=_xdg("XDG_DATA_HOME", home / ".local" / "share") / APP_DIR_NAME,
            cache_dir=_xdg("XDG_CACHE_HOME", home / ".cache") / APP_DIR_NAME,
            runtime_dir=runtime_base / APP_DIR_NAME
            if "XDG_RUNTIME_DIR" in os.environ
            else runtime_base,
        )

    @property
    def config_file(self) -> Path:
        return self.config_dir / CONFIG_FILE_NAME

    @property
    def control_socket(self) -> Path:
        """``$XDG_RUNTIME_DIR/prime-agent/orchestrator.sock`` (or under the /tmp fallback)."""
        return self.runtime_dir / CONTROL_SOCKET_FILE_NAME

    @property
    def database_file(self) -> Path:
        return self.data_dir / DATABASE_FILE_NAME

    @property
    def artifacts_dir(self) -> Path:
        return self.data_dir / "artifacts"

    @property
    def skills_dir(self) -> Path:
        """The user's own skills, below every project's (orchestrator/harness/skills.py)."""
        return self.data_dir / SKILLS_DIR_NAME

    def session_artifacts(self, session_id: str) -> Path:
        from orchestrator.ids import validate_session_id

        return self.artifacts_dir / validate_session_id(session_id)
