"""Bearer tokens and roles: who a caller is, and what their role lets them do.

A token is `ry_` and 32 random bytes (URL-safe base64). Only its sha256 is
stored, in `api_tokens`, with the tenant, user and role it stands for, who
made it, when it expires and whether it was revoked; the clear token is seen
once, when it is made. Every request looks the hash up in the database (no
cache), so a revocation or an expiry holds for the very next request, on
HTTP and gRPC alike.

Roles (docs/api.md has the table):

    platform_admin  everything, in every tenant: pools, catalogue, any token
    tenant_admin    a member of its tenant who also mints, lists and revokes
                    that tenant's member, service and tenant_admin tokens
    member          tasks, groups, logs, alerts of its own tenant
    service         a non-human client of one tenant: what a member may do
    sre             reads every tenant's tasks, events and logs (audit); writes nothing

Tokens stored before these roles had `admin` (now `platform_admin`); the
migration rewrites them and `normalise_role` reads any left over.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, get_args

import asyncpg
from runyard.api.errors import BadRequest, Conflict, PermissionDenied, Unauthenticated
from runyard.contracts import Metadata, NewEvent, default_mapper, requests
from runyard.contracts.admin_events import TokenIssued
from runyard.contracts.http import Role
from runyard.eventstore import NO_STREAM, Migration, PostgresEventStore, apply_migrations

ROLES: tuple[Role, ...] = get_args(Role)
#: Role names of tokens stored before scoped roles, and what they mean now.
LEGACY_ROLES: Mapping[str, Role] = requests.LEGACY_ROLES
#: Roles a tenant admin may give (in its own tenant only).
TENANT_ADMIN_GRANTS: frozenset[str] = frozenset({"tenant_admin", "member", "service"})
#: Roles that read across tenants.
CROSS_TENANT_READERS: frozenset[str] = frozenset({"platform_admin", "sre"})

#: A token lives this long unless the request says otherwise, and never longer than MAX_TTL.
DEFAULT_TTL = timedelta(days=30)
MAX_TTL = timedelta(seconds=requests.MAX_TOKEN_TTL_S)
#: Tenant names: 1 to 63 characters, letters, digits, `.`, `_`, `-`, starting alphanumeric
#: (the token request's model, `runyard.contracts.requests.TokenRequest`, has the same).
TENANT_PATTERN = re.compile(requests.TENANT_PATTERN)
#: User names: 1 to 64 characters, as tenants plus `@` (an e-mail address fits).
USER_PATTERN = re.compile(requests.USER_PATTERN)
MAX_DESCRIPTION = requests.MAX_TOKEN_DESCRIPTION
#: Active tokens (neither revoked nor expired) a tenant may hold at once: every token
#: is a row each request looks up by hash, and each mint an event in the log.
MAX_ACTIVE_TOKENS = 1000
#: Tokens one listing answers, newest first (`truncated` says when more matched).
MAX_LISTED_TOKENS = 1000
#: The only accepted form of the Authorization header (RFC 6750 `b64token`).
BEARER = re.compile(r"Bearer ([A-Za-z0-9._~+/-]+=*)")
BEARER_HINT = "send exactly `Authorization: Bearer <token>` (capital B, one space)"
DEV_TENANT, DEV_USER = "dev", "admin"
#: The actor of the dev token's `TokenIssued` event.
DEV_ACTOR = "system:runyard-up"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a user (or service account) of one tenant, with a role."""

    tenant: str
    user: str
    role: Role
    token_id: str = ""

    @property
    def actor(self) -> str:
        """The actor written in event metadata."""
        kind = "service" if self.role == "service" else "user"
        return f"{kind}:{self.tenant}/{self.user}"

    @property
    def is_platform_admin(self) -> bool:
        return self.role == "platform_admin"

    def may_read_tenant(self, tenant: str) -> bool:
        """Own tenant for everyone; every tenant for platform admins and SREs."""
        return tenant == self.tenant or self.role in CROSS_TENANT_READERS

    def may_write_tenant(self, tenant: str) -> bool:
        """Tasks of one's own tenant, unless the role is read-only."""
        return tenant == self.tenant and self.role != "sre"

    def require_write(self) -> None:
        """Refuse a change from a read-only (sre) caller."""
        if self.role == "sre":
            raise PermissionDenied(
                "auth.read_only",
                "the sre role reads every tenant but changes nothing",
                "use a member token of the tenant to make changes",
            )

    def require_operator(self) -> None:
        """Refuse unless the caller is an sre or a platform admin (read-model rebuilds:
        they change no task, only how the log is read)."""
        if self.role not in CROSS_TENANT_READERS:
            raise PermissionDenied(
                "auth.operator_only",
                f"rebuilding a read model needs the sre or platform_admin role, not {self.role}",
                "ask an SRE, or a platform admin for an sre token",
            )

    def require_platform_admin(self) -> None:
        """Refuse unless the caller is a platform admin (pools, catalogue)."""
        if not self.is_platform_admin:
            raise PermissionDenied(
                "auth.platform_admin_only",
                "this operation needs the platform_admin role",
                "ask a platform admin",
            )

    def require_every_tenant_reader(self, code: str, what: str, hint: str) -> None:
        """Refuse unless the role reads every tenant (sre, platform_admin): `what` (audit
        queries, what-if scheduling) reads the whole log."""
        if self.role not in CROSS_TENANT_READERS:
            raise PermissionDenied(
                code,
                f"{what} reads every tenant's events: it needs the sre or platform_admin"
                f" role, not {self.role}",
                hint,
            )

    def require_token_admin(self) -> None:
        """Refuse unless the caller may manage tokens (tenant or platform admin)."""
        if self.role not in ("platform_admin", "tenant_admin"):
            raise PermissionDenied(
                "auth.admin_only",
                "managing tokens needs the tenant_admin or platform_admin role",
                "ask an admin of your tenant",
            )

    def require_grant(self, tenant: str, role: Role) -> None:
        """Refuse a token for (tenant, role) this caller may not mint or revoke."""
        self.require_token_admin()
        if self.is_platform_admin:
            return
        if tenant != self.tenant:
            raise PermissionDenied(
                "auth.other_tenant",
                f"a tenant admin of {self.tenant!r} cannot manage tokens of tenant {tenant!r}",
                "ask a platform admin, or an admin of that tenant",
                "tenant",
            )
        if role not in TENANT_ADMIN_GRANTS:
            raise PermissionDenied(
                "auth.role_not_grantable",
                f"a tenant admin cannot manage {role} tokens",
                f"give one of {', '.join(sorted(TENANT_ADMIN_GRANTS))}, or ask a platform admin",
                "role",
            )


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A stored token as listing shows it: never the secret nor its hash."""

    token_id: str
    tenant: str
    user: str
    role: Role
    description: str
    created_at: datetime
    created_by: str
    expires_at: datetime
    revoked_at: datetime | None
    revoked_by: str | None

    def state(self, now: datetime) -> str:
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if self.expires_at <= now else "active"

    def to_dict(self, now: datetime) -> dict[str, Any]:
        return {
            "token_id": self.token_id,
            "tenant": self.tenant,
            "user": self.user,
            "role": self.role,
            "description": self.description,
            "state": self.state(now),
            "created_at": self.created_at.isoformat(),
            "created_by": self.created_by,
            "expires_at": self.expires_at.isoformat(),
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
            "revoked_by": self.revoked_by,
        }


# --- pure checks ----------------------------------------------------------------------


def normalise_role(role: object) -> Role:
    """A role of the API (`admin` of old tokens is `platform_admin`); 400 otherwise."""
    if isinstance(role, str) and role in LEGACY_ROLES:
        return LEGACY_ROLES[role]
    if isinstance(role, str) and role in ROLES:
        return role
    raise BadRequest(
        "auth.invalid_role",
        f"role must be one of {', '.join(ROLES)}",
        'e.g. {"tenant": "t1", "user": "alice", "role": "member"}',
        "role",
    )


def check_name(value: object, field: str) -> str:
    """A tenant or user name within its charset and length (no control characters)."""
    pattern = TENANT_PATTERN if field == "tenant" else USER_PATTERN
    limit = 63 if field == "tenant" else 64
    extra = "" if field == "tenant" else ", @"
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise BadRequest(
            "auth.invalid_name",
            f"{field} must be 1 to {limit} characters: letters, digits, `.`, `_`, `-`{extra},"
            " starting with a letter or digit",
            f'e.g. {{"{field}": "{"team-a" if field == "tenant" else "alice"}"}}',
            field,
        )
    return value


def check_description(value: object) -> str:
    """A token's free-text note: at most MAX_DESCRIPTION printable characters."""
    if value is None:
        return ""
    if (
        not isinstance(value, str)
        or len(value) > MAX_DESCRIPTION
        or any(not c.isprintable() for c in value)
    ):
        raise BadRequest(
            "auth.invalid_description",
            f"description must be text of at most {MAX_DESCRIPTION} printable characters",
            "one line, no control characters",
            "description",
        )
    return value


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def token_expiry(now: datetime, ttl: object = None, expires_at: object = None) -> datetime:
    """When a new token expires: `ttl` (seconds, or `90d`/`12h`/`30m`/`45s`) or
    `expires_at` (ISO 8601 with a zone) from `now`; DEFAULT_TTL if neither;
    never later than MAX_TTL from now."""
    if ttl is not None and expires_at is not None:
        raise BadRequest(
            "auth.invalid_expiry", "give ttl or expires_at, not both", "drop one", "ttl"
        )
    if expires_at is not None:
        when, field = _instant(expires_at), "expires_at"
    elif ttl is not None:
        # Compared before adding: `now` plus 999999999 days is past the last datetime.
        duration = _duration(ttl)
        when, field = (now + duration if duration <= MAX_TTL else now + 2 * MAX_TTL), "ttl"
    else:
        return now + DEFAULT_TTL
    if not now < when <= now + MAX_TTL:
        raise BadRequest(
            "auth.invalid_expiry",
            f"{field}: a token must expire in the future and within {MAX_TTL.days} days",
            f'e.g. {{"ttl": "30d"}} (default {DEFAULT_TTL.days}d, at most {MAX_TTL.days}d)',
            field,
        )
    return when


