"""The in-kernel runtime API without NATS: argument checks, reply decoding, error mapping,
constants, reprs. A recording client stands in for the bus where a reply is needed."""

from __future__ import annotations

import json
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from orchestrator.runtime import LAZY_HELPERS, RUNTIME_NAMES, _LazyHelper, wire
from orchestrator.runtime.errors import (
    ERROR_CLASSES,
    BudgetExceeded,
    DepthLimitExceeded,
    HostError,
    HostTimeout,
    HostUnavailable,
    InternalHostError,
    InvalidArgument,
    McpTimeout,
    McpToolError,
    McpUnavailable,
    ModelUnavailable,
    NotFamily,
    NotFound,
    QueryBatchError,
    QuotaExceeded,
    RateLimited,
    UnknownRequest,
    error_from_reply,
)
from orchestrator.runtime.host import (
    HostClient,
    HostConfig,
    decode_reply,
    encode_request,
)
from orchestrator.runtime.messaging import (
    MAX_MESSAGE_BYTES,
    AgentFamily,
    AgentInfo,
    AgentMessage,
    AgentObserve,
    MessageReceipt,
    ObservedAgent,
    ObservedMessage,
)
from orchestrator.runtime.rlm import (
    MAX_NAME_CHARS,
    THINKING_LEVELS,
    Rlm,
    RLMModel,
    RLMSpawnHandle,
    RLMSubagent,
)

SID = "s-unit"


class RecordingClient(HostClient):
    """Records requests; answers from ``replies`` (type -> result or HostError)."""

    def __init__(self, replies: Mapping[str, Any] | None = None) -> None:
        super().__init__(environ={})
        self.replies = dict(replies or {})
        self.requests: list[tuple[str, dict[str, Any], float | None]] = []

    async def request(
        self,
        request_type: str,
        args: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        self.requests.append((request_type, dict(args or {}), timeout))
        reply = self.replies.get(request_type)
        if isinstance(reply, HostError):
            raise reply
        return reply


@pytest.fixture
def client() -> RecordingClient:
    return RecordingClient()


# --- constants --------------------------------------------------------------------------------


def test_every_wire_error_code_has_a_class() -> None:
    host_codes = set(ERROR_CLASSES) - {"timeout", "unavailable"}
    assert host_codes == set(wire.ERROR_CODES)
    for code, cls in ERROR_CLASSES.items():
        assert cls.default_code == code


def test_every_request_type_is_covered_by_a_helper() -> None:
    import inspect

    from orchestrator.runtime import (
        goal,
        harness,
        heartbeat,
        history,
        mcp,
        messaging,
        refine,
        rlm,
    )

    modules = (rlm, messaging, history, harness, refine, goal, heartbeat, mcp)
    source = "".join(inspect.getsource(module) for module in modules)
    for request_type in wire.REQUEST_TYPES:
        assert f'"{request_type}"' in source or request_type.split(".")[1] in source


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "cls", "builtin"),
    [
        ("invalid_argument", InvalidArgument, ValueError),
        ("unknown_request", UnknownRequest, RuntimeError),
        ("not_found", NotFound, LookupError),
        ("not_family", NotFamily, PermissionError),
        ("depth_limit", DepthLimitExceeded, RuntimeError),
        ("quota_exceeded", QuotaExceeded, RuntimeError),
        ("budget_exceeded", BudgetExceeded, RuntimeError),
        ("rate_limited", RateLimited, RuntimeError),
        ("model_unavailable", ModelUnavailable, RuntimeError),
        ("mcp_unavailable", McpUnavailable, RuntimeError),
        ("mcp_tool_error", McpToolError, RuntimeError),
        ("mcp_timeout", McpTimeout, TimeoutError),
        ("internal", InternalHostError, RuntimeError),
        ("timeout", HostTimeout, TimeoutError),
        ("unavailable", HostUnavailable, RuntimeError),
    ],
)
def test_error_codes_map_to_typed_exceptions(
    code: str, cls: type[HostError], builtin: type[Exception]
) -> None:
    exc = error_from_reply({"code": code, "message": "line one\nline two"})
    assert type(exc) is cls
    assert isinstance(exc, HostError) and isinstance(exc, RuntimeError)
    assert isinstance(exc, builtin)
    assert exc.code == code
    assert str(exc) == "line one line two"  # one line
    assert exc.retry_after is None


