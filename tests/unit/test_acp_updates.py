"""ACP mode's pure parts: our events as session/update payloads (cell titles and fences made
safe for untrusted source) and --provider resolved against Prime Agent's models.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli.acp_updates import (
    CELL_TITLE_MAX_CHARS,
    GATE_NOT_RERUN,
    META_NAMESPACE,
    GateTally,
    cell_content,
    cell_title,
    updates_for_event,
)
from orchestrator.cli.coding_agent_models import CODING_AGENT_DIR_ENV, resolve_provider_model
from orchestrator.errors import UserError


@pytest.mark.parametrize(
    ("code", "title"),
    [
        ("print(1)", "print(1)"),
        ("\n\n  x = 1\ny = 2\n", "x = 1 · +1 lines"),
        ("%%bash\nls -la\n", "%%bash · ls -la · +1 lines"),
        ("evil\u202eright-to-left\u0007()", "evilright-to-left()"),
        ("   \n", "IPython cell"),
        ("a" * 300, "a" * (CELL_TITLE_MAX_CHARS - 1) + "…"),
    ],
)
def test_a_cell_title_is_one_safe_line(code: str, title: str) -> None:
    assert cell_title(code) == title


def test_the_fence_outruns_every_backtick_run_in_the_source() -> None:
    code = "s = '````'\nprint(s)"
    text = cell_content(code)["content"]["text"]
    assert text.startswith("`````python\n") and text.endswith("\n`````")
    assert cell_content("x")["content"]["text"] == "```python\nx\n```"


def test_a_cell_and_its_result_become_a_tool_call_and_its_update() -> None:
    cells: dict[str, str] = {}
    message = {
        "type": "assistant_message",
        "payload": {
            "text": "Let me look.",
            "tool_calls": [{"id": "c1", "name": "ipython", "arguments": '{"code": "1/0"}'}],
        },
    }
    said, call = updates_for_event(message, cells)
    assert said == {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": "Let me look."},
    }
    assert (call["toolCallId"], call["kind"], call["rawInput"]) == (
        "c1",
        "execute",
        {"code": "1/0"},
    )
    result = {
        "type": "tool_result",
        "payload": {"tool_call_id": "c1", "text": "ZeroDivisionError", "is_error": True},
    }
    (update,) = updates_for_event(result, cells)
    assert update["status"] == "failed"
    assert [c["content"]["text"] for c in update["content"]] == [
        "```python\n1/0\n```",
        "ZeroDivisionError",
    ]
    assert cells == {}
    # Malformed arguments are shown as they came, not dropped.
    bad = {
        "type": "assistant_message",
        "payload": {"tool_calls": [{"id": "c2", "name": "ipython", "arguments": "{"}]},
    }
    (odd,) = updates_for_event(bad, cells)
    assert (odd["title"], odd["rawInput"]) == ("ipython", "{")
    compaction = {"type": "compaction", "payload": {"summary": "s", "tokens_before": 9}}
    (info,) = updates_for_event(compaction, cells)
    assert info["_meta"][META_NAMESPACE]["compaction"] == {"tokensBefore": 9, "summary": "s"}


def test_a_replys_thinking_is_a_thought_chunk_before_what_it_said() -> None:
    message = {
        "type": "assistant_message",
        "payload": {"text": "42.", "thinking": "Six sevens.", "tool_calls": []},
    }
    thought, said = updates_for_event(message, {})
    assert thought == {
        "sessionUpdate": "agent_thought_chunk",
        "content": {"type": "text", "text": "Six sevens."},
    }
    assert said["sessionUpdate"] == "agent_message_chunk"


def test_a_provider_of_models_json_is_an_openai_compatible_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CODING_AGENT_DIR_ENV, str(tmp_path))
    (tmp_path / "models.json").write_text(
        json.dumps(
            {
                "providers": {
                    "local": {
                        "baseUrl": "http://127.0.0.1:9/v1",
                        "api": "openai-completions",
                        "apiKey": "LOCAL_KEY",
                    },
                    "odd": {"baseUrl": "http://x", "api": "anthropic-messages"},
                }
            }
        )
    )
    with pytest.raises(UserError, match="LOCAL_KEY is not set"):
        resolve_provider_model("local", "qwen")
    monkeypatch.setenv("LOCAL_KEY", "k-123")
    chosen = resolve_provider_model("local", "qwen")
    assert (chosen.model, chosen.api_base, chosen.api_key_env) == (
        "openai/qwen",
        "http://127.0.0.1:9/v1",
        "LOCAL_KEY",
    )
    assert chosen.client_env == {"LOCAL_KEY": "k-123"}
    with pytest.raises(UserError, match="not supported"):
        resolve_provider_model("odd", "m")
    with pytest.raises(UserError, match="providers: local, odd"):
        resolve_provider_model("nobody", "m")


def test_the_autonomous_meta_counts_gate_attempts_as_prime_agent_does() -> None:
    tally = GateTally()
    state = {"turns": 3, "tokens": 900, "continuations": 2}
    assert tally.meta(state) == {
        "enabled": True,
        "continuationsUsed": 2,
        "turnsUsed": 3,
        "tokensUsed": 900,
    }
    tally.record({"command": "pytest", "passed": False, "exit_code": 1, "attempt": 1})
    assert (tally.meta(state)["gateAttempt"], tally.meta(state)["gateFailure"]) == (1, "exited 1")
    tally.record({"command": "pytest", "passed": False, "skipped": True, "attempt": 2})
    assert tally.meta(state)["gateFailure"] == GATE_NOT_RERUN
    tally.record({"command": "lint", "passed": False, "timed_out": True, "attempt": 1})
    assert (tally.meta(state)["gateAttempt"], tally.meta(state)["gateFailure"]) == (2, "timed out")
    # A pass resets that gate's attempts and clears its failure.
    tally.record({"command": "lint", "passed": True, "attempt": 2})
    tally.record({"command": "pytest", "passed": True, "attempt": 3})
    assert "gateAttempt" not in tally.meta(state) and "gateFailure" not in tally.meta(state)
