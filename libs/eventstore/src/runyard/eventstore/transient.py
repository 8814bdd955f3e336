"""Waiting out outages: which errors are transient, and retrying them with backoff.

Postgres restarting, a dropped connection, a broker that is not there for a
moment: none of these is a reason for a service to stop. Every loop that talks
to the store or the broker runs its calls through `retrying` (or catches with
`is_transient` and waits with a `Backoff`), so an outage costs time, never the
process. While a component waits it is marked down in `HEALTH`, which the
gateway's `/readyz` answers from; the first success marks it up again.

Only errors that say "the other side is not reachable now" are transient. A
refused statement, a constraint violation or a bug raises at once: retrying
those would hide them.

Stopping. A service stops by cancelling its tasks, and an outage is exactly
when a cancelled call's cleanup fails: a connection lost at that moment can
make its `finally` raise a connection error, which replaces the
`CancelledError`, and a loop that retried that error would swallow the stop.
So cleanups that run on the way out do not raise (the append signal's), and a
task stopped with `cancel_and_wait` is waited for with the waiter's own stop
passed on. `retrying` cannot tell such an error from an outage by the task's
pending cancellations (`Task.cancelling()`): Python 3.11's TaskGroup leaves
one behind when a child fails (one in a call made through `retrying`, as the
log store's parallel insert once was), and a retry that then gave up would drop
the batch.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import random
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncpg
from aiokafka.errors import KafkaConnectionError, KafkaError
from runyard.eventstore.errors import StoreUnavailable

log = logging.getLogger("runyard.transient")

T = TypeVar("T")

#: Driver errors of a database that is down, restarting, or dropped the connection.
DATABASE_ERRORS: tuple[type[Exception], ...] = (
    StoreUnavailable,
    asyncpg.PostgresConnectionError,  # class 08: connection exceptions
    asyncpg.CannotConnectNowError,  # 57P03: starting up or shutting down
    asyncpg.AdminShutdownError,  # 57P01: the server is shutting down
    asyncpg.CrashShutdownError,  # 57P02
    asyncpg.TooManyConnectionsError,
    ConnectionError,  # refused, reset, aborted, broken pipe
    TimeoutError,
)
#: Socket errors of a peer that is not there (not a missing file or a permission).
_NETWORK_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ETIMEDOUT,
        errno.EPIPE,
    }
)
#: asyncpg's interface errors are mostly misuse; these texts are a dead connection.
_DEAD_CONNECTION_TEXTS = ("connection is closed", "connection was closed", "terminating connection")
#: asyncpg's protocol state of a connection that read an error it did not ask for: the
#: server's "terminating connection" (a stop, a restart, a terminated session) read
#: before the close that follows it. Nothing more will come on it.
_UNASKED_ERROR_TEXT = "another operation (2) is in progress"


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel `task` and wait until it has ended, whatever it raised.

    A stop of the caller that comes while it waits is raised on (a plain
    `suppress(CancelledError)` around the wait would swallow it too); one the
    caller was already handling (this is its cleanup) is left to it. The caller's
    pending cancellations are compared before and after the wait, not read as they
    are: Python 3.11's TaskGroup can leave one behind (see the module)."""
    caller = asyncio.current_task()
    stops = caller.cancelling() if caller is not None else 0
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if caller is not None and caller.cancelling() > stops:
            raise
    except Exception:  # its own failure, not the caller's: said, and the caller goes on
        log.warning("%s ended with an error as it was stopped", task, exc_info=True)


def is_transient(error: BaseException) -> bool:
    """True for an error that only says the database or the broker is unreachable now."""
    if isinstance(error, (*DATABASE_ERRORS, KafkaConnectionError, socket.gaierror)):
        return True
    if isinstance(error, OSError) and (
        error.errno in _NETWORK_ERRNOS
        # a unix socket that is gone while the server is down (a file has a filename)
        or (error.errno == errno.ENOENT and error.filename is None)
        # asyncio's connect to several addresses (localhost: ::1 and 127.0.0.1)
        or str(error).startswith(("Multiple exceptions:", "Connect call failed"))
    ):
        return True
    if isinstance(error, KafkaError):
        return bool(getattr(error, "retriable", False))
    if isinstance(error, asyncpg.InterfaceError):
        text = str(error).lower()
        return any(t in text for t in _DEAD_CONNECTION_TEXTS)
    if isinstance(error, asyncpg.InternalClientError) and _UNASKED_ERROR_TEXT in str(error):
        return True
    cause = error.__cause__ or error.__context__
    return cause is not None and cause is not error and is_transient(cause)


@dataclass
class Backoff:
    """Exponential backoff with full jitter, capped: waits grow 0.1 s, 0.2 s, ... up to
    `cap` s, each drawn at random below its bound so that services that lost the same
    database do not come back in lockstep."""

    base: float = 0.1
    cap: float = 5.0
    attempt: int = 0

    def next_delay(self) -> float:
        bound = min(self.cap, self.base * 2**self.attempt)
        self.attempt += 1
        return random.uniform(bound / 2, bound)

    async def wait(self) -> None:
        await asyncio.sleep(self.next_delay())

    def reset(self) -> None:
        self.attempt = 0


@dataclass
class Health:
    """Which components of this process are waiting out an outage, and why.

    `down` holds component -> (reason, since, as monotonic seconds)."""

    down: dict[str, tuple[str, float]] = field(default_factory=dict)

    def mark_down(self, component: str, reason: str) -> None:
        if component not in self.down:
            log.warning("%s: waiting out an outage: %s", component, reason)
        since = self.down.get(component, ("", time.monotonic()))[1]
        self.down[component] = (reason, since)

    def forget(self, component: str) -> None:
        """`component` stopped (cancelled) while it waited: it reports nothing any more."""
        self.down.pop(component, None)

    def mark_up(self, component: str) -> None:
        if self.down.pop(component, None) is not None:
            log.warning("%s: reachable again, resuming", component)

    @property
    def ready(self) -> bool:
        return not self.down

    def report(self) -> dict[str, dict[str, object]]:
        """component -> {reason, down_s}, for readiness answers."""
        now = time.monotonic()
        return {
            name: {"reason": reason, "down_s": round(now - since, 1)}
            for name, (reason, since) in sorted(self.down.items())
        }


#: The health of this process: every `retrying` call reports to it by default.
HEALTH = Health()


async def retrying(
    call: Callable[[], Awaitable[T]],
    *,
    component: str,
    backoff: Backoff | None = None,
    health: Health = HEALTH,
) -> T:
    """`await call()` until it returns, waiting out transient errors (forever).

    Other errors raise at once. `component` names what waits, in logs and in
    `health` (down while it waits, up again on success). Cancellation ends the
    wait, so a service still stops promptly during an outage."""
    backoff = backoff or Backoff()
    while True:
        try:
            result = await call()
        except Exception as exc:
            if not is_transient(exc):
                raise
            health.mark_down(component, f"{type(exc).__name__}: {exc}"[:300])
            try:
                await backoff.wait()
            except asyncio.CancelledError:
                health.forget(component)
                raise
            continue
        health.mark_up(component)
        return result