def test_retry_after_is_kept_and_shown() -> None:
    exc = error_from_reply({"code": "rate_limited", "message": "3 messages/s", "retry_after": 0.4})
    assert isinstance(exc, RateLimited)
    assert exc.retry_after == 0.4
    assert str(exc) == "3 messages/s (retry after 0.4 s)"
    said = error_from_reply({"code": "rate_limited", "message": "retry in 1 s", "retry_after": 1})
    assert str(said) == "retry in 1 s"  # not said twice


def test_unknown_and_malformed_errors() -> None:
    unknown = error_from_reply({"code": "new_code", "message": "something new"})
    assert type(unknown) is HostError and unknown.code == "new_code"
    assert isinstance(error_from_reply("nope"), InternalHostError)
    assert isinstance(error_from_reply({"message": "no code"}), InternalHostError)
    bad_retry = error_from_reply({"code": "rate_limited", "message": "m", "retry_after": "soon"})
    assert bad_retry.retry_after is None


def test_errors_pickle_with_code_and_retry_after() -> None:
    exc = error_from_reply({"code": "not_family", "message": "no", "retry_after": 2})
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is NotFamily and back.code == "not_family" and back.retry_after == 2
    assert str(back) == str(exc)
    batch = QueryBatchError("1 failed", code="internal", results=["a", exc])
    back_batch = pickle.loads(pickle.dumps(batch))
    assert back_batch.results[0] == "a" and isinstance(back_batch.errors[0], NotFamily)


def test_render_traceback_hides_runtime_frames() -> None:
    def user_code() -> None:
        decode_reply(b'{"ok": false, "error": {"code": "not_found", "message": "no w9"}}', "t")

    with pytest.raises(NotFound) as info:
        user_code()
    lines = info.value._render_traceback_()
    assert lines[-1] == "NotFound: no w9"
    text = "\n".join(lines)
    assert "user_code" in text
    assert "host.py" not in text and "errors.py" not in text


# --- wire encoding ----------------------------------------------------------------------------


def test_encode_request_shape_and_limits() -> None:
    body = json.loads(encode_request("rlm.run", {"prompt": "é"}))
    assert body == {"v": 1, "type": "rlm.run", "args": {"prompt": "é"}}
    with pytest.raises(InvalidArgument, match="plain JSON"):
        encode_request("rlm.run", {"prompt": object()})
    with pytest.raises(InvalidArgument, match="limit"):
        encode_request("rlm.query", {"prompt": "x" * (wire.MAX_REQUEST_BYTES + 1)})
    with pytest.raises(InvalidArgument):
        encode_request("", {})
    with pytest.raises(TypeError, match="args must be a dict"):
        encode_request("rlm.run", ["prompt"])  # type: ignore[arg-type]


def test_decode_reply() -> None:
    assert decode_reply(b'{"ok": true, "result": {"a": 1}}', "t") == {"a": 1}
    assert decode_reply(b'{"ok": true}', "t") is None
    with pytest.raises(QuotaExceeded, match="32 live children"):
        decode_reply(
            b'{"ok": false, "error": {"code": "quota_exceeded", "message": "32 live children"}}',
            "rlm.run",
        )
    for bad in (b"not json", b"[1]", b'{"result": 1}', b"\xff"):
        with pytest.raises(InternalHostError):
            decode_reply(bad, "t")


