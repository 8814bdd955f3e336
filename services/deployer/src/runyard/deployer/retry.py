"""Waiting out an outage of the event store or the broker (on `runyard.eventstore.transient`).

What the deployer must not lose (a worker's exit, its last output lines) is tried
again until it is done, never dropped: the store or the broker coming back is the
normal end of an outage. Store calls go through the shared `retrying` (only the
errors `is_transient` names are retried; the deployer shows as waiting in `HEALTH`,
which `/readyz` reports). The output sink and the broker connection are retried on
any error, with the same backoff: a record the broker refuses now is refused for a
reason that passes (the producer not connected yet, a leader moving), and giving up
would lose the line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from runyard.eventstore.transient import HEALTH, Backoff, retrying

log = logging.getLogger("runyard.deployer")

T = TypeVar("T")

#: How the deployer shows in the process's health while it waits for the store.
STORE = "deployer (event store)"


async def until_done(
    op: Callable[[], Awaitable[T]],
    *,
    what: str,
    component: str = STORE,
    any_error: bool = False,
) -> T:
    """`op()` until it returns; only a cancellation ends the waiting.

    Store calls (the default) retry what `is_transient` calls an outage and raise
    anything else at once (a refusal, a bug). With `any_error`, every error is
    retried (the output sink, the broker connection).
    """
    if not any_error:
        return await retrying(op, component=component)
    backoff = Backoff()
    failures = 0
    while True:
        try:
            result = await op()
        except Exception as exc:
            failures += 1
            if failures == 1:
                log.warning("%s failed (%r); retrying with backoff until it works", what, exc)
            HEALTH.mark_down(component, f"{type(exc).__name__}: {exc}"[:300])
            try:
                await backoff.wait()
            except asyncio.CancelledError:
                HEALTH.forget(component)
                raise
            continue
        if failures:
            HEALTH.mark_up(component)
            log.warning("%s done after %d tries", what, failures + 1)
        return result
