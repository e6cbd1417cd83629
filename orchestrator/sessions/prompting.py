"""Each session's system prompt: base | Continual Harness | skills | environment facts.

The loop asks for its prompt at the start of every turn (``AgentLoop.refresh_prompt``), so a
harness write, a refinement or a model switch shows from the next turn on and never changes a
turn's prompt in the middle of it. Rebuilding costs one small query only after a change: the
builder keeps a generation number per harness owner (bumped by ``changed``) and reuses the
last prompt of a session while the generations it was built from, its model and its skills
are the same. The base text comes first and never changes (``agent/prompts.py``), so the
provider's prompt cache for it survives any harness write (docs/harness.md).

Skills are discovered once per working directory (``harness/skills.py``); a session started
after a new skill was installed sees it, a running one keeps its list (its sandbox's import
path was fixed at start).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import duckdb

from orchestrator.agent.prompts import EnvironmentFacts, build_system_prompt, mcp_prompt_section
from orchestrator.harness.prompt_section import ENTRIES_PER_KIND, harness_section
from orchestrator.harness.skills import (
    SkillDiscovery,
    discover_in,
    discover_skills,
    skills_prompt_section,
)
from orchestrator.mcp.hub import McpHub
from orchestrator.paths import Paths
from orchestrator.sessions.live import LiveSession
from orchestrator.settings import Settings
from orchestrator.store import harness as harness_store
from orchestrator.store.db import Store
from orchestrator.store.harness_entry import GLOBAL_OWNER, HarnessEntry
from orchestrator.store.queries import SessionRecord
from orchestrator.store.sessions_with_rows import SessionsWithRows, distinct_sessions_query

__all__ = ["SECTION_SEPARATOR", "PromptBuilder", "run_prompts"]

log = logging.getLogger(__name__)

SECTION_SEPARATOR: Final = "\n"


@dataclass(frozen=True)
class _Built:
    key: tuple[Any, ...]
    prompt: str


def run_prompts(record: SessionRecord) -> tuple[str | None, str | None]:
    """The system prompt a root's run gave it (``--system-prompt``) and what it appends
    (``--append-system-prompt``); (None, None) for a subagent, which keeps its own."""
    chosen = record.run_settings
    if chosen is None or record.parent_id is not None:
        return None, None
    return chosen.system_prompt, chosen.append_system_prompt


def run_skill_paths(record: SessionRecord) -> tuple[str, ...]:
    """The skills its run added (``--skill PATH``): the whole family sees them."""
    chosen = record.run_settings
    return tuple(chosen.skill_paths or ()) if chosen is not None else ()


def _read_harness(
    con: duckdb.DuckDBPyConnection, owners: Sequence[str]
) -> tuple[list[HarnessEntry], dict[str, int]]:
    entries = harness_store.select_entries(con, owners, limit_per_kind=ENTRIES_PER_KIND)
    return entries, harness_store.count_entries(con, owners)


class PromptBuilder:
    def __init__(self, store: Store, paths: Paths, settings: Settings, mcp: McpHub | None = None):
        self.mcp = mcp
        self.store = store
        self.paths = paths
        self.settings = settings
        self._generation: defaultdict[str, int] = defaultdict(int)
        self._built: dict[str, _Built] = {}
        self._skills: dict[tuple[str, tuple[str, ...]], SkillDiscovery] = {}
        # Owners with harness entries: a new tree without any (most sessions of a sweep) builds
        # its first prompt without a read. Kept by ``changed``, which every writer calls.
        self._owners = SessionsWithRows(store, distinct_sessions_query("harness_entries", "owner"))

    def changed(self, owner: str) -> None:
        """A harness entry of ``owner`` (a root session id, or "global") changed."""
        self._owners.add(owner)
        self._generation[owner] += 1

    def forget(self, session_id: str) -> None:
        self._built.pop(session_id, None)

    def skills(self, cwd: str, added: tuple[str, ...] = ()) -> SkillDiscovery:
        """The skills a session in ``cwd`` sees, with those its run ``added`` (``--skill``,
        after the project's and the user's; loaded even with ``[harness] skills`` off, as
        the user asked for them by name). Discovered once per directory and additions."""
        key = (cwd, added)
        found = self._skills.get(key)
        if found is None:
            extra = [Path(path) for path in added]
            if self.settings.harness.skills:
                found = discover_skills(Path(cwd), paths=self.paths, extra_dirs=extra)
            elif extra:
                found = discover_in(extra)
            else:
                found = SkillDiscovery(skills=(), warnings=())
            for warning in found.warnings:
                log.warning("skills: %s", warning)
            self._skills[key] = found
        return found

    def skill_dirs(self, cwd: str, added: tuple[str, ...] = ()) -> tuple[Path, ...]:
        """Directories of the Python-backed skills to put on a sandbox's import path."""
        return self.skills(cwd, added).python_dirs()

    async def _mcp_servers(self, owner: str) -> list[dict[str, Any]]:
        """The MCP servers a family sees, each with its state and catalog (waiting, once,
        for servers still starting)."""
        if self.mcp is None:
            return []
        servers = self.mcp.servers(owner)
        if not servers:
            return []
        await self.mcp.wait_started(owner)
        out = []
        for server in servers.values():
            status = server.status()
            out.append(
                {"name": server.name, "state": status.state, "restarts": status.restarts}
                | server.catalog
            )
        return out

    async def build(self, live: LiveSession) -> str:
        rec = live.record
        owners = (GLOBAL_OWNER, rec.root_id)
        mcp = await self._mcp_servers(rec.root_id)
        key = (
            tuple(self._generation[o] for o in owners),
            tuple(
                (s["name"], s["state"], s["restarts"], tuple(t["name"] for t in s["tools"]))
                for s in mcp
            ),
            live.model.selector,
            live.model.tool_protocol,
            rec.cwd,
            rec.backend,
        )
        built = self._built.get(live.id)
        if built is not None and built.key == key:
            return built.prompt
        entries: list[HarnessEntry] = []
        totals: dict[str, int] = {}
        present = [owner for owner in owners if await self._owners.may_have(owner)]
        if present:
            # harness_entries only: a side read, which leaves the step's rows in the log.
            entries, totals = await self.store.read_side(lambda con: _read_harness(con, present))
        skills = skills_prompt_section(self.skills(rec.cwd, run_skill_paths(rec)).skills)
        base, appended = run_prompts(rec)
        prompt = build_system_prompt(
            EnvironmentFacts(cwd=rec.cwd, model=live.model.selector, backend=rec.backend),
            tool_protocol=live.model.tool_protocol,
            harness_section=SECTION_SEPARATOR.join(
                part for part in (harness_section(entries, totals), skills) if part
            ),
            mcp_section=mcp_prompt_section(mcp),
            base=base,
            appended=appended,
        )
        self._built[live.id] = _Built(key, prompt)
        return prompt