def test_config_from_env() -> None:
    with pytest.raises(HostUnavailable, match="not connected to an orchestrator"):
        HostConfig.from_env({})
    with pytest.raises(HostUnavailable, match=wire.ENV_SESSION_ID):
        HostConfig.from_env({wire.ENV_NATS_URL: "nats://127.0.0.1:1"})
    config = HostConfig.from_env(
        {
            wire.ENV_NATS_URL: "nats://127.0.0.1:1",
            wire.ENV_SESSION_ID: SID,
            wire.ENV_NATS_USER: "u",
            wire.ENV_NATS_PASSWORD: "secret-pw",
            wire.ENV_REQUEST_TIMEOUT_S: "2.5",
        }
    )
    assert config.subject == f"pa.host.{SID}"
    assert config.inbox_prefix == f"_INBOX.{SID}"
    assert config.timeout_s == 2.5
    assert "secret-pw" not in repr(config)
    for raw in ("", "x", "-1", "0"):
        env = {wire.ENV_NATS_URL: "u", wire.ENV_SESSION_ID: SID, wire.ENV_REQUEST_TIMEOUT_S: raw}
        assert HostConfig.from_env(env).timeout_s == wire.HOST_REQUEST_TIMEOUT_S


def test_config_reads_the_nats_credentials_a_directory_holds(tmp_path: Path) -> None:
    """A pod's Secret: the credentials as files, named by wire.NATS_CREDENTIAL_FILES; a
    variable that is set wins over its file; a file that is absent is no credential."""
    (tmp_path / "nats-user").write_text("u-from-file\n")
    (tmp_path / "nats-password").write_text("pw-from-file")
    base = {
        wire.ENV_NATS_URL: "nats://nats:4222",
        wire.ENV_SESSION_ID: SID,
        wire.ENV_NATS_CREDENTIALS_DIR: str(tmp_path),
    }
    config = HostConfig.from_env(base)
    assert (config.user, config.password) == ("u-from-file", "pw-from-file")
    assert config.jwt is None and config.nkey_seed is None
    assert config.auth_options() == {"user": "u-from-file", "password": "pw-from-file"}
    sent = HostConfig.from_env({**base, wire.ENV_NATS_PASSWORD: "pw-from-env"})
    assert (sent.user, sent.password) == ("u-from-file", "pw-from-env")
    (tmp_path / "nats-jwt").write_text("eyJ0eXAiOiJKV1QifQ.e30.sig")
    (tmp_path / "nats-seed").write_text("SUAEXAMPLESEED")
    jwt = HostConfig.from_env(base)
    assert (jwt.jwt, jwt.nkey_seed) == ("eyJ0eXAiOiJKV1QifQ.e30.sig", "SUAEXAMPLESEED")
    (tmp_path / "nats-seed").unlink()
    (tmp_path / "nats-seed").mkdir()  # unreadable as a file: one line, no traceback text
    with pytest.raises(HostUnavailable, match="cannot read the NATS credential nats-seed"):
        HostConfig.from_env(base)


async def test_request_without_env_is_host_unavailable() -> None:
    with pytest.raises(HostUnavailable, match="not connected to an orchestrator"):
        await HostClient(environ={}).request("rlm.list_subagents", {})


async def test_request_rejects_a_bad_timeout() -> None:
    with pytest.raises(InvalidArgument, match="timeout"):
        await HostClient(environ={}).request("rlm.list_subagents", {}, timeout=0)


# --- argument validation (no request, no connection) -----------------------------------------


def test_unknown_kwargs_are_type_errors_listing_the_allowed_ones(client: RecordingClient) -> None:
    rlm = Rlm(client)
    with pytest.raises(TypeError, match=r"nme.*allowed: name, model, thinking, budget"):
        rlm("do x", nme="w1")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unsupported keyword"):
        rlm.run("do x", temperature=0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="allowed: receiver_role, receiver_name, mode"):
        AgentMessage(client).send("hi", sender="me")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        AgentObserve(client).recent("w1", lines=3)  # type: ignore[call-arg]
    assert client.requests == []


