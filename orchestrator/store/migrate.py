"""Schema migrations: numbered SQL files applied in order, each in its own transaction (R7).

``orchestrator/store/migrations/NNNN_name.sql`` holds one migration. A database records every
version it has reached in ``schema_version``; opening a database applies the missing files in
order. A database whose version is newer than the newest file this code ships was written by a
newer prime-agent, and this code refuses to touch it rather than guess.

Everything here runs on the store's writer thread with the connection that thread owns.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb

from orchestrator.errors import StoreError

__all__ = [
    "MIGRATIONS_PACKAGE",
    "MIGRATION_FILE_RE",
    "Migration",
    "check_readable",
    "current_schema_version",
    "latest_schema_version",
    "load_migrations",
    "migrate",
]

MIGRATIONS_PACKAGE = "orchestrator.store"
MIGRATIONS_DIR = "migrations"
# ``0001_initial.sql``: four digits, an underscore, a name; the number is the version.
MIGRATION_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
FIRST_VERSION = 1
NO_SCHEMA = 0


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations() -> list[Migration]:
    """Every migration file shipped with the package, in version order.

    Numbers must run 1, 2, 3 … without gaps or repeats: a gap would mean a file went missing
    from the install, and applying the later ones without it would build the wrong schema.
    """
    root = resources.files(MIGRATIONS_PACKAGE).joinpath(MIGRATIONS_DIR)
    found: list[Migration] = []
    for entry in root.iterdir():
        match = MIGRATION_FILE_RE.match(entry.name)
        if match is None:
            continue
        found.append(Migration(int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    expected = list(range(FIRST_VERSION, FIRST_VERSION + len(found)))
    if [m.version for m in found] != expected:
        raise StoreError(
            f"migration files are not numbered {FIRST_VERSION}..{len(found)} without gaps: "
            f"{[m.version for m in found]}; the prime-agent install is damaged"
        )
    return found


def latest_schema_version() -> int:
    """The newest schema version this code knows how to build and read."""
    migrations = load_migrations()
    return migrations[-1].version if migrations else NO_SCHEMA


def _has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    row = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'main' AND table_name = $1",
        [name],
    ).fetchone()
    return row is not None and int(row[0]) > 0


def current_schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The highest version recorded in the database; 0 for a fresh (empty) file."""
    if not _has_table(con, "schema_version"):
        return NO_SCHEMA
    row = con.execute("SELECT max(version) FROM schema_version").fetchone()
    return int(row[0]) if row is not None and row[0] is not None else NO_SCHEMA


def _too_new(path: Path, found: int, known: int) -> StoreError:
    return StoreError(
        f"database {path} has schema version {found}, newer than this prime-agent "
        f"understands ({known}); upgrade prime-agent to open it"
    )


def check_readable(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    """For a read-only open: the schema must be exactly the one this code reads."""
    known = latest_schema_version()
    found = current_schema_version(con)
    if found > known:
        raise _too_new(path, found, known)
    if found < known:
        raise StoreError(
            f"database {path} has schema version {found}, older than this prime-agent uses "
            f"({known}); open it once read-write (start the daemon) to migrate it"
        )
    return found


def migrate(con: duckdb.DuckDBPyConnection, path: Path) -> list[int]:
    """Bring the database up to ``latest_schema_version()``; return the versions applied.

    Each file runs in its own transaction together with its ``schema_version`` row, so a crash
    (or a failing statement) leaves the database at the previous version, never halfway: DuckDB
    DDL is transactional. Re-running on an up-to-date database applies nothing.
    """
    migrations = load_migrations()
    known = migrations[-1].version if migrations else NO_SCHEMA
    found = current_schema_version(con)
    if found > known:
        raise _too_new(path, found, known)
    applied: list[int] = []
    for migration in migrations:
        if migration.version <= found:
            continue
        params: list[Any] = [migration.version, datetime.now(UTC).replace(tzinfo=None)]
        con.begin()
        try:
            con.execute(migration.sql)
            con.execute("INSERT INTO schema_version VALUES ($1, $2)", params)
            con.commit()
        except duckdb.Error as exc:
            _rollback_quietly(con)
            raise StoreError(
                f"migrating database {path} to schema version {migration.version} "
                f"({migration.name}) failed: {_one_line(exc)}"
            ) from exc
        applied.append(migration.version)
    return applied


def _rollback_quietly(con: duckdb.DuckDBPyConnection) -> None:
    # The transaction may already be aborted by the failing statement; a second error here
    # would only hide the first one.
    with contextlib.suppress(duckdb.Error):
        con.rollback()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
