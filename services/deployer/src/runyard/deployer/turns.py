"""Turns of this machine's deploy work, shared fairly between tenants.

The local runtime runs at most `deploys_at_once` deployments' stages at once
(`LocalRuntimeConfig.deploys_at_once`); the others wait their turn. With one
queue in order of arrival, a tenant that submits a thousand tasks at once
would have every other tenant's next task wait behind all of them (about a
minute and a half at this machine's rate). `FairTurns` gives a turn that comes
free to the waiting tenant that holds the fewest turns, among equals the one
served longest ago (round robin), and within a tenant in order of arrival: a
tenant's one task waits for a turn to end, not for another tenant's burst.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter, deque
from collections.abc import AsyncIterator


class FairTurns:
    """`size` turns at once, shared between tenants (see the module docstring)."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self.free = self.size
        #: Turns each tenant holds now.
        self.held: Counter[str] = Counter()
        #: Each tenant's waiters in order: (arrival, future set when its turn comes).
        self._waiting: dict[str, deque[tuple[int, asyncio.Future[None]]]] = {}
        self._arrivals = itertools.count()
        #: When each tenant holding or waiting for a turn was last given one.
        self._served: dict[str, int] = {}
        self._grants = itertools.count()

    def waiting(self) -> int:
        """Deployments waiting for a turn."""
        return sum(len(queue) for queue in self._waiting.values())

    @contextlib.asynccontextmanager
    async def turn(self, tenant: str) -> AsyncIterator[None]:
        """Hold one turn for `tenant` while the block runs."""
        if self.free and not self._waiting:
            self.free -= 1
            self._grant(tenant)
        else:
            given: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(tenant, deque()).append((next(self._arrivals), given))
            try:
                await given
            except asyncio.CancelledError:
                if given.done() and not given.cancelled():
                    self._give_back(tenant)  # handed a turn it will not take
                else:
                    self._forget(tenant, given)
                raise
        try:
            yield
        finally:
            self._give_back(tenant)

    def _grant(self, tenant: str) -> None:
        self.held[tenant] += 1
        self._served[tenant] = next(self._grants)

    def _give_back(self, tenant: str) -> None:
        self.held[tenant] -= 1
        if not self.held[tenant]:
            del self.held[tenant]
            if tenant not in self._waiting:
                self._served.pop(tenant, None)
        if not self._waiting:
            self.free += 1
            return
        # The fewest turns held, then served longest ago, then the earliest waiter.
        chosen = min(
            self._waiting,
            key=lambda t: (self.held[t], self._served.get(t, -1), self._waiting[t][0][0]),
        )
        queue = self._waiting[chosen]
        _, given = queue.popleft()
        if not queue:
            del self._waiting[chosen]
        self._grant(chosen)
        given.set_result(None)

    def _forget(self, tenant: str, given: asyncio.Future[None]) -> None:
        queue = self._waiting.get(tenant)
        if queue is None:
            return
        for entry in queue:
            if entry[1] is given:
                queue.remove(entry)
                break
        if not queue:
            del self._waiting[tenant]
            if tenant not in self.held:
                self._served.pop(tenant, None)
