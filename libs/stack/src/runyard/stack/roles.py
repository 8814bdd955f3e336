"""Postgres roles: the services never connect as a superuser.

Four login roles, none of them SUPERUSER, CREATEDB, CREATEROLE, REPLICATION or
BYPASSRLS, none a member of `pg_execute_server_program`,
`pg_read_server_files` or `pg_write_server_files` (so `COPY ... TO PROGRAM`
and reading server files are refused to every one of them):

- `runyard_owner` owns the `runyard` database, its schema and tables: the
  migrations run as it, then `apply_grants` hands out the rights below.
- `runyard_app`: SELECT/INSERT/UPDATE/DELETE on every table but `secrets`,
  and only SELECT/INSERT on `events` (relay, scheduler, fault tolerance, the CLI);
  it creates tables only in the schema `runyard_shadow` (the shadow tables of
  read models being rebuilt).
- `runyard_secrets`: what `runyard_app` has, plus the `secrets` table
  (creator-only values and webhook signing secrets): gateway, submission, deployer and
  notification service, the ones that write or resolve them.
- `runyard_logs`: what `runyard_app` has, and it owns `log_lines` and its day
  partitions, which the log service creates and drops while it runs.

`runyard up` creates them on its embedded server with generated passwords,
kept in a 0600 file of the control-plane runtime directory
(`StackCredentials`); infra/postgres/init-roles.sh creates the same roles for
docker-compose. `apply_grants` is run by the owner after the migrations, on
both.
"""

from __future__ import annotations

import json
import os
import secrets as _random
from dataclasses import dataclass
from pathlib import Path

import asyncpg

DATABASE = "runyard"
OWNER = "runyard_owner"
APP = "runyard_app"
SECRETS = "runyard_secrets"
LOGS = "runyard_logs"
ROLES = (OWNER, APP, SECRETS, LOGS)

#: The role each service of `runyard up` connects as; any other: `APP`.
SERVICE_ROLES: dict[str, str] = {
    "gateway": SECRETS,
    "submission": SECRETS,
    "deployer": SECRETS,
    "notification": SECRETS,
    "logs": LOGS,
}

#: Server-side capabilities no Runyard role may hold.
FORBIDDEN_MEMBERSHIPS = (
    "pg_execute_server_program",
    "pg_read_server_files",
    "pg_write_server_files",
)

_ROLE_OPTIONS = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT"


def _literal(text: str) -> str:
    """A SQL string literal (DDL takes no bind parameters)."""
    return "'" + text.replace("'", "''") + "'"


@dataclass(frozen=True)
class StackCredentials:
    """The generated password of each role, in a file only its owner can read."""

    passwords: dict[str, str]

    @classmethod
    def load_or_create(cls, path: Path) -> StackCredentials:
        """Read `path`, or create it (mode 0600, never readable by anyone
        else) with a fresh random password for each role."""
        if path.exists():
            mode = path.stat().st_mode & 0o777
            if mode & 0o077:
                raise PermissionError(
                    f"{path} holds database passwords but has mode {mode:o}: run `chmod 600 {path}`"
                )
            passwords = json.loads(path.read_text())
            missing = [role for role in ROLES if role not in passwords]
            if not missing:
                return cls(dict(passwords))
            passwords.update({role: _random.token_urlsafe(32) for role in missing})
        else:
            passwords = {role: _random.token_urlsafe(32) for role in ROLES}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(passwords, out, indent=2)
        tmp.replace(path)
        return cls(dict(passwords))


async def create_roles(superuser_dsn: str, credentials: StackCredentials) -> int:
    """As the bootstrap superuser: the roles (with their current passwords),
    their memberships and the `runyard` database owned by `runyard_owner`
    (an older Runyard's tables adopted into it: `adopt_legacy_tables`, whose
    count it returns). Idempotent; run at every start so a changed password
    file takes effect."""
    conn = await asyncpg.connect(superuser_dsn)
    try:
        for role in ROLES:
            if not await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role):
                await conn.execute(f"CREATE ROLE {role}")
            password = _literal(credentials.passwords[role])
            await conn.execute(f"ALTER ROLE {role} {_ROLE_OPTIONS} PASSWORD {password}")
            for capability in FORBIDDEN_MEMBERSHIPS:
                if await conn.fetchval("SELECT pg_has_role($1, $2, 'MEMBER')", role, capability):
                    await conn.execute(f"REVOKE {capability} FROM {role}")
        # Services share the app's table rights; the owner may act as the log
        # role, so that migrations can still alter the tables it owns.
        await conn.execute(f"GRANT {APP} TO {SECRETS}, {LOGS}")
        await conn.execute(f"GRANT {LOGS} TO {OWNER}")
    finally:
        await conn.close()
    adopted = await adopt_legacy_tables(superuser_dsn)
    conn = await asyncpg.connect(superuser_dsn)
    try:
        await _ensure_database(conn)
        # No Runyard role may connect to the maintenance database.
        await conn.execute("REVOKE CONNECT ON DATABASE postgres FROM PUBLIC")
    finally:
        await conn.close()
    return adopted


async def _ensure_database(conn: asyncpg.Connection) -> None:
    exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE)
    if not exists:
        await conn.execute(f"CREATE DATABASE {DATABASE} OWNER {OWNER}")
    await conn.execute(f"ALTER DATABASE {DATABASE} OWNER TO {OWNER}")
    await conn.execute(f"REVOKE ALL ON DATABASE {DATABASE} FROM PUBLIC")
    await conn.execute(f"GRANT CONNECT, TEMPORARY ON DATABASE {DATABASE} TO {APP}")


