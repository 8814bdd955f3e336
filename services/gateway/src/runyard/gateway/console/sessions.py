"""Console sessions: an opaque id in an HttpOnly cookie, kept in the gateway's database.

Signing in exchanges an API token for a session. The browser holds only a
random id (`secrets.token_urlsafe`, 256 bits) in a `HttpOnly; SameSite=Strict`
cookie. Every gateway serving the same database sees the same sessions
(`PostgresSessions`, table `console_sessions`, migration 0005), so a browser
may be answered by any of them, and signing out (or the expiry) ends the
session on all of them at once.

What is stored is of no use without the cookie: the row's key is the SHA-256
of the session id, and the API token is sealed with keys derived from the id
(an HMAC-SHA256 keystream and an HMAC-SHA256 tag, encrypt-then-MAC); the CSRF
token is derived from the id and not stored at all. Every request
authenticates the token again (`Gateway.authenticate`), so a revoked or
expired token ends its sessions at once.

`MemorySessions` keeps the same sessions in one process's memory (tests, and a
gateway with no database of its own to share).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

import asyncpg
from runyard.contracts.envelope import utcnow

COOKIE = "runyard_session"
#: How long a session lives after sign-in (the token's own expiry may end it sooner).
SESSION_TTL = timedelta(hours=12)
#: Sessions kept at most in memory; the oldest go first (a bound, not a security control).
MAX_SESSIONS = 10_000
_TAG = 32


@dataclass(frozen=True, slots=True)
class Session:
    """One signed-in browser: its API token, its CSRF token, when it ends."""

    session_id: str
    token: str
    csrf: str
    expires_at: datetime

    def csrf_matches(self, sent: str | None) -> bool:
        """The CSRF token sent with a change is this session's (constant time)."""
        return bool(sent) and hmac.compare_digest(self.csrf, str(sent))


class Sessions(Protocol):
    """Where the console keeps its sessions, by opaque id."""

    async def open(self, token: str) -> Session:
        """A new session for `token` (after the token was authenticated)."""
        ...

    async def get(self, session_id: str | None) -> Session | None:
        """The live session of a cookie's id; None when unknown or expired."""
        ...

    async def close(self, session_id: str | None) -> None:
        """Sign out: the session ends at once."""
        ...


def _key(session_id: str, purpose: bytes) -> bytes:
    return hmac.new(session_id.encode(), purpose, hashlib.sha256).digest()


def session_key(session_id: str) -> str:
    """The stored key of a session: the SHA-256 of its id (the id is never stored)."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def csrf_of(session_id: str) -> str:
    """The session's CSRF token, derived from its id (so it is not stored)."""
    return _key(session_id, b"runyard-console-csrf").hex()


def _keystream(session_id: str, size: int) -> bytes:
    key = _key(session_id, b"runyard-console-seal")
    blocks = (size + 31) // 32
    return b"".join(
        hmac.new(key, n.to_bytes(8, "big"), hashlib.sha256).digest() for n in range(blocks)
    )[:size]


def seal(session_id: str, token: str) -> bytes:
    """The token encrypted and authenticated with keys of the session id."""
    plain = token.encode()
    cipher = bytes(a ^ b for a, b in zip(plain, _keystream(session_id, len(plain)), strict=True))
    tag = hmac.new(_key(session_id, b"runyard-console-tag"), cipher, hashlib.sha256).digest()
    return cipher + tag


def unseal(session_id: str, sealed: bytes) -> str | None:
    """The token of `seal`; None when the id is not the one it was sealed with."""
    if len(sealed) < _TAG:
        return None
    cipher, tag = sealed[:-_TAG], sealed[-_TAG:]
    expected = hmac.new(_key(session_id, b"runyard-console-tag"), cipher, hashlib.sha256).digest()
    if not hmac.compare_digest(tag, expected):
        return None
    stream = _keystream(session_id, len(cipher))
    return bytes(a ^ b for a, b in zip(cipher, stream, strict=True)).decode()


def _new(token: str, expires_at: datetime) -> Session:
    session_id = secrets.token_urlsafe(32)
    return Session(session_id, token, csrf_of(session_id), expires_at)


class MemorySessions:
    """The sessions of one gateway process, in its memory."""

    def __init__(self, clock: Callable[[], datetime] = utcnow, ttl: timedelta = SESSION_TTL):
        self._clock = clock
        self._ttl = ttl
        self._by_id: dict[str, Session] = {}

    async def open(self, token: str) -> Session:
        now = self._clock()
        for session_id in [k for k, s in self._by_id.items() if s.expires_at <= now]:
            del self._by_id[session_id]
        while len(self._by_id) >= MAX_SESSIONS:
            self._by_id.pop(next(iter(self._by_id)))
        session = _new(token, now + self._ttl)
        self._by_id[session.session_id] = session
        return session

    async def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is None or session.expires_at <= self._clock():
            self._by_id.pop(session_id, None)
            return None
        return session

    async def close(self, session_id: str | None) -> None:
        if session_id:
            self._by_id.pop(session_id, None)


class PostgresSessions:
    """The sessions of every gateway over one database (`console_sessions`)."""

    def __init__(
        self,
        db: Callable[[], asyncpg.Pool],
        clock: Callable[[], datetime] = utcnow,
        ttl: timedelta = SESSION_TTL,
    ) -> None:
        self._db = db
        self._clock = clock
        self._ttl = ttl

    async def open(self, token: str) -> Session:
        now = self._clock()
        session = _new(token, now + self._ttl)
        async with self._db().acquire() as conn, conn.transaction():
            # expired rows go as new ones come: the table holds live sessions only
            await conn.execute("DELETE FROM console_sessions WHERE expires_at <= $1", now)
            await conn.execute(
                "INSERT INTO console_sessions (session_key, sealed_token, expires_at, created_at)"
                " VALUES ($1, $2, $3, $4)",
                session_key(session.session_id),
                seal(session.session_id, token),
                session.expires_at,
                now,
            )
        return session

    async def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        row = await self._db().fetchrow(
            "SELECT sealed_token, expires_at FROM console_sessions"
            " WHERE session_key = $1 AND expires_at > $2",
            session_key(session_id),
            self._clock(),
        )
        token = unseal(session_id, bytes(row["sealed_token"])) if row else None
        if row is None or token is None:
            return None
        return Session(session_id, token, csrf_of(session_id), row["expires_at"])

    async def close(self, session_id: str | None) -> None:
        if session_id:
            await self._db().execute(
                "DELETE FROM console_sessions WHERE session_key = $1", session_key(session_id)
            )