def test_unknown_kwargs_fail_before_any_connection() -> None:
    # The real default client with no env: the TypeError wins over HostUnavailable because it
    # is raised at call time, before a coroutine exists.
    from orchestrator.runtime.rlm import rlm

    with pytest.raises(TypeError):
        rlm("do x", nme="w1")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"prompt": ""}, InvalidArgument, "prompt is empty"),
        ({"prompt": "  \n"}, InvalidArgument, "prompt is empty"),
        ({"prompt": 3}, TypeError, "prompt must be a str"),
        ({"prompt": "p", "name": ""}, InvalidArgument, "name is empty"),
        ({"prompt": "p", "name": "x" * (MAX_NAME_CHARS + 1)}, InvalidArgument, "limit is 64"),
        ({"prompt": "p", "name": "a\x00b"}, InvalidArgument, "control character"),
        ({"prompt": "p", "name": "a\nb"}, InvalidArgument, "control character"),
        ({"prompt": "p", "name": 7}, TypeError, "name must be a str"),
        ({"prompt": "p", "thinking": "extreme"}, InvalidArgument, "thinking must be one of"),
        ({"prompt": "p", "thinking": 1}, TypeError, "thinking must be a str"),
        ({"prompt": "p", "budget": 0}, InvalidArgument, "at least 1"),
        ({"prompt": "p", "budget": True}, TypeError, "budget must be an int"),
        ({"prompt": "p", "budget": 1.5}, TypeError, "budget must be an int"),
        ({"prompt": "p", "model": " "}, InvalidArgument, "model is empty"),
    ],
)
def test_rlm_run_validation(
    client: RecordingClient, kwargs: dict[str, Any], exc: type[Exception], match: str
) -> None:
    prompt = kwargs.pop("prompt")
    with pytest.raises(exc, match=match):
        Rlm(client)(prompt, **kwargs)
    assert client.requests == []


async def test_rlm_run_sends_trimmed_args_and_returns_a_handle() -> None:
    child = {"rlm_child_id": "sub-1", "name": "w1", "session_id": "s-c1", "model": "p/m"}
    client = RecordingClient({"rlm.run": child})
    rlm = Rlm(client)
    handle = await rlm("do x", name="  w1 ", thinking="HIGH", budget=500)
    assert handle == RLMSpawnHandle("sub-1", "w1", "s-c1", "p/m")
    assert client.requests == [
        ("rlm.run", {"prompt": "do x", "name": "w1", "thinking": "high", "budget": 500}, None)
    ]
    assert await rlm.run("do y") == handle
    assert client.requests[-1][1] == {"prompt": "do y"}  # None values are left out
    assert repr(handle) == (
        "RLMSpawnHandle(rlm_child_id='sub-1', name='w1', session_id='s-c1', model='p/m')"
    )
    assert set(THINKING_LEVELS) == {"off", "minimal", "low", "medium", "high", "xhigh", "max"}


async def test_malformed_results_are_internal_errors() -> None:
    client = RecordingClient({"rlm.run": {"name": "w1"}, "rlm.list_subagents": {"x": 1}})
    with pytest.raises(InternalHostError, match="rlm_child_id"):
        await Rlm(client)("p")
    with pytest.raises(InternalHostError, match="subagents"):
        await Rlm(client).list_subagents()


async def test_list_delete_and_find_models() -> None:
    entry = {
        "rlm_child_id": "sub-1",
        "name": "w1",
        "session_id": "s-c1",
        "status": "idle",
        "usage": {"input_tokens": 10},
        "extra": "ignored",
    }
    model = {"provider": "openai", "id": "gpt-x", "name": "GPT X", "selector": "openai/gpt-x"}
    client = RecordingClient(
        {
            "rlm.list_subagents": {"subagents": [entry]},
            "rlm.delete_subagent": {**entry, "status": "deleted"},
            "rlm.find_models": {"models": [model]},
        }
    )
    rlm = Rlm(client)
    (sub,) = await rlm.list_subagents()
    assert sub == RLMSubagent("sub-1", "w1", "s-c1", "idle", None, {"input_tokens": 10})
    handle = RLMSpawnHandle("sub-1", "w1", "s-c1")
    for target in (handle, sub, "sub-1", " w1 "):
        deleted = await rlm.delete_subagent(target)
        assert deleted.status == "deleted"
    assert [args["target"] for _, args, _ in client.requests[1:]] == [
        "sub-1",
        "sub-1",
        "sub-1",
        "w1",
    ]
    with pytest.raises(TypeError, match="handle"):
        rlm.delete_subagent(3)  # type: ignore[arg-type]
    assert await rlm.find_models("gpt") == [RLMModel("openai", "gpt-x", "GPT X", "openai/gpt-x")]
    assert client.requests[-1][1] == {"query": "gpt", "limit": 8}
    for bad in (0, 21):
        with pytest.raises(InvalidArgument, match="between 1 and 20"):
            rlm.find_models(limit=bad)
    with pytest.raises(TypeError):
        rlm.find_models(query=None)  # type: ignore[arg-type]


