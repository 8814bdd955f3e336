"""Each tenant's share of what a service does at once, so that one tenant's burst is
no queue to the others.

`OpenStreams` counts the long-lived answers a tenant has open (a watch of a task's
events, a live tail of its logs, the console's live task list): each looks at
Postgres every second or so for as long as it is open, so a script opening
thousands would keep the database busy for everybody. A tenant may keep at most
`per_tenant` open at once; one more is refused at once (429, Retry-After), before
its stream starts. The gateway counts every stream it serves (`streams_per_tenant`
in gateway.yaml), the log service its live tails (`follows_per_tenant`).

`TenantSlots` lets at most `per_tenant` requests of one tenant run at once (the
gateway's submissions: `submissions_per_tenant`); one more waits for a slot, first
come first served, at most `wait_s`, then is refused (429, Retry-After). Other
tenants' requests never wait behind it.

Both refuse with the error their owner gives them (`refuse`), so each service
answers its own code.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable

from runyard.errors import RunyardError


class OpenStreams:
    """The streams each tenant has open: at most `per_tenant` at once. `refuse(n)`: the
    error of one more when `n` are open."""

    def __init__(self, per_tenant: int, refuse: Callable[[int], RunyardError]) -> None:
        self.per_tenant = max(1, per_tenant)
        self.refuse = refuse
        self.open: Counter[str] = Counter()

    def take(self, tenant: str) -> Callable[[], None]:
        """Count one more open stream of `tenant` (`refuse` past its limit); the function
        returned counts it closed, once however often it is called."""
        if self.open[tenant] >= self.per_tenant:
            raise self.refuse(self.per_tenant)
        self.open[tenant] += 1
        closed = False

        def close() -> None:
            nonlocal closed
            if not closed:
                closed = True
                self.open[tenant] -= 1
                if not self.open[tenant]:
                    del self.open[tenant]

        return close


class TenantSlots:
    """At most `per_tenant` requests of one tenant at once; one more waits at most
    `wait_s` for a slot, then `refuse(per_tenant, wait_s)` is raised."""

    def __init__(
        self, per_tenant: int, wait_s: float, refuse: Callable[[int, float], RunyardError]
    ) -> None:
        self.per_tenant = max(1, per_tenant)
        self.wait_s = max(0.0, wait_s)
        self.refuse = refuse
        #: Each tenant's slots and how many requests hold or wait for one.
        self._tenants: dict[str, tuple[asyncio.Semaphore, list[int]]] = {}

    def busy(self, tenant: str) -> int:
        """Requests of `tenant` that hold a slot or wait for one."""
        entry = self._tenants.get(tenant)
        return entry[1][0] if entry else 0

    @contextlib.asynccontextmanager
    async def taken(self, tenant: str) -> AsyncIterator[None]:
        """Hold one of `tenant`'s slots while the block runs."""
        slots, users = self._tenants.setdefault(tenant, (asyncio.Semaphore(self.per_tenant), [0]))
        users[0] += 1
        try:
            try:
                async with asyncio.timeout(self.wait_s):
                    await slots.acquire()
            except TimeoutError:
                raise self.refuse(self.per_tenant, self.wait_s) from None
            try:
                yield
            finally:
                slots.release()
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._tenants[tenant]
