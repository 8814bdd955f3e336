"""Each tenant's share of what a service does at once, so that one tenant's burst is
no queue to the others.

`OpenStreams` counts the long-lived answers a tenant has open (a watch of a task's
events, a live tail of its logs, the console's live task list): each looks at
Postgres every second or so for as long as it is open, so a script opening
thousands would keep the database busy for everybody. A tenant may keep at most
`per_tenant` open at once; one more is refused at once (429, Retry-After), before
its stream starts. The gateway counts every stream it serves (`streams_per_tenant`
in gateway.yaml), the log service its live tails (`follows_per_tenant`).

It refuses with the error its owner gives it (`refuse`), so each service
answers its own code.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

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
