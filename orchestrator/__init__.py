"""Prime Agent's orchestrator: the public surface is the names below (``__all__``).

- ``Client`` (with ``Session`` and ``Outcome``): the Python SDK, an async client of the daemon
  that creates sessions, prompts them, streams their events, aborts and reads usage
  (``orchestrator/sdk.py``, docs/sdk.md).
- ``ControlClient``: the async client of a running daemon's control socket (docs/protocol.md).
- The exception tree: ``PrimeAgentError`` and its subclasses, drawn in ``orchestrator/errors.py``
  (the control API's own ``ApiError`` subclasses included).
- The settings types: ``Settings`` and its sections, and ``load_settings``
  (``orchestrator/settings.py``).

Everything else is internal and may change. ``tests/unit/test_public_api.py`` pins this list.

``import orchestrator`` imports nothing: every name is loaded on first access (module
``__getattr__``). It has to stay that way, because this package is also the parent of
``orchestrator.runtime``, which runs inside every kernel, where pydantic and the host's
dependencies are absent and each kernel start pays for what a parent package imports.
"""

from __future__ import annotations

import importlib

# Not ``typing.TYPE_CHECKING``: importing typing would be this package's only cost. Type
# checkers read the imports below; at run time they never happen.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Final

    from orchestrator.api.client import ControlClient
    from orchestrator.api.errors import (
        ApiCommandError,
        ConnectionClosed,
        DaemonAlreadyRunning,
        DaemonNotRunning,
        DaemonUnresponsive,
        PermissionDenied,
        ProtocolMismatch,
        SocketPathError,
    )
    from orchestrator.errors import (
        ApiError,
        BusError,
        ConfigError,
        DaemonRefused,
        EmbeddedModelError,
        EmptyReply,
        GoalError,
        HarnessConflict,
        HarnessError,
        HarnessInvalid,
        HarnessNotFound,
        HarnessQuota,
        IllegalTransition,
        KernelDied,
        McpError,
        MissingCredentials,
        ModelError,
        ModelNotFound,
        ModelUnreachable,
        PrimeAgentError,
        ProviderError,
        SandboxError,
        SandboxStartError,
        ScheduleSpecError,
        StoreError,
        StoreLocked,
        UserError,
    )
    from orchestrator.sdk import Client, Outcome, Session
    from orchestrator.settings import (
        CompactionSettings,
        DaemonSettings,
        EmbeddedSettings,
        HarnessSettings,
        KubernetesSettings,
        ModelConfig,
        NatsSettings,
        SandboxSettings,
        Settings,
        load_settings,
    )

__all__ = [
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

_API_CLIENT: Final = "orchestrator.api.client"
_SDK: Final = "orchestrator.sdk"
_SDK_NAMES: Final = frozenset({"Client", "Outcome", "Session"})
_API_ERRORS: Final = "orchestrator.api.errors"
_ERRORS: Final = "orchestrator.errors"
_SETTINGS: Final = "orchestrator.settings"
_SETTINGS_NAMES: Final = frozenset(
    {
        "CompactionSettings",
        "DaemonSettings",
        "EmbeddedSettings",
        "HarnessSettings",
        "KubernetesSettings",
        "ModelConfig",
        "NatsSettings",
        "SandboxSettings",
        "Settings",
        "load_settings",
    }
)
_API_ERROR_NAMES: Final = frozenset(
    {
        "ApiCommandError",
        "ConnectionClosed",
        "DaemonAlreadyRunning",
        "DaemonNotRunning",
        "DaemonUnresponsive",
        "PermissionDenied",
        "ProtocolMismatch",
        "SocketPathError",
    }
)


def _home(name: str) -> str:
    """The module that defines the public ``name``."""
    if name == "ControlClient":
        return _API_CLIENT
    if name in _SDK_NAMES:
        return _SDK
    if name in _API_ERROR_NAMES:
        return _API_ERRORS
    if name in _SETTINGS_NAMES:
        return _SETTINGS
    return _ERRORS


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    value = getattr(importlib.import_module(_home(name)), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
