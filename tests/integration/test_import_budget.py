"""An imported session's calls were another installation's (issue 20, item 4): loading it
counts none of its imported usage rows against its budget, while ``usage`` shows them."""

from __future__ import annotations

from pathlib import Path

from orchestrator.models.registry import ResolvedModel, resolve_model
from orchestrator.paths import Paths
from orchestrator.sandbox.local import LocalBackend
from orchestrator.sessions.manager import Orchestrator
from orchestrator.store.db import Store
from orchestrator.store.jsonl_import import ImportOptions, import_session_jsonl
from orchestrator.store.jsonl_parse import read_session_file
from tests.integration.test_family import FAST

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "jsonl" / "v3_tree.jsonl"
BUDGET = 1000


async def test_imported_calls_are_shown_and_never_spend_the_budget(tmp_path: Path) -> None:
    paths = Paths.from_env()

    async def resolve(selector: str) -> ResolvedModel:
        return resolve_model(selector, FAST, api_base="http://127.0.0.1:9", env={})

    async with await Store.open(paths.database_file) as store:
        options = ImportOptions(model="openai/fake", fallback_cwd=str(tmp_path))
        result = await import_session_jsonl(store, read_session_file(FIXTURE), options)
        sid = result.session.id
        await store.update_session(sid, budget_tokens=BUDGET)
        (shown,) = await store.usage_summary([sid])
        assert shown.imported_calls == shown.calls > 0 and shown.input + shown.output > 0
        orch = Orchestrator(
            store=store,
            backend=LocalBackend(pool_size=0),
            settings=FAST,
            paths=paths,
            resolve=resolve,
        )
        try:
            await orch.load_session_id(sid)
            assert orch.budgets.available(sid) == BUDGET
        finally:
            await orch.close()
