"""Searches of the log lines at once, shared fairly between tenants, and the live
tails a tenant keeps open.

A search (words, a phrase or a regular expression) can keep Postgres busy for
up to the query limit (`LogStore.query_timeout_s`) on a large task: a few of
them at once would hold every connection of the log service, so that other
tenants' reads and the ingest of everyone's lines wait, and every core the
event store shares. `SearchSlots` lets at most `per_tenant` searches of one
tenant and `total` of all run at once. A search first takes one of its
tenant's slots, then one of all (first come, first served), so a tenant's
waiting searches never stand in others' way. One that waits longer than its
patience is refused with `LogBusy` (429, Retry-After); the platform's own
background reads (an export, a live tail's later pages) wait as long as it
takes.

A live tail (`follow`) looks for new lines twice a second for as long as it is
open: `OpenFollows` lets a tenant keep at most `per_tenant` open at once, so
that a script opening thousands cannot keep Postgres and the gateway busy for
everyone; one more is refused with `LogBusy` (the count is the shared
`runyard.api.slots.OpenStreams`, as the gateway counts its streams).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from runyard.api.slots import OpenStreams
from runyard.logs.errors import LogBusy

#: Searches that run at once, of all tenants (`searches_at_once` in logs.yaml).
SEARCHES_AT_ONCE = 2
#: Searches of one tenant that run at once (`searches_per_tenant`).
SEARCHES_PER_TENANT = 1
#: Seconds a search asked through the API waits for a slot before it is refused
#: (`search_wait_s`).
SEARCH_WAIT_S = 5.0
#: Live tails of one tenant open at once (`follows_per_tenant`).
FOLLOWS_PER_TENANT = 32


class SearchSlots:
    """At most `per_tenant` searches of one tenant and `total` in all at once."""

    def __init__(self, total: int = SEARCHES_AT_ONCE, per_tenant: int = SEARCHES_PER_TENANT):
        self.total = max(1, total)
        self.per_tenant = max(1, min(per_tenant, self.total))
        self._all = asyncio.Semaphore(self.total)
        #: Each tenant's slots, kept while one of its searches runs or waits.
        self._tenants: dict[str, tuple[asyncio.Semaphore, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def taken(self, tenant: str, wait_s: float | None) -> AsyncIterator[None]:
        """Hold a slot of `tenant` and one of all while the block runs; waiting more
        than `wait_s` (None: no limit) raises `LogBusy`."""
        own, users = self._tenants.setdefault(tenant, (asyncio.Semaphore(self.per_tenant), [0]))
        users[0] += 1
        held: list[asyncio.Semaphore] = []
        try:
            try:
                async with asyncio.timeout(wait_s):
                    for slots in (own, self._all):
                        await slots.acquire()
                        held.append(slots)
            except TimeoutError:
                if not held:
                    why = f"your tenant's searches ({self.per_tenant} at once) are running"
                else:
                    why = f"the most searches of all tenants ({self.total} at once) are running"
                raise LogBusy(f"{why}, and none ended within {wait_s:g} s") from None
            yield
        finally:
            for slots in reversed(held):
                slots.release()
            users[0] -= 1
            if users[0] == 0:
                del self._tenants[tenant]


class OpenFollows(OpenStreams):
    """The live tails each tenant has open: at most `per_tenant` at once (one more is
    `LogBusy`); the count is `runyard.api.slots.OpenStreams`, the gateway's too."""

    def __init__(self, per_tenant: int = FOLLOWS_PER_TENANT) -> None:
        super().__init__(per_tenant, _too_many_follows)


def _too_many_follows(per_tenant: int) -> LogBusy:
    return LogBusy(
        f"your tenant has {per_tenant} live tails open, the most it may;"
        " close one (a `runyard logs -f` or a console page following a task)"
    )
