"""``rlm``: spawn and manage subagents, find models, make plain completions (in the kernel).

Every method validates its arguments when it is *called* (before anything is awaited or sent),
raising ``TypeError`` for unknown keyword arguments and wrong types and ``InvalidArgument`` (a
``ValueError``) for bad values, then returns a coroutine that makes one host request. The host
is the authority and checks everything again; checking here only gives clearer, earlier errors.

Wire shapes (``args`` -> ``result``; optional keys are left out when None):

- ``rlm.run``: ``{prompt, name?, model?, thinking?, budget?}`` ->
  ``{rlm_child_id, name, session_id, model}``
- ``rlm.list_subagents``: ``{}`` ->
  ``{subagents: [{rlm_child_id, name, session_id, status, model?, usage?}]}``
- ``rlm.delete_subagent``: ``{target}`` (a child id or name) -> one subagent object
- ``rlm.find_models``: ``{query, limit}`` -> ``{models: [{provider, id, name, selector}]}``
- ``rlm.query``: ``{prompt, model?}`` -> ``{text}``
- ``rlm.query_batched``: ``{prompts, model?}`` ->
  ``{results: [{ok: true, text} | {ok: false, error: {code, message, retry_after?}}]}``
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from orchestrator.runtime.arguments import (
    MAX_NAME_CHARS,
    check_int,
    check_name,
    check_timeout,
    optional_text,
    reject_unknown,
    require_text,
)
from orchestrator.runtime.errors import (
    HostError,
    InternalHostError,
    InvalidArgument,
    QueryBatchError,
    error_from_reply,
)
from orchestrator.runtime.harness import Harness
from orchestrator.runtime.host import HostBound
from orchestrator.runtime.replies import as_items, as_object, field_opt_str, field_str

__all__ = [
    "FIND_MODELS_DEFAULT_LIMIT",
    "FIND_MODELS_MAX_LIMIT",
    "MAX_NAME_CHARS",
    "QUERY_TIMEOUT_S",
    "SUBAGENT_STATUSES",
    "THINKING_LEVELS",
    "RLMModel",
    "RLMSpawnHandle",
    "RLMSubagent",
    "Rlm",
    "rlm",
]

FIND_MODELS_DEFAULT_LIMIT = 8
FIND_MODELS_MIN_LIMIT = 1
FIND_MODELS_MAX_LIMIT = 20
# A completion can take longer than the default 30 s host-request timeout.
QUERY_TIMEOUT_S = 300.0
THINKING_LEVELS = ("off", "minimal", "low", "medium", "high", "xhigh", "max")
SUBAGENT_STATUSES = ("running", "idle", "inactive", "completed", "error", "deleted", "failed")


# --- result types -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RLMSpawnHandle:
    """A subagent admitted by ``rlm(...)``; it runs on its own (this is not its answer)."""

    rlm_child_id: str
    name: str
    session_id: str
    model: str | None = None

    @classmethod
    def from_wire(cls, value: object) -> RLMSpawnHandle:
        obj = as_object(value, "rlm.run")
        return cls(
            rlm_child_id=field_str(obj, "rlm_child_id", "rlm.run"),
            name=field_str(obj, "name", "rlm.run"),
            session_id=field_str(obj, "session_id", "rlm.run"),
            model=field_opt_str(obj, "model"),
        )


@dataclass(frozen=True)
class RLMSubagent:
    """A direct child: ``status`` is running, idle, inactive, completed, error, deleted or
    failed (its sandbox would not start)."""

    rlm_child_id: str
    name: str
    session_id: str
    status: str
    model: str | None = None
    usage: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_wire(cls, value: object, where: str = "rlm.list_subagents") -> RLMSubagent:
        obj = as_object(value, where)
        usage = obj.get("usage")
        return cls(
            rlm_child_id=field_str(obj, "rlm_child_id", where),
            name=field_str(obj, "name", where),
            session_id=field_str(obj, "session_id", where),
            status=field_str(obj, "status", where),
            model=field_opt_str(obj, "model"),
            usage=dict(usage) if isinstance(usage, dict) else {},
        )


@dataclass(frozen=True)
class RLMModel:
    """A model usable with the current credentials; pass ``selector`` as ``model=``."""

    provider: str
    id: str
    name: str
    selector: str

    @classmethod
    def from_wire(cls, value: object) -> RLMModel:
        obj = as_object(value, "rlm.find_models")
        where = "rlm.find_models"
        return cls(
            provider=field_str(obj, "provider", where),
            id=field_str(obj, "id", where),
            name=field_opt_str(obj, "name") or field_str(obj, "id", where),
            selector=field_str(obj, "selector", where),
        )


def _child_target(value: object) -> str:
    if isinstance(value, RLMSpawnHandle | RLMSubagent):
        return value.rlm_child_id
    if isinstance(value, str):
        return require_text("rlm.delete_subagent", "child_or_name", value).strip()
    raise TypeError(
        "rlm.delete_subagent: pass a handle from rlm(...), an entry of "
        f"rlm.list_subagents(), a child id or a name, not {type(value).__name__}"
    )


# --- the rlm object ---------------------------------------------------------------------------


class Rlm(HostBound):
    """``await rlm(prompt, ...)`` spawns a subagent; the methods manage them.

    - ``await rlm(prompt, name=None, model=None, thinking=None, budget=None)`` (or
      ``rlm.run``) -> ``RLMSpawnHandle`` as soon as the child is admitted; never its answer.
    - ``await rlm.list_subagents()`` -> ``[RLMSubagent]`` (direct children).
    - ``await rlm.delete_subagent(child_or_name)`` -> the ``RLMSubagent``, now deleted.
    - ``await rlm.find_models(query="", limit=8)`` -> ``[RLMModel]``.
    - ``await rlm.query(prompt, model=None)`` -> the completion text (no session, no sandbox).
    - ``await rlm.query_batched(prompts, model=None)`` -> one text per prompt, in order.
    - ``rlm.harness``: the Continual Harness (prompt notes, memories, skills, subagent specs).
    """

    RUN_KWARGS = ("name", "model", "thinking", "budget")

    def __repr__(self) -> str:
        return (
            "<rlm: await rlm(prompt, name=None, model=None, thinking=None, budget=None) -> "
            "RLMSpawnHandle; also rlm.list_subagents(), rlm.delete_subagent(child_or_name), "
            "rlm.find_models(query='', limit=8), rlm.query(prompt, model=None), "
            "rlm.query_batched(prompts, model=None)>"
        )

    def run(
        self,
        prompt: str,
        *,
        name: str | None = None,
        model: str | None = None,
        thinking: str | None = None,
        budget: int | None = None,
        **unknown: Any,
    ) -> Coroutine[Any, Any, RLMSpawnHandle]:
        """Spawn a subagent; returns (when awaited) its handle at admission.

        ``name``: at most 64 characters, unique among this session's children (default: derived
        from the prompt). ``model``: an exact ``provider/id`` selector (see ``find_models``);
        default: this session's model. ``thinking``: one of off, minimal, low, medium, high,
        xhigh, max. ``budget``: the child's token budget (a positive int), carved from this
        session's budget.
        """
        where = "rlm.run"
        reject_unknown(where, unknown, self.RUN_KWARGS)
        args: dict[str, Any] = {"prompt": require_text(where, "prompt", prompt)}
        if name is not None:
            args["name"] = check_name(where, name)
        if model is not None:
            args["model"] = optional_text(where, "model", model)
        if thinking is not None:
            if not isinstance(thinking, str):
                raise TypeError(f"{where}: thinking must be a str, not {type(thinking).__name__}")
            level = thinking.strip().lower()
            if level not in THINKING_LEVELS:
                raise InvalidArgument(
                    f"{where}: thinking must be one of {', '.join(THINKING_LEVELS)}, "
                    f"not {thinking!r}"
                )
            args["thinking"] = level
        if budget is not None:
            args["budget"] = check_int(where, "budget", budget, 1)
        return self._spawn(args)

    __call__ = run

    async def _spawn(self, args: dict[str, Any]) -> RLMSpawnHandle:
        return RLMSpawnHandle.from_wire(await self._client().request("rlm.run", args))

    def list_subagents(self, **unknown: Any) -> Coroutine[Any, Any, list[RLMSubagent]]:
        """This session's direct children: id, name, status, model and usage so far."""
        reject_unknown("rlm.list_subagents", unknown, ())
        return self._list_subagents()

    async def _list_subagents(self) -> list[RLMSubagent]:
        where = "rlm.list_subagents"
        result = await self._client().request(where, {})
        return [RLMSubagent.from_wire(item) for item in as_items(result, "subagents", where)]

    def delete_subagent(
        self, child_or_name: RLMSpawnHandle | RLMSubagent | str, **unknown: Any
    ) -> Coroutine[Any, Any, RLMSubagent]:
        """Cancel a child and tombstone it (its history is kept)."""
        reject_unknown("rlm.delete_subagent", unknown, ())
        return self._delete(_child_target(child_or_name))

    async def _delete(self, target: str) -> RLMSubagent:
        where = "rlm.delete_subagent"
        result = await self._client().request(where, {"target": target})
        return RLMSubagent.from_wire(result, where)

    def find_models(
        self, query: str = "", limit: int = FIND_MODELS_DEFAULT_LIMIT, **unknown: Any
    ) -> Coroutine[Any, Any, list[RLMModel]]:
        """Models usable with the current credentials, best match first (``limit`` 1..20)."""
        where = "rlm.find_models"
        reject_unknown(where, unknown, ("query", "limit"))
        if not isinstance(query, str):
            raise TypeError(f"{where}: query must be a str, not {type(query).__name__}")
        limit = check_int(where, "limit", limit, FIND_MODELS_MIN_LIMIT, FIND_MODELS_MAX_LIMIT)
        return self._find_models(query.strip(), limit)

    async def _find_models(self, query: str, limit: int) -> list[RLMModel]:
        where = "rlm.find_models"
        result = await self._client().request(where, {"query": query, "limit": limit})
        return [RLMModel.from_wire(item) for item in as_items(result, "models", where)]

    def query(
        self,
        prompt: str,
        model: str | None = None,
        *,
        timeout: float | None = None,
        **unknown: Any,
    ) -> Coroutine[Any, Any, str]:
        """One plain completion (no session, no sandbox, no tools), accounted to this session.

        ``timeout`` defaults to 300 s (a completion can be slow).
        """
        where = "rlm.query"
        reject_unknown(where, unknown, ("model", "timeout"))
        args: dict[str, Any] = {"prompt": require_text(where, "prompt", prompt)}
        if model is not None:
            args["model"] = optional_text(where, "model", model)
        return self._query(args, check_timeout(where, timeout) or QUERY_TIMEOUT_S)

    async def _query(self, args: dict[str, Any], timeout: float) -> str:
        where = "rlm.query"
        result = await self._client().request(where, args, timeout=timeout)
        return field_str(as_object(result, where), "text", where)

    @overload
    def query_batched(
        self,
        prompts: Sequence[str],
        model: str | None = None,
        *,
        return_exceptions: Literal[False] = False,
        timeout: float | None = None,
        **unknown: Any,
    ) -> Coroutine[Any, Any, list[str]]: ...

    @overload
    def query_batched(
        self,
        prompts: Sequence[str],
        model: str | None = None,
        *,
        return_exceptions: Literal[True],
        timeout: float | None = None,
        **unknown: Any,
    ) -> Coroutine[Any, Any, list[str | HostError]]: ...

    def query_batched(
        self,
        prompts: Sequence[str],
        model: str | None = None,
        *,
        return_exceptions: bool = False,
        timeout: float | None = None,
        **unknown: Any,
    ) -> Coroutine[Any, Any, list[str]] | Coroutine[Any, Any, list[str | HostError]]:
        """Plain completions for several prompts (run concurrently by the host), in order.

        If any prompt fails, raises ``QueryBatchError`` whose ``.results`` still holds every
        answer that succeeded (and the error of each failed one). With
        ``return_exceptions=True`` the list is returned instead, a ``HostError`` in place of
        each failure, as ``asyncio.gather`` does.
        """
        where = "rlm.query_batched"
        reject_unknown(where, unknown, ("model", "return_exceptions", "timeout"))
        if isinstance(prompts, str) or not isinstance(prompts, Sequence):
            raise TypeError(f"{where}: prompts must be a list of str")
        if not prompts:
            raise InvalidArgument(f"{where}: prompts is empty")
        texts = [require_text(where, f"prompts[{i}]", p) for i, p in enumerate(prompts)]
        args: dict[str, Any] = {"prompts": texts}
        if model is not None:
            args["model"] = optional_text(where, "model", model)
        wait_s = check_timeout(where, timeout) or QUERY_TIMEOUT_S
        return self._query_batched(args, len(texts), bool(return_exceptions), wait_s)

    async def _query_batched(
        self, args: dict[str, Any], count: int, return_exceptions: bool, timeout: float
    ) -> list[str | HostError]:
        where = "rlm.query_batched"
        result = await self._client().request(where, args, timeout=timeout)
        items = as_items(result, "results", where)
        if len(items) != count:
            raise InternalHostError(
                f"the orchestrator answered {len(items)} results for {count} prompts"
            )
        results: list[str | HostError] = []
        for item in items:
            if item.get("ok") is True:
                results.append(field_str(item, "text", where))
            else:
                results.append(error_from_reply(item.get("error")))
        failures = [item for item in results if isinstance(item, HostError)]
        if failures and not return_exceptions:
            first = failures[0]
            raise QueryBatchError(
                f"{len(failures)} of {count} prompts failed (first: {first.code}: {first}); "
                "the answers that succeeded are in .results",
                code=first.code,
                retry_after=first.retry_after,
                results=results,
            )
        return results

    @property
    def harness(self) -> Harness:
        """The Continual Harness (``harness.py``), on the same client."""
        return Harness(self._client_override)

    def host_request(
        self,
        request_type: str,
        args: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> Coroutine[Any, Any, Any]:
        """Send a raw host request (for request types without a helper); returns its result."""
        return self._client().request(request_type, args, timeout=timeout)


rlm = Rlm()
