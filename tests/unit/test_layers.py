"""The layers ``docs/architecture.md`` draws are import-linter contracts in ``pyproject.toml``
(``[tool.importlinter]``): an upward import, an import between packages of one layer, a
project import in the in-kernel runtime, a TUI import past ``orchestrator.api``, or an import
loop fails this test (and ``make check``). The checker reads every import statement, those
inside functions and under ``TYPE_CHECKING`` included."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return found


def test_every_contract_is_kept() -> None:
    proc = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert f"Contracts: {len(contracts())} kept, 0 broken." in proc.stdout


def test_the_contracts_cover_the_drawing() -> None:
    by_id = {str(c["id"]): c for c in contracts()}
    assert set(by_id) == {"layers", "runtime", "testing", "tui", "acyclic"}
    layers = [str(layer) for layer in by_id["layers"]["layers"]]  # type: ignore[attr-defined]
    drawing = (ROOT / "docs" / "architecture.md").read_text()
    for layer in layers:
        for package in layer.replace("|", " ").replace(":", " ").split():
            name = package.removeprefix("orchestrator.").replace("__main__", "cli")
            assert name in drawing, f"{package} is a layer the architecture page does not draw"
    # Every project package has its place: a new one cannot slip past the contracts.
    placed = {p for layer in layers for p in layer.replace("|", " ").replace(":", " ").split()}
    placed |= {"orchestrator.runtime", "orchestrator.testing"}
    packages = {
        f"orchestrator.{p.parent.name}" for p in (ROOT / "orchestrator").glob("*/__init__.py")
    }
    packages |= {
        f"orchestrator.{p.stem}"
        for p in (ROOT / "orchestrator").glob("*.py")
        if p.stem != "__init__"
    }
    assert packages <= placed, f"not in any contract: {sorted(packages - placed)}"


# What the session image installs beside the stdlib (images/session/Dockerfile).
IMAGE_PACKAGES = {"nats", "nkeys", "dill", "IPython", "ipykernel"}


def test_the_runtime_imports_only_the_stdlib_and_the_image() -> None:
    found: dict[str, str] = {}
    for path in sorted((ROOT / "orchestrator" / "runtime").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                found.setdefault(top, path.name)
    outside = {
        top: where
        for top, where in found.items()
        if top not in sys.stdlib_module_names and top not in IMAGE_PACKAGES | {"orchestrator"}
    }
    assert outside == {}, f"the session image lacks these runtime imports: {outside}"