async def test_query_and_query_batched() -> None:
    failure = {"ok": False, "error": {"code": "model_unavailable", "message": "no key"}}
    client = RecordingClient(
        {
            "rlm.query": {"text": "42"},
            "rlm.query_batched": {"results": [{"ok": True, "text": "a"}, failure]},
        }
    )
    rlm = Rlm(client)
    assert await rlm.query("6*7?") == "42"
    assert client.requests[-1] == ("rlm.query", {"prompt": "6*7?"}, 300.0)
    assert await rlm.query("q", model="p/m", timeout=5) == "42"
    assert client.requests[-1] == ("rlm.query", {"prompt": "q", "model": "p/m"}, 5.0)

    with pytest.raises(QueryBatchError) as info:
        await rlm.query_batched(["a?", "b?"])
    assert info.value.code == "model_unavailable"
    assert "1 of 2 prompts failed" in str(info.value)
    assert info.value.results[0] == "a"
    assert isinstance(info.value.results[1], ModelUnavailable)
    mixed = await rlm.query_batched(["a?", "b?"], return_exceptions=True)
    assert mixed[0] == "a" and isinstance(mixed[1], ModelUnavailable)

    for bad, exc in (("just one", TypeError), ([], InvalidArgument), (["ok", ""], InvalidArgument)):
        with pytest.raises(exc):
            rlm.query_batched(bad)
    with pytest.raises(InvalidArgument, match="timeout"):
        rlm.query("q", timeout=-1)


async def test_query_batched_count_mismatch_is_internal() -> None:
    client = RecordingClient({"rlm.query_batched": {"results": [{"ok": True, "text": "a"}]}})
    with pytest.raises(InternalHostError, match="1 results for 2 prompts"):
        await Rlm(client).query_batched(["a", "b"])


