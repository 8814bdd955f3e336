"""Leadership of a singleton service (the relay, the scheduler) on Postgres.

Several instances of a singleton may run; one is active, the others are
standbys that take over within seconds when it dies. The lease is a
session-level advisory lock (`pg_try_advisory_lock`) held on a connection of
its own: Postgres releases it the moment that session ends, whether the holder
closed it, was killed (-9: the kernel closes the socket) or was cut off (the
server's TCP keepalives, set short on this connection, end the session).

    async with leadership(dsn, "scheduler", scope=prefix) as lease:
        ...                       # active: work until `lease.lost` is set

    await Leadership(dsn, "scheduler", scope=prefix).run(work)   # forever:
        # wait as standby, run `work(lease)` while active, cancel it at once
        # when the lease may be lost, and wait again

Keys. Advisory locks are per database; `scope` (the stack's topic prefix)
keeps two stacks that share one database apart. The key is a 64-bit hash of
scope and name (`lease_key`).

Taking the lease. A standby that gets the lock waits `check_s` before its term
starts: a holder whose session was ended (the lock is free at once) learns it
in that time, when its connection closes or at its next check, and stops.

Losing the lease. The holder checks its lock every `check_s` seconds with one
cheap query on the lock's connection (does this session still hold it?). When
the check fails, times out (`check_timeout_s`, shorter than the server's
keepalive detection, so the old holder stops before a standby can take over)
or the connection closes, `lease.lost` is set and `Leadership.run` cancels
the work and waits for it to stop. Work still running `stop_within_s` later
(30 s; the scheduler, whose term waits up to two minutes for its consumer,
gives 150 s) is a bug (it swallowed its cancellation): `run` raises
`WorkDidNotStop` with the work's stack in the log, so the service stops and is
started again rather than stay in a term it no longer holds.

What the lease does not do: fence. Between the moment a holder is cut off
and the moment it notices, it may still write. Correctness never depends on
the lease alone; each singleton fences its own writes:

- the scheduler appends every decision with the expected versions of the
  streams it read (the pool stream for an allocation, the task stream for a
  placement, in one transaction), so a stale instance's append conflicts as
  soon as the new one has written, and a decision made on a state that has
  since moved on is never committed: no GPU is taken twice and no attempt is
  placed twice (runyard.scheduler.app, `_commit`);
- the relay's publishing is at-least-once with idempotent consumers (event
  ids), so a stale relay can at worst publish an event twice, which consumers
  drop.

The lease keeps one instance doing the work at a time (no conflict storms, one
writer of the read models) and lets a standby take over in seconds.

Presence. Instances that share work through claimed rows (the notification
outbox) need the opposite question: is the instance that claimed this row
still alive? `Presence` holds a lock of a random key of its own, on a
connection of its own, for the life of the process; the instance marks what it
claims with that key, and `held_sql(column)` is true while the key's holder
lives. A killed instance's claims can so be taken back at once instead of when
a claim timeout runs out:

    async with Presence(dsn, "notification") as me:
        ...                       # claim rows with `me.key`; take back rows whose
                                  # claimer is no longer `held_sql`

If the presence's session ends while the process lives (a Postgres restart),
it connects again and takes the same key again; in between, another instance
may take its claims back, so an item may be handled twice (claims are
at-least-once).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import asyncpg
from runyard.eventstore.transient import cancel_and_wait

if TYPE_CHECKING:
    from runyard.stack.context import ServiceContext

__all__ = [
    "Leadership",
    "Lease",
    "Presence",
    "Role",
    "WorkDidNotStop",
    "held_sql",
    "leadership",
    "lease_key",
]

log = logging.getLogger("runyard.stack.leader")

Role = Literal["standby", "active"]

#: The lock connection's server settings: a short keepalive, so a holder cut off
#: from Postgres loses its session (and the lock) in about 11 s, not hours.
_KEEPALIVE = {
    "tcp_keepalives_idle": "5",
    "tcp_keepalives_interval": "2",
    "tcp_keepalives_count": "3",
}

#: Does this session hold the advisory lock `$1`? (A bigint key is shown in
#: pg_locks as classid = its high 32 bits, objid = its low 32 bits, objsubid 1.)
_HOLDS = """
SELECT EXISTS (
    SELECT 1 FROM pg_locks
    WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted AND objsubid = 1
      AND classid::bigint = ($1::bigint >> 32) & 4294967295
      AND objid::bigint = $1::bigint & 4294967295)
