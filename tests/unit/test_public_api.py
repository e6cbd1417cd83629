"""The public surface of ``orchestrator``: the exact exported names, each importable; importing
the package imports nothing; the exception tree drawn in ``orchestrator/errors.py`` is the real
one; every wire error code maps to a class."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import orchestrator
from orchestrator import errors as errors_module
from orchestrator.api import errors as api_errors
from orchestrator.api import wire as api_wire
from orchestrator.runtime import errors as kernel_errors
from orchestrator.runtime import wire

ROOT = Path(__file__).resolve().parents[2]

EXPORTED = [
    "ApiCommandError",
    "ApiError",
    "BusError",
    "Client",
    "CompactionSettings",
    "ConfigError",
    "ConnectionClosed",
    "ControlClient",
    "DaemonAlreadyRunning",
    "DaemonNotRunning",
    "DaemonRefused",
    "DaemonSettings",
    "DaemonUnresponsive",
    "EmbeddedModelError",
    "EmbeddedSettings",
    "EmptyReply",
    "GoalError",
    "HarnessConflict",
    "HarnessError",
    "HarnessInvalid",
    "HarnessNotFound",
    "HarnessQuota",
    "HarnessSettings",
    "IllegalTransition",
    "KernelDied",
    "KubernetesSettings",
    "McpError",
    "MissingCredentials",
    "ModelConfig",
    "ModelError",
    "ModelNotFound",
    "ModelUnreachable",
    "NatsSettings",
    "Outcome",
    "PermissionDenied",
    "PrimeAgentError",
    "ProtocolMismatch",
    "ProviderError",
    "SandboxError",
    "SandboxSettings",
    "SandboxStartError",
    "ScheduleSpecError",
    "Session",
    "Settings",
    "SocketPathError",
    "StoreError",
    "StoreLocked",
    "UserError",
    "load_settings",
]

# A line of the drawing: tree characters, a class name, then notes ("(api)", "+ UserError").
_TREE_LINE = re.compile(r"^(?P<indent>[ │├└─]*)(?P<name>[A-Z][A-Za-z]+)(?P<notes>.*)$")
_ALSO = re.compile(r"\+ ([A-Z][A-Za-z]+)")


def _classes_defined_in(module: object) -> dict[str, type[BaseException]]:
    return {
        name: obj
        for name, obj in vars(module).items()
        if inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and obj.__module__ == getattr(module, "__name__", None)
    }


def _drawing() -> list[tuple[int, str, str]]:
    """(depth column, class name, notes) for each line of the tree in errors.py's docstring."""
    doc = errors_module.__doc__ or ""
    block = doc.split("::", 1)[1].split("\n\n", 2)[1]
    rows = []
    for line in block.splitlines():
        match = _TREE_LINE.match(line.strip("\n")[4:])  # the block is indented by 4
        assert match, f"not a tree line: {line!r}"
        rows.append((len(match["indent"]), match["name"], match["notes"]))
    return rows


# --- the exported names -----------------------------------------------------------------------


def test_the_exported_names_are_exactly_these() -> None:
    assert sorted(orchestrator.__all__) == EXPORTED
    assert orchestrator.__all__ == sorted(orchestrator.__all__)


@pytest.mark.parametrize("name", EXPORTED)
def test_each_exported_name_is_importable(name: str) -> None:
    value = getattr(orchestrator, name)
    assert getattr(value, "__name__", None) == name
    assert name in dir(orchestrator)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Orchestrator'"):
        _ = orchestrator.Orchestrator


def test_import_orchestrator_imports_nothing_else() -> None:
    """The package is the parent of the in-kernel runtime: importing it must load no submodule
    and none of the host's dependencies (pydantic is not in the session image)."""
    probe = (
        "import sys; before = set(sys.modules); import orchestrator; "
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["orchestrator"]


def test_every_error_class_is_exported() -> None:
    drawn = {name for _, name, _ in _drawing()}
    assert drawn <= set(orchestrator.__all__)


# --- the drawn tree ---------------------------------------------------------------------------


def test_the_drawing_lists_every_exception_class_and_only_those() -> None:
    defined = _classes_defined_in(errors_module)
    api_defined = _classes_defined_in(api_errors)
    drawn = [name for _, name, _ in _drawing()]
    assert len(drawn) == len(set(drawn)), "a class is drawn twice"
    assert set(drawn) == set(defined) | set(api_defined)
    assert set(errors_module.__all__) == set(defined)
    for _, name, notes in _drawing():
        assert ("(api)" in notes) == (name in api_defined), name


def test_the_drawing_shows_each_class_under_its_base() -> None:
    rows = _drawing()
    found = {**_classes_defined_in(errors_module), **_classes_defined_in(api_errors)}
    parents: list[tuple[int, str]] = []  # (depth, name) of the open branches
    for depth, name, notes in rows:
        while parents and parents[-1][0] >= depth:
            parents.pop()
        expected = {found[also] for also in _ALSO.findall(notes)}
        if parents:
            expected.add(found[parents[-1][1]])
        else:
            expected.add(Exception)
        assert set(found[name].__bases__) == expected, name
        parents.append((depth, name))


# --- wire codes -------------------------------------------------------------------------------


def test_every_control_api_error_code_maps_to_a_class() -> None:
    assert set(api_errors.WIRE_ERROR_CLASSES) == set(api_wire.ERROR_CODES)
    for code, cls in api_errors.WIRE_ERROR_CLASSES.items():
        assert issubclass(cls, errors_module.ApiError)
        error = api_errors.error_from_wire(code, "said")
        assert type(error) is cls and error.code == code and str(error) == "said"
    assert type(api_errors.error_from_wire("version_mismatch", "v")) is api_errors.ProtocolMismatch
    assert type(api_errors.error_from_wire("permission_denied", "p")) is api_errors.PermissionDenied
    newer = api_errors.error_from_wire("from_a_newer_daemon", "n")
    assert type(newer) is api_errors.ApiCommandError and newer.code == "from_a_newer_daemon"


def test_every_code_the_daemon_sends_is_a_wire_code() -> None:
    """The codes named where the daemon answers (``E_*`` in daemon/ and api/server.py) are all
    in ``ERROR_CODES``, so each has its class above."""
    sources = [*sorted((ROOT / "orchestrator" / "daemon").glob("*.py"))]
    sources.append(ROOT / "orchestrator" / "api" / "server.py")
    named = {name for path in sources for name in re.findall(r"\bE_[A-Z_]+\b", path.read_text())}
    assert named, "the daemon names its codes"
    for name in sorted(named):
        assert getattr(api_wire, name) in api_wire.ERROR_CODES, name


def test_host_codes_on_the_tree_are_wire_codes_the_kernel_knows() -> None:
    for cls in _classes_defined_in(errors_module).values():
        code = cls.__dict__.get("code")
        if isinstance(code, str):
            assert code in wire.ERROR_CODES, cls.__name__
            assert code in kernel_errors.ERROR_CLASSES, cls.__name__
