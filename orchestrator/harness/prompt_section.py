"""The Continual Harness section of the system prompt (docs/spec.md §6, docs/harness.md).

The system prompt is ``base | harness section | skills | environment facts``. The base text is
an immutable constant, so it is the cache-stable prefix: a harness write changes only what
follows it, and a provider's prompt cache for the base survives (a test compares the bytes).

Per kind the section lists the newest entries (at most ``ENTRIES_PER_KIND``), each cut to
``ENTRY_MAX_CHARS`` characters on one line, and says how many more there are; the full text is
one ``rlm.harness.get(kind, id)`` away. The text is deterministic for the same entries (same
order, same cuts), so rebuilding it without a change yields the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from orchestrator.store.harness_entry import KINDS, HarnessEntry

__all__ = ["ENTRIES_PER_KIND", "ENTRY_MAX_CHARS", "KIND_HEADINGS", "harness_section"]

ENTRIES_PER_KIND: Final = 6
ENTRY_MAX_CHARS: Final = 180
KIND_HEADINGS: Final[Mapping[str, str]] = {
    "prompt": "Notes on how to work (prompt)",
    "memory": "Memories (memory)",
    "skill": "Skills you wrote (skill)",
    "subagent": "Subagent roles (subagent)",
}
CUT: Final = "…"
HEADER: Final = (
    "# Continual Harness\n"
    "Supplemental state you keep for yourself with `rlm.harness` (create_/update_/delete_<kind>,"
    " list, get, history). Newest entries per kind; full text: `rlm.harness.get(kind, id)`."
)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _line(entry: HarnessEntry) -> str:
    where = "global" if entry.scope == "global" else "local"
    text = f"- [{where}:{entry.id}] {_one_line(entry.title)}: {_one_line(entry.content)}"
    if len(text) > ENTRY_MAX_CHARS:
        text = text[: ENTRY_MAX_CHARS - len(CUT)] + CUT
    return text


def harness_section(
    entries: Sequence[HarnessEntry], totals: Mapping[str, int] | None = None
) -> str:
    """The section for ``entries`` (live heads, each kind's newest first, as
    ``select_entries`` returns them); ``totals`` = live entries per kind when more exist than
    were passed. Empty string when there is nothing to show."""
    by_kind: dict[str, list[HarnessEntry]] = {kind: [] for kind in KINDS}
    for entry in entries:
        if entry.kind in by_kind and not entry.deleted:
            by_kind[entry.kind].append(entry)
    parts: list[str] = []
    for kind in KINDS:
        shown = sorted(by_kind[kind], key=lambda e: (e.updated_at, e.id), reverse=True)
        if not shown:
            continue
        lines = [_line(e) for e in shown[:ENTRIES_PER_KIND]]
        total = max(len(shown), (totals or {}).get(kind, 0))
        if total > len(lines):
            lines.append(f"- ({total - len(lines)} more: rlm.harness.list({kind!r}))")
        parts.append(f"## {KIND_HEADINGS[kind]}\n" + "\n".join(lines))
    if not parts:
        return ""
    return HEADER + "\n" + "\n".join(parts) + "\n"