async def adopt_legacy_tables(superuser_dsn: str) -> int:
    """Hand the tables an older Runyard made as superuser in the `postgres`
    database over to a `runyard` database owned by `runyard_owner`.

    Before the roles existed, `runyard up` kept everything in `postgres`,
    owned by the superuser. When that database holds Runyard's tables and no
    `runyard` database exists yet, the database is renamed (the data stays
    where it is), an empty `postgres` is made again, and every object of the
    public schema changes owner. Returns the number of objects handed over
    (0: nothing to adopt).
    """
    conn = await asyncpg.connect(superuser_dsn)
    try:
        legacy = await conn.fetchval("SELECT to_regclass('public.schema_migrations') IS NOT NULL")
        has_new = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE)
    finally:
        await conn.close()
    if not legacy or has_new:
        return 0
    maintenance = superuser_dsn.rpartition("/")[0] + "/template1"
    conn = await asyncpg.connect(maintenance)
    try:
        await conn.execute(f"ALTER DATABASE postgres RENAME TO {DATABASE}")
        await conn.execute("CREATE DATABASE postgres")
        await conn.execute(f"ALTER DATABASE {DATABASE} OWNER TO {OWNER}")
    finally:
        await conn.close()
    conn = await asyncpg.connect(superuser_dsn.rpartition("/")[0] + f"/{DATABASE}")
    try:
        return await _reassign_public(conn)
    finally:
        await conn.close()


async def _reassign_public(conn: asyncpg.Connection) -> int:
    """Every table, sequence, view and function of schema public to the owner
    (REASSIGN OWNED cannot move objects of the bootstrap superuser)."""
    relations = await conn.fetch(
        """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'S', 'v', 'm')
             AND pg_get_userbyid(c.relowner) <> $1
             AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid
                             AND d.deptype IN ('a', 'i') AND c.relkind = 'S')""",
        OWNER,
    )
    for row in relations:
        await conn.execute(f'ALTER TABLE public."{row["relname"]}" OWNER TO {OWNER}')
    functions = await conn.fetch(
        """SELECT p.oid::regprocedure::text AS signature FROM pg_proc p
           JOIN pg_namespace n ON n.oid = p.pronamespace
           WHERE n.nspname = 'public' AND pg_get_userbyid(p.proowner) <> $1""",
        OWNER,
    )
    for row in functions:
        await conn.execute(f"ALTER ROUTINE {row['signature']} OWNER TO {OWNER}")
    if await conn.fetchval("SELECT to_regnamespace('runyard_shadow') IS NOT NULL"):
        await conn.execute(f"ALTER SCHEMA runyard_shadow OWNER TO {OWNER}")  # it grants there
    return len(relations) + len(functions)


async def apply_grants(owner_dsn: str) -> None:
    """As `runyard_owner`, after the migrations: the rights of the service
    roles on what exists now. Idempotent; run at every start, so a table a
    new migration added is covered before any service starts."""
    conn = await asyncpg.connect(owner_dsn)
    try:
        async with conn.transaction():
            await conn.execute(f"REVOKE CREATE ON SCHEMA public FROM PUBLIC, {APP}")
            await conn.execute(f"GRANT USAGE ON SCHEMA public TO {APP}")
            # The log service adds and drops day partitions of log_lines.
            await conn.execute(f"GRANT CREATE ON SCHEMA public TO {LOGS}")
            if await conn.fetchval("SELECT to_regnamespace('runyard_shadow') IS NOT NULL"):
                # Read-model rebuilds create and drop their shadow tables there.
                await conn.execute(f"GRANT USAGE, CREATE ON SCHEMA runyard_shadow TO {APP}")
            await conn.execute(
                f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {APP}"
            )
            await conn.execute(
                f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {APP}"
            )
            if await _exists(conn, "events"):
                # The event log is append-only: no service rewrites history.
                await conn.execute(f"REVOKE UPDATE, DELETE ON events FROM {APP}")
            if await _exists(conn, "schema_migrations"):
                # Services check that their migrations are applied; only the owner applies.
                await conn.execute(f"REVOKE INSERT, UPDATE, DELETE ON schema_migrations FROM {APP}")
            if await _exists(conn, "secrets"):
                await conn.execute(f"REVOKE ALL ON secrets FROM {APP}")
                await conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON secrets TO {SECRETS}")
            if await _exists(conn, "log_lines"):
                await _hand_logs_over(conn)
    finally:
        await conn.close()


async def _exists(conn: asyncpg.Connection, table: str) -> bool:
    return bool(await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"public.{table}"))


async def _hand_logs_over(conn: asyncpg.Connection) -> None:
    """log_lines and its partitions to the log role: creating a partition
    needs the parent's ownership, dropping one its own."""
    partitions = await conn.fetch(
        """SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
           WHERE i.inhparent = 'public.log_lines'::regclass
             AND pg_get_userbyid(c.relowner) <> $1""",
        LOGS,
    )
    await conn.execute(f"ALTER TABLE public.log_lines OWNER TO {LOGS}")
    for row in partitions:
        await conn.execute(f'ALTER TABLE public."{row["relname"]}" OWNER TO {LOGS}')


def service_role(service: str) -> str:
    """The role `service` (a name of runyard.stack.up.SERVICES) connects as."""
    return SERVICE_ROLES.get(service, APP)
