"""The TUI talks to the daemon only through the control API: ``tui/`` imports
``orchestrator.api`` and nothing else of the orchestrator (docs/tui.md;
docs/architecture.md, "Layers")."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

TUI_DIR = Path(__file__).resolve().parents[2] / "tui"
ALLOWED_IMPORT = "orchestrator.api"
# What importing orchestrator.api itself loads: its own modules and three leaf modules it uses
# (the exception tree, path helpers, and the shape of an MCP server entry that config.toml,
# --mcp-config and ACP's session/new share), none of them the daemon's internals.
ALLOWED_LOADED = (
    "orchestrator",
    "orchestrator.errors",
    "orchestrator.paths",
    "orchestrator.mcp_config",
)
ALLOWED_LOADED_PREFIX = "orchestrator.api"


def forbidden_imports(source: str) -> list[str]:
    """Every orchestrator module ``source`` imports other than ``orchestrator.api``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "orchestrator" and name != ALLOWED_IMPORT:
                found.append(name)
    return found


def test_the_checker_catches_an_internal_import() -> None:
    assert forbidden_imports("from orchestrator.sessions.manager import Orchestrator") == [
        "orchestrator.sessions.manager"
    ]
    assert forbidden_imports("import orchestrator.store.db as db") == ["orchestrator.store.db"]
    assert forbidden_imports("from orchestrator.api.protocol import Event") == [
        "orchestrator.api.protocol"
    ]
    assert forbidden_imports("from orchestrator.api import ControlClient") == []


def test_tui_modules_import_only_orchestrator_api() -> None:
    modules = sorted(TUI_DIR.glob("*.py"))
    assert len(modules) > 5
    bad = {p.name: forbidden_imports(p.read_text()) for p in modules}
    assert {k: v for k, v in bad.items() if v} == {}


def test_importing_the_tui_loads_no_daemon_internals() -> None:
    names = sorted(p.stem for p in TUI_DIR.glob("*.py") if p.stem != "__init__")
    code = (
        "import importlib, json, sys\n"
        f"for n in {names!r}: importlib.import_module('tui.' + n)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'orchestrator')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    loaded = json.loads(proc.stdout)
    assert "orchestrator.api" in loaded
    extra = [
        m
        for m in loaded
        if m not in ALLOWED_LOADED
        and m != ALLOWED_LOADED_PREFIX
        and not m.startswith(ALLOWED_LOADED_PREFIX + ".")
    ]
    assert extra == []
