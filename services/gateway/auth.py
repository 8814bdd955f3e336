"""Bearer tokens: a token's sha256 maps to a tenant, a user and a role.

Tokens are stored hashed in `api_tokens`; `create_token` makes one (the only
time the clear token is seen) and `authenticate` resolves one per request.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import asyncpg
from runyard.gateway.errors import PermissionDenied, Unauthenticated

Role = Literal["admin", "member"]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a user of one tenant, with a role."""

    tenant: str
    user: str
    role: Role

    @property
    def actor(self) -> str:
        """The actor written in event metadata."""
        return f"user:{self.tenant}/{self.user}"

    def require_admin(self) -> None:
        """Refuse unless the caller is an admin."""
        if self.role != "admin":
            raise PermissionDenied(
                "auth.admin_only", "this operation needs the admin role", "ask an admin"
            )


def token_hash(token: str) -> str:
    """The sha256 hex digest under which a token is stored."""
    return hashlib.sha256(token.encode()).hexdigest()


async def create_token(
    conn: asyncpg.Connection | asyncpg.Pool, tenant: str, user: str, role: Role = "member"
) -> str:
    """Store a new token for `user` of `tenant` and return it in clear (shown once)."""
    token = "ry_" + secrets.token_urlsafe(24)
    await conn.execute(
        "INSERT INTO api_tokens (token_sha256, tenant, user_name, role) VALUES ($1, $2, $3, $4)",
        token_hash(token),
        tenant,
        user,
        role,
    )
    return token


async def authenticate(conn: asyncpg.Connection | asyncpg.Pool, token: str | None) -> Principal:
    """The principal of a bearer token, or `Unauthenticated`."""
    if not token:
        raise Unauthenticated(
            "auth.missing_token",
            "no bearer token",
            "send `Authorization: Bearer <token>` (the CLI reads RUNYARD_TOKEN or .runyard/token)",
        )
    row = await conn.fetchrow(
        "SELECT tenant, user_name, role FROM api_tokens WHERE token_sha256 = $1", token_hash(token)
    )
    if row is None:
        raise Unauthenticated("auth.invalid_token", "unknown token", "ask an admin for a token")
    return Principal(row["tenant"], row["user_name"], row["role"])


async def ensure_dev_token(dsn: str, path: Path) -> str:
    """The dev admin token of `runyard up`: reuse the one in `path` if it still
    works, else create one (tenant `dev`, user `admin`) and write it there."""
    from runyard.eventstore import apply_migrations
    from runyard.gateway.app import gateway_migrations

    existing = await asyncio.to_thread(_read_token, path)
    conn = await asyncpg.connect(dsn)
    try:
        await apply_migrations(conn, gateway_migrations())
        if existing:
            try:
                await authenticate(conn, existing)
                return existing
            except Unauthenticated:
                pass
        token = await create_token(conn, "dev", "admin", "admin")
    finally:
        await conn.close()
    await asyncio.to_thread(_write_token, path, token)
    return token


def _read_token(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


def _write_token(path: Path, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token + "\n")
    path.chmod(0o600)
