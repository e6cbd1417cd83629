"""``prime-agent tree / branch / fork / clone / import`` as a user runs them: real processes, the
database opened by the CLI itself when no daemon runs, and through a running daemon otherwise;
an imported and forked session resumed with ``--resume ID -p`` against the scripted model."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from orchestrator.paths import Paths
from orchestrator.store.db import SessionRecord, Store
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, daemon_pids, wait_until, write_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "jsonl"
# A bound, not an expectation: a loaded machine takes seconds to start a daemon and a kernel.
TURN_TIMEOUT_S = 90.0
SCRIPT = """
repeat forever:
    when "remember 7": text: noted 7
    when "what number": text: it was 7
    else: text: ok
"""


def ok(args: list[str]) -> str:
    proc = cli(args)
    assert proc.returncode == 0, (args, proc.stderr)
    return proc.stdout


def tree_json(selector: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(ok(["tree", selector, "--json"]))
    return data


def structure(data: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(n["seq"], n["parent_seq"], n["type"], n["active"]) for n in data["nodes"]]


def observe(selector: str) -> dict[str, Any]:
    view: dict[str, Any] = json.loads(ok(["observe", selector, "--json"]))
    return view


def idle_after(selector: str, reply: str) -> bool:
    view = observe(selector)
    said = [e["payload"].get("text") for e in view["events"] if e["type"] == "assistant_message"]
    return view["session"]["status"] == "idle" and bool(said) and said[-1] == reply


def sessions() -> dict[str, SessionRecord]:
    async def read() -> dict[str, SessionRecord]:
        store = await Store.open(Paths.from_env().database_file, read_only=True)
        try:
            return {rec.id: rec for rec in await store.list_sessions()}
        finally:
            await store.close()

    return asyncio.run(read())


@pytest.fixture
def model() -> Any:
    with FakeModelServer(SCRIPT) as srv:
        write_config(f'[models."openai/fake"]\napi_base = "{srv.url}"\n')
        yield srv


def test_tree_commands_without_and_with_a_daemon(model: FakeModelServer, tmp_path: Path) -> None:
    # -- no daemon: the commands open the database themselves --------------------------------
    assert ok(["-p", "remember 7", "--model", "openai/fake"]) == "noted 7\n"
    listing = ok(["tree", "remember 7"]).splitlines()
    sid = listing[0].split()[0]
    assert listing[1].startswith("*") and "user_message  remember 7" in listing[1]
    assert listing[-1].endswith("← leaf") and all(line.startswith("*") for line in listing[1:])

    branched = ok(["branch", "remember 7", "1", "--summary", "said noted 7"])
    assert branched.startswith(f"{sid}: the leaf is now event ")
    drawn = ok(["tree", sid]).splitlines()[1:]
    assert any("├─" in line for line in drawn) and any("└─" in line for line in drawn)
    assert drawn[-1].startswith("* └─") and "branch_summary  said noted 7  ← leaf" in drawn[-1]

    forked = ok(["fork", sid, "2"]).strip()
    assert [n["seq"] for n in tree_json(forked)["nodes"]] == [1, 2]
    cloned = ok(["clone", sid]).strip()
    active = [n["type"] for n in tree_json(sid)["nodes"] if n["active"]]
    assert [n["type"] for n in tree_json(cloned)["nodes"]] == active

    exported = tmp_path / "session.jsonl"
    ok(["export", sid, "-o", str(exported)])
    imported = ok(["import", str(exported)]).strip()
    assert structure(tree_json(imported)) == structure(tree_json(sid))

    bad = tmp_path / "bad.jsonl"
    bad.write_text(exported.read_text().replace('"type": "message"', '"type": ', 1))
    before = len(sessions())
    refused = cli(["import", str(bad)])
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and f"{bad} line 2: not JSON" in refused.stderr
    assert len(sessions()) == before  # nothing imported

    fixture = ok(["import", str(FIXTURES / "v3_tree.jsonl"), "--model", "openai/fake"]).strip()
    # The file's four calls: in `usage`, marked imported (no budget counts them).
    assert "4 imported calls" in ok(["usage", fixture])
    rows = sessions()
    assert rows[fixture].status == "inactive" and rows[fixture].model == "openai/fake"
    assert rows[forked].forked_from == sid and rows[cloned].name == "remember 7 (clone)"
    assert daemon_pids() == []

    # -- a running daemon owns the database: the same commands go through it -----------------
    started = cli(["daemon", "start"])
    assert started.returncode == 0, started.stderr
    (pid,) = daemon_pids()
    # Seq 9 is the branch summary of the fixture's abandoned "Now double it." path.
    via = ok(["fork", "fixture v3", "9"]).strip()
    assert [n["seq"] for n in tree_json(via)["nodes"]] == [1, 2, 3, 4, 5, 6, 7]
    assert ok(["-p", "what number", "--resume", via]) == "it was 7\n"
    sent = [json.dumps(m) for m in model.requests[-1]["messages"]]
    text = "\n".join(sent)
    assert "What is 6*7?" in text and "It is 42." in text
    assert "the answer was 84" in text  # the branch summary
    assert "Now double it." not in text  # the abandoned path itself
    # A loaded, idle session: branching unloads it, and it reloads from the new leaf.
    assert ok(["send", via, "remember 7"]).startswith("delivered")
    assert wait_until(lambda: idle_after(via, "noted 7"), timeout=TURN_TIMEOUT_S)
    assert ok(["branch", via, "7"]).startswith(f"{via}: the leaf is now event 7")
    assert observe(via)["session"]["live"] is False
    assert ok(["-p", "what number", "--resume", via]) == "it was 7\n"
    last = "\n".join(json.dumps(m) for m in model.requests[-1]["messages"])
    assert "remember 7" not in last and "noted 7" not in last and "the answer was 84" in last
    imported_v2 = cli(["import", str(FIXTURES / "v2_tree.jsonl"), "--name", "plans"])
    assert imported_v2.returncode == 0, imported_v2.stderr
    v2 = imported_v2.stdout.strip()
    # Its directory is not here: said once, and kept for the export.
    assert imported_v2.stderr.count("prime-agent: notice: the file's directory ") == 1
    assert ok(["branch", "plans", "4"]).startswith(f"{v2}: the leaf is now event 4")
    assert daemon_pids() == [pid]
    stopped = cli(["daemon", "stop"])
    assert stopped.returncode == 0, stopped.stderr
    rows = sessions()
    assert rows[via].forked_from == fixture and rows[via].status == "inactive"
    assert rows[v2].cwd == os.getcwd()  # the file's directory does not exist here
