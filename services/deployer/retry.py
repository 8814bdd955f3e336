"""Waiting out an outage of the event store or the broker: retries with backoff and jitter.

What the deployer must not lose (a worker's exit, its last output lines) is tried
again until it is done, never dropped: the store or the broker coming back is the
normal end of an outage. Delays grow from `first_s` to `max_s` (with +-25 % jitter so
that many waiting deployments do not retry in step), and the outage is logged once
when it starts and once when it ends, not on every try.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import asyncpg
from runyard.eventstore.errors import StoreUnavailable

log = logging.getLogger("runyard.deployer")

T = TypeVar("T")

#: Errors that mean "the store (or the broker) is away now", not "this is wrong".
STORE_OUTAGE: tuple[type[BaseException], ...] = (
    StoreUnavailable,  # the store could not reach Postgres
    OSError,  # ConnectionRefusedError, ConnectionResetError, ...
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,  # the connection dropped mid-query
    asyncpg.InterfaceError,  # a connection or pool in a state it cannot be used in
    asyncpg.exceptions.OperatorInterventionError,  # shutting down, starting up
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections
)


def delays(first_s: float = 0.1, max_s: float = 5.0) -> Iterator[float]:
    """Backoff delays: doubling from `first_s` up to `max_s`, each with +-25 % jitter."""
    delay = first_s
    while True:
        yield delay * random.uniform(0.75, 1.25)  # jitter, not a secret
        delay = min(delay * 2, max_s)


async def until_done(
    op: Callable[[], Awaitable[T]],
    *,
    what: str,
    transient: tuple[type[BaseException], ...] = STORE_OUTAGE,
    first_s: float = 0.1,
    max_s: float = 5.0,
) -> T:
    """`op()` until it does not raise one of `transient`; other errors go to the caller.

    Only a cancellation (the deployer stops, or crashes in a test) ends the waiting.
    """
    waited = 0.0
    failures = 0
    for delay in delays(first_s, max_s):
        try:
            result = await op()
        except transient as exc:
            failures += 1
            if failures == 1:
                log.warning("%s failed (%r); retrying with backoff until it works", what, exc)
            await asyncio.sleep(delay)
            waited += delay
            continue
        if failures:
            log.warning("%s done after %d tries (%.1f s)", what, failures + 1, waited)
        return result
    raise AssertionError("unreachable")  # pragma: no cover