"""


def lease_key(name: str, scope: str = "") -> int:
    """The advisory lock key of lease `name` in `scope` (a signed 64-bit integer)."""
    digest = hashlib.blake2b(f"runyard-lease\0{scope}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass
class Lease:
    """A held lease. `lost` is set when the holder may no longer hold it: stop at once."""

    name: str
    key: int
    acquired_at: float = field(default_factory=time.monotonic)
    lost: asyncio.Event = field(default_factory=asyncio.Event)


@asynccontextmanager
async def leadership(
    dsn: str,
    name: str,
    *,
    scope: str = "",
    retry_s: float = 1.0,
    check_s: float = 1.0,
    check_timeout_s: float = 3.0,
) -> AsyncIterator[Lease]:
    """Wait (as a standby) until this process holds lease `name`, then yield it.

    Leaving the block releases the lease (the lock's session is closed). The
    block must watch `lease.lost` (or use `Leadership.run`, which does).
    """
    key = lease_key(name, scope)
    conn = await _acquire(dsn, name, key, retry_s)
    lease = Lease(name, key)
    conn.add_termination_listener(lambda _: lease.lost.set())
    watch = asyncio.create_task(_watch(conn, lease, check_s, check_timeout_s))
    try:
        # The lock is free the moment the last holder's session ends; that holder
        # learns it when its connection closes or at its next check, within `check_s`:
        # the new term starts after that, so the two do not work at once.
        await asyncio.sleep(check_s)
        log.info("%s: active (holds the lease)", name)
        yield lease
    finally:
        await cancel_and_wait(watch)
        await _close(conn)


async def _acquire(
    dsn: str,
    name: str,
    key: int,
    retry_s: float,
    contended: str = "standby (another instance holds the lease)",
) -> asyncpg.Connection:
    """A connection whose session holds lock `key` (polled every `retry_s` seconds;
    `contended` is logged once while another session holds it)."""
    standby_logged = False
    while True:
        conn = None
        try:
            conn = await asyncpg.connect(
                dsn,
                server_settings={**_KEEPALIVE, "application_name": f"runyard-lease:{name}"},
            )
            while True:
                if await conn.fetchval("SELECT pg_try_advisory_lock($1)", key):
                    return conn
                if not standby_logged:
                    log.info("%s: %s", name, contended)
                    standby_logged = True
                await asyncio.sleep(retry_s)
        except Exception as exc:  # an outage (or a bad DSN): said in the log, waited out
            log.warning("%s: lease connection failed (%r); retrying", name, exc)
            if conn is not None:
                conn.terminate()
            await asyncio.sleep(retry_s)
        except BaseException:
            if conn is not None:
                conn.terminate()  # the session ends: a lock it took goes with it
            raise


async def _watch(conn: asyncpg.Connection, lease: Lease, check_s: float, timeout_s: float) -> None:
    """Set `lease.lost` when the lock's session stops answering or holding the lock."""
    while not lease.lost.is_set():
        await asyncio.sleep(check_s)
        try:
            async with asyncio.timeout(timeout_s):
                holds = await conn.fetchval(_HOLDS, lease.key)
        except Exception as exc:  # any failure: the lock may be gone
            log.warning("%s: lease check failed (%r): stepping down", lease.name, exc)
            lease.lost.set()
            return
        if not holds:
            log.warning("%s: the lease's lock is gone: stepping down", lease.name)
            lease.lost.set()


async def _close(conn: asyncpg.Connection) -> None:
    """End the lock's session (releasing the lock); never hang on a dead server."""
    try:
        async with asyncio.timeout(2.0):
            await conn.close()
    except Exception:
        conn.terminate()
    except BaseException:
        conn.terminate()
        raise


#: The work of an active instance: runs until cancelled (or returns when done).
Work = Callable[[Lease], Awaitable[None]]


class Leadership:
    """One contender for lease `name`: `run(work)` works only while it holds the lease.

    `role` says what it is now ("standby" or "active"), for health answers.
    """

    def __init__(
        self,
        dsn: str,
        name: str,
        *,
        scope: str = "",
        retry_s: float = 1.0,
        check_s: float = 1.0,
        check_timeout_s: float = 3.0,
        stop_within_s: float = 30.0,
    ) -> None:
        self.dsn = dsn
        self.name = name
        self.scope = scope
        self.retry_s = retry_s
        self.check_s = check_s
        self.check_timeout_s = check_timeout_s
        #: How long cancelled work may take to stop before `WorkDidNotStop`.
        self.stop_within_s = stop_within_s
        self.role: Role = "standby"
        #: How many times this contender became active (tests, metrics).
        self.terms = 0

    @classmethod
    def for_service(cls, ctx: ServiceContext, name: str, **options: float) -> Leadership:
        """Lease `name` of the stack `ctx` belongs to (scoped by its topic prefix)."""
        return cls(ctx.dsn, name, scope=ctx.kafka.topics.prefix, **options)

    async def run(self, work: Work) -> None:
        """Forever: wait for the lease, run `work(lease)` while holding it, and cancel it
        as soon as the lease may be lost; then wait again. Returns when `work` returns
        by itself (not when it returns on being cancelled: it then swallowed the stop);
        an error of `work` is raised (after the lease is released)."""
        while True:
            async with leadership(
                self.dsn,
                self.name,
                scope=self.scope,
                retry_s=self.retry_s,
                check_s=self.check_s,
                check_timeout_s=self.check_timeout_s,
            ) as lease:
                self.role = "active"
                self.terms += 1
                try:
                    if await _until_lost(work(lease), lease, self.stop_within_s):
                        return
                finally:
                    self.role = "standby"
            log.warning("%s: lease lost; standing by", self.name)
            # The standbys get the first chance: whatever cost this instance its lease
            # (a slow or cut-off connection) may cost it the next one too.
            await asyncio.sleep(2 * self.retry_s)


async def _until_lost(work: Awaitable[None], lease: Lease, stop_within_s: float) -> bool:
    """Run `work` until it ends (True) or the lease is lost (False, `work` cancelled).

    Work that has not stopped `stop_within_s` seconds after it was cancelled
    raises `WorkDidNotStop`, with its stack in the log: it would hold the service
    in a term it no longer owns (a relay that publishes nothing), so the service
    stops on the error and its supervisor starts it again. A stop of the caller
    meanwhile cancels the work once more and is raised on."""
    task = asyncio.ensure_future(work)
    lost = asyncio.ensure_future(lease.lost.wait())
    stopped = False
    try:
        await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        lost.cancel()
        if not task.done():
            stopped = True
            task.cancel()
            try:
                await asyncio.wait({task}, timeout=stop_within_s)
            except asyncio.CancelledError:
                task.cancel()
                raise
    if not task.done():
        stack = io.StringIO()
        task.print_stack(file=stack)
        log.error(
            "%s: the work did not stop %.0f s after it was cancelled; it is stuck at:\n%s",
            lease.name,
            stop_within_s,
            stack.getvalue(),
        )
        raise WorkDidNotStop(f"{lease.name}: the work did not stop within {stop_within_s:.0f} s")
    if task.cancelled():
        return False
    task.result()  # an error of the work is raised here
    return not stopped  # work that returned when told to stop did not end by itself


class WorkDidNotStop(RuntimeError):
    """The active instance's work went on after it was cancelled (see `_until_lost`)."""


def held_sql(column: str) -> str:
    """SQL that is true while the `Presence` whose key is in `column` lives (any role
    may read `pg_locks`; `column` is a bigint column or expression, never user input)."""
    return f"""EXISTS (
        SELECT 1 FROM pg_locks
        WHERE locktype = 'advisory' AND granted AND objsubid = 1
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND classid::bigint = ({column} >> 32) & 4294967295
          AND objid::bigint = {column} & 4294967295)"""


class Presence:
    """This process's presence in Postgres (see the module docstring): `key`, a
    positive random 62-bit number, is held while the process lives."""

    def __init__(
        self,
        dsn: str,
        name: str,
        *,
        retry_s: float = 1.0,
        check_s: float = 2.0,
        check_timeout_s: float = 3.0,
    ) -> None:
        self.dsn = dsn
        self.name = f"{name} presence"
        self.key = secrets.randbits(62) + 1
        self.retry_s = retry_s
        self.check_s = check_s
        self.check_timeout_s = check_timeout_s
        self._conn: asyncpg.Connection | None = None
        self._keeper: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Presence:
        self._conn = await self._acquire()
        self._keeper = asyncio.create_task(self._keep(), name=self.name)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._keeper is not None:
            await cancel_and_wait(self._keeper)
        if self._conn is not None:
            await _close(self._conn)  # the lock goes with the session

    async def _acquire(self) -> asyncpg.Connection:
        # Contended only while a session of this process that was cut off still holds it.
        return await _acquire(
            self.dsn, self.name, self.key, self.retry_s, "waiting for its old session to end"
        )

    async def _keep(self) -> None:
        """Check the lock every `check_s`; take it again on a new session when lost."""
        assert self._conn is not None
        while True:
            await asyncio.sleep(self.check_s)
            try:
                async with asyncio.timeout(self.check_timeout_s):
                    holds = await self._conn.fetchval(_HOLDS, self.key)
            except Exception as exc:  # any failure: the lock may be gone
                log.warning("%s: check failed (%r): connecting again", self.name, exc)
                holds = False
            if not holds:
                self._conn.terminate()
                self._conn = await self._acquire()
                log.info("%s: held again", self.name)
