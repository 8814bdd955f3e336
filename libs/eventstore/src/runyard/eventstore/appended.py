"""A wake-up for readers that follow the log: "events were appended".

Followers of the log (the outbox relay) poll it: every few milliseconds while
events flow, more slowly once it has been quiet a while. The first event after
a quiet spell (a person's submission, a cancel) would wait for the next slow
poll, so the store that appends it says so: after an append that commits when
that store had not appended for `NOTIFY_AFTER_QUIET_S`, it notifies channel
`runyard_events` in a statement of its own (`notify_appended`). `AppendSignal`
listens on one connection of a follower's pool and sets itself on each
notification; the follower clears it before it reads and, finding nothing new,
waits on it for at most its poll interval.

Why not a notification from every append (a trigger on `events`): Postgres
serialises the commits of notifying transactions (a database-wide lock held
through the commit's WAL flush), which cost concurrent appenders about a third
of their rate here. The notification here is its own transaction, writes
nothing durable, and is sent only after a quiet spell.

The notification is only a hint. It carries nothing, the log stays the only
source of events, and the follower still reads in global-position order with
its gap-safe reader and still polls. While the signal is not listening (the
database is down, the connection was lost) `listening` is False and the
follower polls as it would without it; each time it listens again it sets
itself once, so whatever was appended meanwhile is read at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import asyncpg
from runyard.eventstore.transient import Backoff, is_transient

log = logging.getLogger("runyard.eventstore")

#: The channel an append after a quiet spell is announced on.
APPENDED_CHANNEL = "runyard_events"
#: How long a store must not have appended for its next append to be announced
#: (below the relay's `quiet_after_s`, 0.25 s, after which it polls more slowly).
#: An announcement is one more round trip for that append; a relay that polls
#: fast for a shorter while after each event spends far less on a sparse load.
NOTIFY_AFTER_QUIET_S = 0.1


async def notify_appended(conn: asyncpg.Connection) -> None:
    """Announce committed appends on `conn` (outside any transaction). Never raises
    for the database: the appends are committed, and followers poll anyway."""
    try:
        await conn.execute("SELECT pg_notify($1, '')", APPENDED_CHANNEL)
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
        log.debug("could not announce an append: %s", exc)


class AppendSignal:
    """Set when events were appended; see the module docstring."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.listening = False
        self._set = asyncio.Event()

    def clear(self) -> None:
        """Before a read: an append committed after this wakes the next `wait`."""
        self._set.clear()

    async def wait(self, at_most_s: float) -> bool:
        """Until events were appended (True) or `at_most_s` seconds passed (False)."""
        if self._set.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(at_most_s):
                await self._set.wait()
                return True
        return False

    async def run(self) -> None:
        """Listen until cancelled; a lost connection is replaced after a backoff."""
        backoff = Backoff(cap=2.0)
        while True:
            try:
                await self._listen(backoff)
            except Exception as exc:  # only a hint: it never fails the reader
                if not is_transient(exc):
                    log.warning("not listening for appended events: %s", exc)
            finally:
                self.listening = False
            await backoff.wait()

    async def _listen(self, backoff: Backoff) -> None:
        async with self.pool.acquire() as conn:
            closed = asyncio.Event()

            def on_close(_conn: object) -> None:
                closed.set()

            conn.add_termination_listener(on_close)
            try:
                await conn.add_listener(APPENDED_CHANNEL, self._notified)
                self.listening = True
                backoff.reset()
                self._set.set()  # what was appended while not listening: read it now
                # asyncpg calls termination listeners on every way a connection ends
                # (closed, terminated, lost): until then, notifications arrive.
                await closed.wait()
            finally:
                self.listening = False
                await _unlisten(conn, self._notified, on_close)

    def _notified(self, *_args: Any) -> None:
        self._set.set()


async def _unlisten(conn: asyncpg.Connection, callback: Any, on_close: Any) -> None:
    """UNLISTEN before the connection goes back to the pool; a connection that
    cannot is closed (the pool replaces it), so no pooled session keeps listening.

    Never raises: it runs on the way out, often because the connection was lost,
    and asyncpg has then already given a lost connection back to its pool (every
    call on it raises `InterfaceError`). An error here would replace the
    cancellation being handled and keep the listener from stopping."""
    try:
        conn.remove_termination_listener(on_close)
        if conn.is_closed():
            return
        await conn.remove_listener(APPENDED_CHANNEL, callback)
    except Exception:  # a broken or already released connection
        with contextlib.suppress(Exception):
            conn.terminate()
