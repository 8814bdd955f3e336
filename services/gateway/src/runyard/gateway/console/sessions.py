"""Console sessions: an opaque id in an HttpOnly cookie, the token kept server-side.

Signing in exchanges an API token for a session. The browser holds only a
random id (`secrets.token_urlsafe`, 256 bits) in a `HttpOnly; SameSite=Strict`
cookie; the token, the CSRF token and the expiry stay in this process's
memory and are never written to disk or sent back to the browser. Every
request authenticates the kept token again (`Gateway.authenticate`), so a
revoked or expired token ends its sessions at once. A gateway restart signs
everyone out (the store is memory only: nothing to leak at rest).
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from runyard.contracts.envelope import utcnow

COOKIE = "runyard_session"
#: How long a session lives after sign-in (the token's own expiry may end it sooner).
SESSION_TTL = timedelta(hours=12)
#: Sessions kept at most; the oldest go first (a bound on memory, not a security control).
MAX_SESSIONS = 10_000


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


class Sessions:
    """The live sessions of this gateway process, by opaque id."""

    def __init__(self, clock: Callable[[], datetime] = utcnow, ttl: timedelta = SESSION_TTL):
        self._clock = clock
        self._ttl = ttl
        self._by_id: dict[str, Session] = {}

    def open(self, token: str) -> Session:
        """A new session for `token` (after the token was authenticated)."""
        self._drop_expired()
        while len(self._by_id) >= MAX_SESSIONS:
            self._by_id.pop(next(iter(self._by_id)))
        session = Session(
            session_id=secrets.token_urlsafe(32),
            token=token,
            csrf=secrets.token_urlsafe(32),
            expires_at=self._clock() + self._ttl,
        )
        self._by_id[session.session_id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of a cookie's id; None when unknown or expired."""
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is None or session.expires_at <= self._clock():
            self._by_id.pop(session_id, None)
            return None
        return session

    def close(self, session_id: str | None) -> None:
        """Sign out: the id is forgotten at once."""
        if session_id:
            self._by_id.pop(session_id, None)

    def _drop_expired(self) -> None:
        now = self._clock()
        for session_id in [k for k, s in self._by_id.items() if s.expires_at <= now]:
            del self._by_id[session_id]
