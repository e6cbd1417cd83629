"""``agent_message`` and ``agent_observe``: talk to and look at the nuclear family (in the kernel).

The family is the parent, the siblings and the direct children (roots are unrelated to each
other: a root has only its children). The host enforces reach, size, pending and rate limits,
and takes the sender's identity from the kernel's NATS credentials: nothing here sends a sender
field.

Wire shapes (``args`` -> ``result``; optional keys are left out when None):

- ``agent_message.send``: ``{message, receiver_role, receiver_name?, mode}`` ->
  ``{id, status: delivered|queued, target, at}``
- ``agent_message.list_agents``: ``{}`` -> ``{self, parent, siblings, children}``, each member
  ``{name, session_id, status, depth?}`` (``parent`` null for a root)
- ``agent_observe.list``: ``{}`` -> ``{agents: [member view]}``
- ``agent_observe.get``: ``{target}`` -> one member view
- ``agent_observe.recent``: ``{target, limit, max_chars}`` -> ``{messages: [{role, text, at?,
  seq?}]}``

A member view is ``{name, session_id, relationship, status, model?, streaming?,
message_count?, pending_count?, latest_preview?}``.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.runtime.arguments import check_int, check_name, reject_unknown, require_text
from orchestrator.runtime.errors import InvalidArgument
from orchestrator.runtime.host import HostBound
from orchestrator.runtime.replies import as_items, as_object, field_opt_str, field_str

__all__ = [
    "MAX_MESSAGE_BYTES",
    "MESSAGE_MODES",
    "OBSERVE_MIN",
    "RECEIVER_ROLES",
    "AgentFamily",
    "AgentInfo",
    "AgentMessage",
    "AgentObserve",
    "MessageReceipt",
    "ObservedAgent",
    "ObservedMessage",
    "agent_message",
    "agent_observe",
]

MAX_MESSAGE_BYTES = 16 * 1024  # UTF-8 bytes per message (docs/spec.md §3)
RECEIVER_ROLES = ("parent", "sibling", "child")
MESSAGE_MODES = ("steer", "follow_up")
OBSERVE_RECENT_DEFAULT_LIMIT = 8
OBSERVE_DEFAULT_MAX_CHARS = 800
# Both must be positive; the host sets (and enforces) the upper bounds.
OBSERVE_MIN = 1


def _int_field(obj: Mapping[str, Any], key: str) -> int:
    value = obj.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _opt_int(obj: Mapping[str, Any], key: str) -> int | None:
    value = obj.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --- result types -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MessageReceipt:
    """A sent message: ``status`` is ``delivered`` (target was idle: a turn starts) or
    ``queued`` (target busy or inactive: delivered at its next step or wake-up)."""

    id: str
    status: str
    target: str
    at: str

    @classmethod
    def from_wire(cls, value: object) -> MessageReceipt:
        where = "agent_message.send"
        obj = as_object(value, where)
        return cls(
            id=field_str(obj, "id", where),
            status=field_str(obj, "status", where),
            target=field_str(obj, "target", where),
            at=field_str(obj, "at", where),
        )


@dataclass(frozen=True)
class AgentInfo:
    """A family member (or this session): ``status`` is running, idle or inactive."""

    name: str
    session_id: str
    status: str
    depth: int | None = None

    @classmethod
    def from_wire(cls, value: object, where: str) -> AgentInfo:
        obj = as_object(value, where)
        return cls(
            name=field_str(obj, "name", where),
            session_id=field_str(obj, "session_id", where),
            status=field_str(obj, "status", where),
            depth=_opt_int(obj, "depth"),
        )

    def __str__(self) -> str:
        return f"{self.name} ({self.session_id}, {self.status})"


@dataclass(frozen=True, repr=False)
class AgentFamily:
    """This session (``self``) and the members it may message: parent, siblings, children."""

    self: AgentInfo
    parent: AgentInfo | None
    siblings: list[AgentInfo] = field(default_factory=list)
    children: list[AgentInfo] = field(default_factory=list)

    @classmethod
    def from_wire(cls, value: object) -> AgentFamily:
        where = "agent_message.list_agents"
        obj = as_object(value, where)
        parent = obj.get("parent")
        return cls(
            self=AgentInfo.from_wire(obj.get("self"), where),
            parent=AgentInfo.from_wire(parent, where) if parent is not None else None,
            siblings=[AgentInfo.from_wire(m, where) for m in as_items(obj, "siblings", where)],
            children=[AgentInfo.from_wire(m, where) for m in as_items(obj, "children", where)],
        )

    def __repr__(self) -> str:
        def many(members: list[AgentInfo]) -> str:
            return ", ".join(str(m) for m in members) or "(none)"

        return (
            "AgentFamily(\n"
            f"  self:     {self.self}\n"
            f"  parent:   {self.parent if self.parent is not None else '(none: root session)'}\n"
            f"  siblings: {many(self.siblings)}\n"
            f"  children: {many(self.children)}\n"
            ")"
        )


@dataclass(frozen=True)
class ObservedAgent:
    """A read-only view of a family member."""

    name: str
    session_id: str
    relationship: str
    status: str
    model: str | None = None
    streaming: bool = False
    message_count: int = 0
    pending_count: int = 0
    latest_preview: str = ""

    @classmethod
    def from_wire(cls, value: object, where: str) -> ObservedAgent:
        obj = as_object(value, where)
        return cls(
            name=field_str(obj, "name", where),
            session_id=field_str(obj, "session_id", where),
            relationship=field_str(obj, "relationship", where),
            status=field_str(obj, "status", where),
            model=field_opt_str(obj, "model"),
            streaming=obj.get("streaming") is True,
            message_count=_int_field(obj, "message_count"),
            pending_count=_int_field(obj, "pending_count"),
            latest_preview=field_opt_str(obj, "latest_preview") or "",
        )


@dataclass(frozen=True)
class ObservedMessage:
    """One recent message of an observed member (``text`` cut to ``max_chars``)."""

    role: str
    text: str
    at: str | None = None
    seq: int | None = None

    @classmethod
    def from_wire(cls, value: object) -> ObservedMessage:
        where = "agent_observe.recent"
        obj = as_object(value, where)
        return cls(
            role=field_str(obj, "role", where),
            text=field_str(obj, "text", where),
            at=field_opt_str(obj, "at"),
            seq=_opt_int(obj, "seq"),
        )


ObservedAgents = list[ObservedAgent]
ObservedMessages = list[ObservedMessage]


def _observe_target(where: str, value: object) -> str:
    if isinstance(value, AgentInfo | ObservedAgent):
        return value.session_id
    if isinstance(value, str):
        return require_text(where, "target", value).strip()
    raise TypeError(
        f"{where}: target must be a name or session id (str), not {type(value).__name__}"
    )


# --- agent_message ----------------------------------------------------------------------------


class AgentMessage(HostBound):
    """``await agent_message.send(message, receiver_role="parent", receiver_name=None,
    mode="steer")`` and ``await agent_message.list_agents()``."""

    SEND_KWARGS = ("receiver_role", "receiver_name", "mode")

    def __repr__(self) -> str:
        return (
            "<agent_message: await agent_message.send(message, receiver_role='parent'|'sibling'"
            "|'child', receiver_name=None, mode='steer'|'follow_up') -> MessageReceipt; "
            "await agent_message.list_agents() -> AgentFamily>"
        )

    def send(
        self,
        message: str,
        receiver_role: str = "parent",
        receiver_name: str | None = None,
        mode: str = "steer",
        **unknown: Any,
    ) -> Coroutine[Any, Any, MessageReceipt]:
        """Send ``message`` to the parent, a sibling or a child (by name).

        ``receiver_name`` is required for ``sibling`` and ``child`` and not allowed for
        ``parent``. ``mode="steer"`` reaches a busy receiver at its next model call;
        ``"follow_up"`` after its current run. At most 16 KiB (UTF-8) per message.
        """
        where = "agent_message.send"
        reject_unknown(where, unknown, self.SEND_KWARGS)
        text = require_text(where, "message", message)
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > MAX_MESSAGE_BYTES:
            raise InvalidArgument(
                f"{where}: message is {size} bytes (UTF-8); the limit is {MAX_MESSAGE_BYTES}"
            )
        if not isinstance(receiver_role, str):
            raise TypeError(f"{where}: receiver_role must be a str")
        if receiver_role not in RECEIVER_ROLES:
            raise InvalidArgument(
                f"{where}: receiver_role must be one of {', '.join(RECEIVER_ROLES)}, "
                f"not {receiver_role!r}"
            )
        if not isinstance(mode, str):
            raise TypeError(f"{where}: mode must be a str")
        if mode not in MESSAGE_MODES:
            raise InvalidArgument(
                f"{where}: mode must be one of {', '.join(MESSAGE_MODES)}, not {mode!r}"
            )
        args: dict[str, Any] = {"message": text, "receiver_role": receiver_role, "mode": mode}
        if receiver_role == "parent":
            if receiver_name is not None:
                raise TypeError(
                    f"{where}: receiver_name is not allowed with receiver_role='parent' "
                    "(a session has one parent)"
                )
        else:
            if receiver_name is None:
                raise TypeError(
                    f"{where}: receiver_name is required with receiver_role={receiver_role!r}"
                )
            args["receiver_name"] = check_name(where, receiver_name, "receiver_name")
        return self._send(args)

    async def _send(self, args: dict[str, Any]) -> MessageReceipt:
        return MessageReceipt.from_wire(await self._client().request("agent_message.send", args))

    def list_agents(self, **unknown: Any) -> Coroutine[Any, Any, AgentFamily]:
        """This session and its family (parent, siblings, children) with their status."""
        reject_unknown("agent_message.list_agents", unknown, ())
        return self._list_agents()

    async def _list_agents(self) -> AgentFamily:
        result = await self._client().request("agent_message.list_agents", {})
        return AgentFamily.from_wire(result)


# --- agent_observe ----------------------------------------------------------------------------


class AgentObserve(HostBound):
    """Read-only views of family members: ``list()``, ``get(target)``, ``recent(target)``."""

    def __repr__(self) -> str:
        return (
            "<agent_observe: await agent_observe.list() -> [ObservedAgent]; "
            "await agent_observe.get(target); "
            "await agent_observe.recent(target, limit=8, max_chars=800) -> [ObservedMessage]>"
        )

    def list(self, **unknown: Any) -> Coroutine[Any, Any, ObservedAgents]:
        """Every family member this session may observe."""
        reject_unknown("agent_observe.list", unknown, ())
        return self._list()

    async def _list(self) -> ObservedAgents:
        where = "agent_observe.list"
        result = await self._client().request(where, {})
        return [ObservedAgent.from_wire(item, where) for item in as_items(result, "agents", where)]

    def get(
        self, target: str | AgentInfo | ObservedAgent, **unknown: Any
    ) -> Coroutine[Any, Any, ObservedAgent]:
        """One family member by name or session id."""
        where = "agent_observe.get"
        reject_unknown(where, unknown, ())
        return self._get(_observe_target(where, target))

    async def _get(self, target: str) -> ObservedAgent:
        where = "agent_observe.get"
        result = await self._client().request(where, {"target": target})
        return ObservedAgent.from_wire(result, where)

    def recent(
        self,
        target: str | AgentInfo | ObservedAgent,
        limit: int = OBSERVE_RECENT_DEFAULT_LIMIT,
        max_chars: int = OBSERVE_DEFAULT_MAX_CHARS,
        **unknown: Any,
    ) -> Coroutine[Any, Any, ObservedMessages]:
        """The member's last ``limit`` messages, each cut to ``max_chars`` characters.

        Both must be positive; the orchestrator caps them (``InvalidArgument`` above its cap).
        """
        where = "agent_observe.recent"
        reject_unknown(where, unknown, ("limit", "max_chars"))
        args = {
            "target": _observe_target(where, target),
            "limit": check_int(where, "limit", limit, OBSERVE_MIN),
            "max_chars": check_int(where, "max_chars", max_chars, OBSERVE_MIN),
        }
        return self._recent(args)

    async def _recent(self, args: dict[str, Any]) -> ObservedMessages:
        where = "agent_observe.recent"
        result = await self._client().request(where, args)
        return [ObservedMessage.from_wire(m) for m in as_items(result, "messages", where)]


agent_message = AgentMessage()
agent_observe = AgentObserve()
