"""Versioned SQL migrations, applied idempotently at start.

Each component (the event store, a read model, the log service, ...) owns a
folder of `NNNN_name.sql` files. `apply_migrations` applies, in order, the ones
not yet recorded in `schema_migrations`, each in its own transaction, under an
advisory lock so that services starting together do not race.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import asyncpg

_FILE = re.compile(r"^(\d{4})_[\w-]+\.sql$")
_LOCK_KEY = 0x52554E59  # "RUNY"


@dataclass(frozen=True)
class Migration:
    component: str
    version: int
    name: str
    sql: str


def load_migrations(component: str, folder: Path) -> list[Migration]:
    """The migrations of `component` found in `folder`, sorted by version."""
    found = []
    for path in folder.iterdir():
        match = _FILE.match(path.name)
        if match:
            found.append(Migration(component, int(match.group(1)), path.name, path.read_text()))
    return sorted(found, key=lambda m: m.version)


def eventstore_migrations() -> list[Migration]:
    folder = Path(str(resources.files("runyard.eventstore") / "migrations"))
    return load_migrations("eventstore", folder)


async def apply_migrations(conn: asyncpg.Connection, migrations: list[Migration]) -> list[str]:
    """Apply what is missing; return the names of the migrations applied now.

    When nothing is missing it changes nothing, so a service role without
    DDL rights starts on a database its owner role has migrated."""
    if await _all_applied(conn, migrations):
        return []
    try:
        return await _apply(conn, migrations)
    except asyncpg.InsufficientPrivilegeError as exc:
        user = await conn.fetchval("SELECT current_user")
        raise PermissionError(
            f"migrations of {sorted({m.component for m in migrations})} are missing and"
            f" role {user} may not apply them ({exc}): apply them as the database's owner"
            " role (`runyard up` does, with RUNYARD_OWNER_DATABASE_URL for external servers)"
        ) from exc


async def _all_applied(conn: asyncpg.Connection, migrations: list[Migration]) -> bool:
    if not await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
        return False
    done = {
        (r["component"], r["version"])
        for r in await conn.fetch("SELECT component, version FROM schema_migrations")
    }
    return all((m.component, m.version) in done for m in migrations)


async def _apply(conn: asyncpg.Connection, migrations: list[Migration]) -> list[str]:
    """Apply what is missing, holding the migrations' advisory lock throughout.

    The lock is taken before anything else, the bookkeeping table's creation
    included: two services starting on an empty database at once would
    otherwise both create it (one failing on the catalogue's unique index),
    or both apply the same migration. The second waits, then finds it done."""
    applied: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
    try:
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   component  text NOT NULL,
                   version    integer NOT NULL,
                   name       text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now(),
                   PRIMARY KEY (component, version))"""
        )
        done = {
            (r["component"], r["version"])
            for r in await conn.fetch("SELECT component, version FROM schema_migrations")
        }
        for migration in migrations:
            if (migration.component, migration.version) in done:
                continue
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (component, version, name) VALUES ($1, $2, $3)",
                    migration.component,
                    migration.version,
                    migration.name,
                )
            applied.append(f"{migration.component}/{migration.name}")
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
    return applied
