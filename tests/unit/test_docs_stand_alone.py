"""The repository explains itself (issue 17, item 6; docs/architecture.md, "Tests").

- No tracked file cites a document that lives outside the repository: the starting design,
  behaviour and reliability notes now live in ``docs/design.md``, ``docs/spec.md`` and
  ``docs/reliability.md``.
- Every R-number cited in the code, the tests or the docs is defined in ``docs/reliability.md``
  under its own heading, once.
- Every ``docs/*.md`` a tracked file names exists, and a cited section of it (``docs/spec.md
  §3``, ``docs/design.md, "State and storage"``) is one of its headings (or bold run-in heads).

Each checker is a plain function over ``(path, text)`` pairs, and each is first shown to catch
a planted fault, so none of these tests can pass by finding nothing to look at.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
RELIABILITY_DOC: Final = "docs/reliability.md"
SPEC_DOC: Final = "docs/spec.md"

# Citations of files that are not in the repository.
OUTSIDE_REFERENCE: Final = re.compile(
    r"\b(?:SPEC|DESIGN|RELIABILITY)\.md\b"
    r"|\.\./shared\b|/work/shared\b|shared/reference\b"
    r"|stack-notes|prime-agent-inventory|\binventory\.md\b|\binventory §"
)
# This file spells those patterns out, and plants faults of every kind below: it is the one
# tracked file none of the checks reads.
ALLOWED: Final = frozenset({"tests/unit/test_docs_stand_alone.py"})
# Files other helpers were editing while the references were replaced (issue 16, bubblewrap
# backend). They still cite files outside the repository; the lead replaces those citations
# after merging and then EMPTIES THIS SET. A path ending in "/" covers everything below it.
# Known today: orchestrator/sandbox/gateway.py and gateway_main.py (stack-notes §2, the Kernel
# Gateway's lifecycle facts), orchestrator/sandbox/reattach.py (SPEC §4) and
# orchestrator/sessions/runner.py (SPEC, print mode).
PENDING: Final[frozenset[str]] = frozenset()

# Only text of these kinds is scanned for R-numbers and doc links (a binary or a data file
# could hold "R1" by chance).
TEXT_SUFFIXES: Final = (".py", ".md", ".sql", ".toml", ".sh", ".yaml", ".yml", ".cfg", ".ini")
TEXT_NAMES: Final = frozenset({"Makefile", "Dockerfile", "run"})
R_CITATION: Final = re.compile(r"\bR([1-9][0-9]?)\b")
R_DEFINITION: Final = re.compile(r"^### R([1-9][0-9]?) \S", re.MULTILINE)
DOC_LINK: Final = re.compile(r"\bdocs/([A-Za-z0-9_-]+\.md)")
# `docs/x.md`, "Section"   and   docs/spec.md §3
DOC_SECTION: Final = re.compile(r'\bdocs/([A-Za-z0-9_-]+\.md)`?, *"([^"\n]+)"')
SPEC_SECTION: Final = re.compile(r"\bdocs/spec\.md`? §([0-9]+)")
HEADING: Final = re.compile(r"^#{1,6} +(.+)$|^\*\*(.+?)\*\*", re.MULTILINE)


def is_pending(path: str, pending: Iterable[str] = PENDING) -> bool:
    return any(path == p or (p.endswith("/") and path.startswith(p)) for p in pending)


def outside_references(
    files: Iterable[tuple[str, str]],
    allowed: frozenset[str] = ALLOWED,
    pending: Iterable[str] = PENDING,
) -> list[str]:
    """``path:line: text`` for each citation of a file outside the repository."""
    pending = tuple(pending)
    found = []
    for path, text in files:
        if path in allowed or is_pending(path, pending):
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if OUTSIDE_REFERENCE.search(line):
                found.append(f"{path}:{number}: {line.strip()}")
    return found


def defined_r_numbers(reliability_text: str) -> list[int]:
    return [int(n) for n in R_DEFINITION.findall(reliability_text)]


def undefined_r_citations(files: Iterable[tuple[str, str]], defined: Iterable[int]) -> list[str]:
    """``path:line: Rn`` for each cited R-number that ``docs/reliability.md`` does not define."""
    known = set(defined)
    found = []
    for path, text in files:
        for number, line in enumerate(text.splitlines(), start=1):
            for r in R_CITATION.findall(line):
                if int(r) not in known:
                    found.append(f"{path}:{number}: R{r}")
    return found


def headings(markdown: str) -> list[str]:
    """Heading texts and bold run-in heads, without backticks."""
    return [(h or b).replace("`", "").strip() for h, b in HEADING.findall(markdown)]


def broken_doc_links(files: Iterable[tuple[str, str]], docs: dict[str, str]) -> list[str]:
    """``path:line: ...`` for each named ``docs/*.md`` that does not exist, and each cited
    section that is not a heading of that doc. ``docs`` maps ``name.md`` to its text."""
    spec_sections = {h.split(" ")[0].rstrip(".") for h in headings(docs.get("spec.md", ""))}
    found = []
    for path, text in files:
        for number, line in enumerate(text.splitlines(), start=1):
            where = f"{path}:{number}"
            for name in DOC_LINK.findall(line):
                if name not in docs:
                    found.append(f"{where}: docs/{name} does not exist")
            for name, section in DOC_SECTION.findall(line):
                if name in docs and not any(h.startswith(section) for h in headings(docs[name])):
                    found.append(f'{where}: docs/{name} has no section "{section}"')
            for section in SPEC_SECTION.findall(line):
                if section not in spec_sections:
                    found.append(f"{where}: {SPEC_DOC} has no §{section}")
    return found


def _tracked_text_files() -> Iterator[tuple[str, str]]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for path in filter(None, listed.split("\0")):
        name = path.rsplit("/", 1)[-1]
        if not (path.endswith(TEXT_SUFFIXES) or name in TEXT_NAMES):
            continue
        file = ROOT / path
        if path not in ALLOWED and file.is_file():  # a deleted tracked file is not there to read
            yield path, file.read_text(encoding="utf-8", errors="replace")


def _docs() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "docs").glob("*.md")}


# --- the checkers catch what they are for -----------------------------------------------------


def test_the_checkers_catch_planted_faults() -> None:
    planted = [
        ("orchestrator/x.py", '"""Budgets (SPEC.md §8)."""'),
        ("docs/x.md", "see ../shared/RELIABILITY.md"),
        ("orchestrator/sandbox/y.py", "# stack-notes §2"),  # pending: tolerated
        ("tests/unit/test_docs_stand_alone.py", "DESIGN.md"),  # allowed
    ]
    pending = frozenset({"orchestrator/sandbox/"})
    assert outside_references(planted, pending=pending) == [
        'orchestrator/x.py:1: """Budgets (SPEC.md §8)."""',
        "docs/x.md:1: see ../shared/RELIABILITY.md",
    ]
    assert outside_references(planted, pending=()) != outside_references(planted, pending=pending)

    reliability = "### R1 Acknowledged\n\n### R2 Crash\ntext R3 in prose is no definition\n"
    assert defined_r_numbers(reliability) == [1, 2]
    assert undefined_r_citations([("a.py", "# R1, R2 and R30\n# R3")], [1, 2]) == [
        "a.py:1: R30",
        "a.py:2: R3",
    ]
    assert undefined_r_citations([("a.py", "TR1 R1x RR2")], []) == []

    docs = {"spec.md": "## 3. Runtime\n", "design.md": "## State and storage\n**Bold.** x\n"}
    assert broken_doc_links(
        [
            ("a.py", "docs/spec.md §3, docs/spec.md §9"),
            ("b.md", '`docs/design.md`, "State and storage"; docs/design.md, "Bold"'),
            ("c.md", 'docs/gone.md and docs/design.md, "Nowhere"'),
        ],
        docs,
    ) == [
        "a.py:1: docs/spec.md has no §9",
        "c.md:1: docs/gone.md does not exist",
        'c.md:1: docs/design.md has no section "Nowhere"',
    ]


# --- the repository -------------------------------------------------------------------------


def test_no_tracked_file_cites_a_file_outside_the_repository() -> None:
    found = outside_references(_tracked_text_files())
    assert found == [], "cite the docs/ page that holds it instead:\n" + "\n".join(found)


def test_every_cited_r_number_is_defined_once_in_reliability_md() -> None:
    defined = defined_r_numbers((ROOT / RELIABILITY_DOC).read_text(encoding="utf-8"))
    assert len(defined) >= 20  # the page is the one with the promises, not an empty stand-in
    assert len(defined) == len(set(defined)), f"an R-number is defined twice: {sorted(defined)}"
    assert defined == list(range(1, len(defined) + 1)), "R-numbers are defined in order, no gap"
    found = undefined_r_citations(_tracked_text_files(), defined)
    assert found == [], f"define these in {RELIABILITY_DOC}:\n" + "\n".join(found)


def test_every_named_doc_and_cited_section_exists() -> None:
    files = list(_tracked_text_files())
    assert any(path.startswith("docs/") for path, _ in files)
    found = broken_doc_links(files, _docs())
    assert found == [], "\n".join(found)


def test_the_readme_points_to_docs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in ("docs/architecture.md", "docs/design.md", "docs/spec.md", RELIABILITY_DOC):
        assert page in readme, f"README.md does not name {page}"