def _duration(ttl: object) -> timedelta:
    if isinstance(ttl, int) and not isinstance(ttl, bool) and 0 < ttl <= 10**9:
        return timedelta(seconds=ttl)
    match = re.fullmatch(r"([0-9]{1,9})([smhd])", ttl) if isinstance(ttl, str) else None
    if match is None:
        raise BadRequest(
            "auth.invalid_expiry",
            "ttl must be a number of seconds or a duration such as 30d, 12h, 30m, 45s",
            f"at most {MAX_TTL.days}d",
            "ttl",
        )
    return timedelta(seconds=int(match[1]) * _UNITS[match[2]])


def _instant(text: object) -> datetime:
    try:
        when = datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise BadRequest(
            "auth.invalid_expiry",
            "expires_at must be an ISO 8601 time with a zone",
            "e.g. 2027-01-31T00:00:00Z",
            "expires_at",
        )
    return when


def bearer_of(headers: Sequence[str]) -> str | None:
    """The token of a request's `Authorization` headers (HTTP headers, gRPC metadata):
    one at most, since servers and proxies differ on which of two they would read."""
    if len(headers) > 1:
        raise Unauthenticated(
            "auth.malformed_header",
            f"the request has {len(headers)} Authorization headers: send exactly one,"
            " `Bearer <token>`",
            BEARER_HINT,
        )
    return bearer_token(headers[0] if headers else None)


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization` header (None when absent); anything but the
    exact form `Bearer <token>` is refused, so one spelling means one thing."""
    if not header:
        return None
    match = BEARER.fullmatch(header)
    if match is None:
        raise Unauthenticated(
            "auth.malformed_header",
            "the Authorization header must be exactly `Bearer <token>`",
            BEARER_HINT,
        )
    return match[1]


def token_hash(token: str) -> str:
    """The sha256 hex digest under which a token is stored."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """(token id, clear token): the id names the token in lists, events and revocation."""
    return "tok_" + secrets.token_hex(8), "ry_" + secrets.token_urlsafe(32)


# --- storage --------------------------------------------------------------------------

_COLUMNS = (
    "token_id, tenant, user_name, role, description, created_at, created_by,"
    " expires_at, revoked_at, revoked_by"
)


async def insert_token(
    conn: asyncpg.Connection | asyncpg.Pool,
    tenant: str,
    user: str,
    role: Role,
    expires_at: datetime,
    *,
    description: str = "",
    created_by: str = "",
) -> tuple[str, TokenInfo]:
    """Store a new token's hash; answer the clear token (shown once) and its record."""
    token_id, token = new_token()
    row = await conn.fetchrow(
        f"""INSERT INTO api_tokens (token_id, token_sha256, tenant, user_name, role,
               description, created_by, expires_at)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING {_COLUMNS}""",
        token_id,
        token_hash(token),
        tenant,
        user,
        role,
        description,
        created_by,
        expires_at,
    )
    assert row is not None
    return token, _info(row)


async def create_token(
    conn: asyncpg.Connection | asyncpg.Pool,
    tenant: str,
    user: str,
    role: str = "member",
    *,
    ttl: timedelta = DEFAULT_TTL,
    description: str = "",
    created_by: str = "system",
) -> str:
    """Store a token for `user` of `tenant` without an API call (bootstrap, tests);
    answer it in clear. The admin API mints through `Gateway.create_token`, which
    also records the event."""
    now = await conn.fetchval("SELECT now()")
    expires = now + ttl
    token, _ = await insert_token(
        conn,
        check_name(tenant, "tenant"),
        check_name(user, "user"),
        normalise_role(role),
        expires,
        description=description,
        created_by=created_by,
    )
    return token


async def require_own_user(
    conn: asyncpg.Connection, caller: Principal, tenant: str, user: str
) -> None:
    """Refuse a tenant admin a token for a user of its tenant someone else made: such a
    token would be that user, creator-only values included. A tenant admin mints for
    itself, for a new user name, or for a user all of whose tokens it minted itself.
    A platform admin mints for anyone but a user a tenant admin holds an active token
    of: a tenant admin could mint a name before its person has one (`dave`, the next
    hire), and its token would then be the person the platform admin mints for.
    Call in the transaction that stores the token: the lock keeps two admins from
    making the same new user at once."""
    if (tenant, user) == (caller.tenant, caller.user):
        return
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"api_tokens/{tenant}/{user}")
    if caller.is_platform_admin:
        await _refuse_tenant_admins_user(conn, tenant, user)
        return
    others = await conn.fetchval(
        """SELECT string_agg(DISTINCT created_by, ', ' ORDER BY created_by) FROM api_tokens
           WHERE tenant = $1 AND user_name = $2 AND created_by <> $3""",
        tenant,
        user,
        caller.actor,
    )
    if others:
        raise PermissionDenied(
            "auth.user_not_yours",
            f"user {user!r} of tenant {tenant!r} has tokens minted by {others}: a tenant admin"
            " mints tokens only for new users, itself, or users it made, since a token for"
            f" {user!r} would act as {user!r} (creator-only values included)",
            f"ask a platform admin to mint it (`runyard admin tokens create {tenant} {user}`),"
            " or choose a user name not taken",
            "user",
        )


async def _refuse_tenant_admins_user(conn: asyncpg.Connection, tenant: str, user: str) -> None:
    """Refuse a platform admin a token for a user with an active token that a tenant admin
    minted (someone neither a platform admin, the platform, nor the user itself)."""
    holders = await conn.fetchval(
        """SELECT string_agg(DISTINCT t.created_by, ', ' ORDER BY t.created_by)
           FROM api_tokens t
           WHERE t.tenant = $1 AND t.user_name = $2 AND t.revoked_at IS NULL
             AND t.expires_at > now() AND t.created_by LIKE 'user:%'
             AND t.created_by <> 'user:' || $1 || '/' || $2
             AND NOT EXISTS (
                 SELECT 1 FROM api_tokens p
                 WHERE p.role IN ('platform_admin', 'admin')
                   AND t.created_by = 'user:' || p.tenant || '/' || p.user_name)""",
        tenant,
        user,
    )
    if holders:
        raise Conflict(
            "auth.user_held",
            f"user {user!r} of tenant {tenant!r} has active tokens minted by {holders}: whoever"
            f" holds them acts as {user!r}, so a token for {user!r} would share its tasks and"
            " creator-only values with them",
            f"revoke those tokens first (`runyard admin tokens list --tenant {tenant}`, then"
            " `runyard admin tokens revoke ID`), or choose a user name not taken",
            "user",
        )


async def list_tokens(
    conn: asyncpg.Connection | asyncpg.Pool, tenant: str | None, include_revoked: bool
) -> tuple[list[TokenInfo], bool]:
    """Tokens of `tenant` (every tenant when None), newest first, at most
    MAX_LISTED_TOKENS; and whether more matched."""
    rows = await conn.fetch(
        f"""SELECT {_COLUMNS} FROM api_tokens
            WHERE ($1::text IS NULL OR tenant = $1) AND ($2 OR revoked_at IS NULL)
            ORDER BY created_at DESC, token_id LIMIT $3""",
        tenant,
        include_revoked,
        MAX_LISTED_TOKENS + 1,
    )
    return [_info(r) for r in rows[:MAX_LISTED_TOKENS]], len(rows) > MAX_LISTED_TOKENS


async def require_token_room(conn: asyncpg.Connection, tenant: str, now: datetime) -> None:
    """Refuse a token for `tenant` when it holds MAX_ACTIVE_TOKENS active ones already.
    Call in the transaction that stores the token: the lock keeps two mints of one
    tenant from passing the limit together."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"api_tokens/{tenant}")
    active = await conn.fetchval(
        """SELECT count(*) FROM api_tokens
           WHERE tenant = $1 AND revoked_at IS NULL AND expires_at > $2""",
        tenant,
        now,
    )
    if active >= MAX_ACTIVE_TOKENS:
        raise Conflict(
            "auth.too_many_tokens",
            f"tenant {tenant!r} holds {active} active tokens, the most it may hold at once"
            f" ({MAX_ACTIVE_TOKENS})",
            "revoke the tokens no longer used (`runyard admin tokens list`, then `revoke`)",
            "tenant",
        )


async def get_token(conn: asyncpg.Connection | asyncpg.Pool, token_id: str) -> TokenInfo | None:
    row = await conn.fetchrow(f"SELECT {_COLUMNS} FROM api_tokens WHERE token_id = $1", token_id)
    return _info(row) if row else None


async def mark_revoked(conn: asyncpg.Connection, token_id: str, actor: str) -> TokenInfo | None:
    """Revoke an active token (None if it was revoked already)."""
    row = await conn.fetchrow(
        f"""UPDATE api_tokens SET revoked_at = now(), revoked_by = $2
            WHERE token_id = $1 AND revoked_at IS NULL RETURNING {_COLUMNS}""",
        token_id,
        actor,
    )
    return _info(row) if row else None


def _info(row: asyncpg.Record) -> TokenInfo:
    return TokenInfo(
        token_id=row["token_id"],
        tenant=row["tenant"],
        user=row["user_name"],
        role=normalise_role(row["role"]),
        description=row["description"],
        created_at=row["created_at"],
        created_by=row["created_by"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
        revoked_by=row["revoked_by"],
    )


async def authenticate(conn: asyncpg.Connection | asyncpg.Pool, token: str | None) -> Principal:
    """The principal of a bearer token, or `Unauthenticated` (missing, unknown,
    revoked or expired: each says which)."""
    if not token:
        raise Unauthenticated(
            "auth.missing_token",
            "no bearer token",
            "send `Authorization: Bearer <token>` (the CLI reads RUNYARD_TOKEN or .runyard/token)",
        )
    row = await conn.fetchrow(
        """SELECT token_id, tenant, user_name, role, revoked_at IS NOT NULL AS revoked,
                  expires_at <= now() AS expired
           FROM api_tokens WHERE token_sha256 = $1""",
        token_hash(token),
    )
    _refuse_unless_valid(row)
    role = normalise_role(row["role"])
    return Principal(row["tenant"], row["user_name"], role, row["token_id"])


async def authenticate_again(conn: asyncpg.Connection | asyncpg.Pool, caller: Principal) -> None:
    """Refuse, as `authenticate` would now, a caller whose token was revoked or has
    expired since: a long answer (a watch) asks as it goes, not only as it starts."""
    if not caller.token_id:
        return
    row = await conn.fetchrow(
        """SELECT revoked_at IS NOT NULL AS revoked, expires_at <= now() AS expired
           FROM api_tokens WHERE token_id = $1""",
        caller.token_id,
    )
    _refuse_unless_valid(row)


def _refuse_unless_valid(row: asyncpg.Record | None) -> None:
    if row is None:
        raise Unauthenticated("auth.invalid_token", "unknown token", "ask an admin for a token")
    if row["revoked"]:
        raise Unauthenticated(
            "auth.token_revoked", "this token was revoked", "ask an admin for a new token"
        )
    if row["expired"]:
        raise Unauthenticated(
            "auth.token_expired", "this token has expired", "ask an admin for a new token"
        )


# --- runyard up ---------------------------------------------------------------------


def token_stream(token_id: str) -> str:
    """The stream of one API token's events (category `access`)."""
    return f"access-{token_id}"


async def record_token_issued(
    store: PostgresEventStore,
    conn: asyncpg.Connection,
    info: TokenInfo,
    metadata: Metadata,
    now: datetime,
) -> None:
    """Append `TokenIssued` in the transaction that stored the token's hash."""
    event = TokenIssued(
        token_id=info.token_id,
        tenant=info.tenant,
        user=info.user,
        role=info.role,
        description=info.description,
        expires_at=info.expires_at,
    )
    new = NewEvent(event=event, metadata=metadata, occurred_at=now)
    await store.append_in(conn, token_stream(info.token_id), [new], NO_STREAM)


async def ensure_dev_token(dsn: str, path: Path, migrations: Sequence[Migration] = ()) -> str:
    """The dev platform admin token of `runyard up`: reuse the one in `path` while it
    works (not revoked, not expired), else mint one (tenant `dev`, user `admin`),
    record it as an event and write it there (mode 0600). The tokens table must
    exist (`runyard up` migrates first), or be created by `migrations`."""
    existing = await asyncio.to_thread(_read_token, path)
    store = await PostgresEventStore.connect(dsn, default_mapper())
    try:
        async with store.pool.acquire() as conn:
            await apply_migrations(conn, list(migrations))
            if existing:
                try:
                    await authenticate(conn, existing)
                    return existing
                except Unauthenticated:
                    pass
        async with store.transaction() as conn:
            now = await conn.fetchval("SELECT now()")
            token, info = await insert_token(
                conn,
                DEV_TENANT,
                DEV_USER,
                "platform_admin",
                now + DEFAULT_TTL,
                description="runyard up dev token",
                created_by=DEV_ACTOR,
            )
            await record_token_issued(store, conn, info, Metadata(actor=DEV_ACTOR), now)
    finally:
        await store.close()
    await asyncio.to_thread(_write_token, path, token)
    return token


def _read_token(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


def _write_token(path: Path, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token + "\n")
    path.chmod(0o600)