# --- messaging --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "match"),
    [
        (("",), {}, InvalidArgument, "message is empty"),
        ((b"bytes",), {}, TypeError, "message must be a str"),
        (("x" * (MAX_MESSAGE_BYTES + 1),), {}, InvalidArgument, "16384"),
        (("é" * (MAX_MESSAGE_BYTES // 2 + 1),), {}, InvalidArgument, "bytes"),
        (("hi",), {"receiver_role": "cousin"}, InvalidArgument, "receiver_role must be one of"),
        (("hi",), {"receiver_role": "sibling"}, TypeError, "receiver_name is required"),
        (("hi",), {"receiver_role": "child"}, TypeError, "receiver_name is required"),
        (("hi",), {"receiver_name": "root"}, TypeError, "not allowed with receiver_role='parent'"),
        (("hi",), {"mode": "later"}, InvalidArgument, "mode must be one of"),
        (("hi", "sibling", "x" * 65), {}, InvalidArgument, "limit is 64"),
    ],
)
def test_send_validation(
    client: RecordingClient,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    exc: type[Exception],
    match: str,
) -> None:
    with pytest.raises(exc, match=match):
        AgentMessage(client).send(*args, **kwargs)
    assert client.requests == []


async def test_send_has_no_sender_field_and_returns_a_receipt() -> None:
    receipt = {"id": "m-1", "status": "queued", "target": "w2", "at": "2026-01-01T00:00:00Z"}
    client = RecordingClient({"agent_message.send": receipt})
    message = AgentMessage(client)
    assert await message.send("exactly " + "x" * (MAX_MESSAGE_BYTES - 8)) == MessageReceipt(
        "m-1", "queued", "w2", "2026-01-01T00:00:00Z"
    )
    await message.send("hi", receiver_role="sibling", receiver_name=" w2 ", mode="follow_up")
    sent = client.requests[-1][1]
    assert sent == {
        "message": "hi",
        "receiver_role": "sibling",
        "receiver_name": "w2",
        "mode": "follow_up",
    }
    assert all("sender" not in args and "from" not in args for _, args, _ in client.requests)


async def test_list_agents_family_and_repr() -> None:
    member = {"name": "w2", "session_id": "s-2", "status": "idle"}
    client = RecordingClient(
        {
            "agent_message.list_agents": {
                "self": {"name": "w1", "session_id": "s-1", "status": "running", "depth": 1},
                "parent": {"name": "root", "session_id": "s-0", "status": "idle", "depth": 0},
                "siblings": [member],
                "children": [],
            }
        }
    )
    family = await AgentMessage(client).list_agents()
    assert family.self == AgentInfo("w1", "s-1", "running", 1)
    assert family.parent is not None and family.parent.name == "root"
    assert family.siblings == [AgentInfo("w2", "s-2", "idle")]
    assert repr(family).splitlines() == [
        "AgentFamily(",
        "  self:     w1 (s-1, running)",
        "  parent:   root (s-0, idle)",
        "  siblings: w2 (s-2, idle)",
        "  children: (none)",
        ")",
    ]
    root = AgentFamily(self=AgentInfo("r", "s-r", "running"), parent=None)
    assert "(none: root session)" in repr(root)


async def test_observe() -> None:
    view = {"name": "w2", "session_id": "s-2", "relationship": "sibling", "status": "running"}
    client = RecordingClient(
        {
            "agent_observe.list": {"agents": [view]},
            "agent_observe.get": {**view, "streaming": True, "message_count": 4},
            "agent_observe.recent": {"messages": [{"role": "assistant", "text": "done", "seq": 3}]},
        }
    )
    observe = AgentObserve(client)
    (listed,) = await observe.list()
    assert listed == ObservedAgent("w2", "s-2", "sibling", "running")
    got = await observe.get(listed)
    assert got.streaming and got.message_count == 4
    assert client.requests[-1][1] == {"target": "s-2"}
    assert await observe.recent("w2") == [ObservedMessage("assistant", "done", None, 3)]
    assert client.requests[-1][1] == {"target": "w2", "limit": 8, "max_chars": 800}
    for kwargs in ({"limit": 0}, {"limit": -1}, {"max_chars": 0}):
        with pytest.raises(InvalidArgument, match="at least 1"):
            observe.recent("w2", **kwargs)
    with pytest.raises(TypeError):
        observe.recent("w2", limit="8")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        observe.get(5)  # type: ignore[arg-type]


# --- namespace --------------------------------------------------------------------------------


def test_reprs_say_how_to_call() -> None:
    assert "await rlm(prompt" in repr(Rlm())
    assert "receiver_role" in repr(AgentMessage())
    assert "recent(target" in repr(AgentObserve())


def test_lazy_helpers_swap_in_the_real_object() -> None:
    assert set(LAZY_HELPERS) <= set(RUNTIME_NAMES)
    user_ns: dict[str, Any] = {}
    hidden: dict[str, Any] = {}
    for name, (module, attr) in LAZY_HELPERS.items():
        user_ns[name] = hidden[name] = _LazyHelper(name, module, attr, (user_ns, hidden))
    stand_in = user_ns["agent_message"]
    assert "receiver_role" in repr(stand_in)
    assert isinstance(user_ns["agent_message"], AgentMessage)
    assert hidden["agent_message"] is user_ns["agent_message"]
    assert isinstance(user_ns["rlm"], _LazyHelper)  # untouched until used
    assert "spawns a subagent" in (user_ns["rlm"].__doc__ or "")
    assert isinstance(user_ns["rlm"], Rlm)
    assert stand_in.send is not None  # an old reference keeps working
    # A stand-in pickles (namespace snapshots) as the real object, not its namespaces.
    assert isinstance(pickle.loads(pickle.dumps(stand_in)), AgentMessage)
