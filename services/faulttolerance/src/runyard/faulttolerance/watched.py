"""The tasks fault tolerance watches: the `ft_watched_tasks` table.

A task gets a row when the service first sees it unfinished and loses it when
the service sees it finished. The watches themselves live in memory, in the
instance that holds the task's partitions; when an instance takes partitions
over (its start, a rebalance after another instance stopped), it reads the rows,
keeps those of its partitions and sets their watches up from their streams at
once, instead of at the task's next event or line, which a hung task may never
give. The table holds unfinished tasks only, so it stays as small as the work in
flight.
"""

from __future__ import annotations

import asyncpg

#: At most this many rows are read at a takeover (the oldest first).
TAKEOVER_LIMIT = 100_000


class WatchedTasks:
    """Rows of `ft_watched_tasks` (the migrations are `StackReportStore.migrate`'s)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def add(self, task_id: str) -> None:
        await self.pool.execute(
            "INSERT INTO ft_watched_tasks (task_id) VALUES ($1) ON CONFLICT DO NOTHING", task_id
        )

    async def remove(self, task_id: str) -> None:
        await self.pool.execute("DELETE FROM ft_watched_tasks WHERE task_id = $1", task_id)

    async def all(self) -> list[str]:
        rows = await self.pool.fetch(
            "SELECT task_id FROM ft_watched_tasks ORDER BY since LIMIT $1", TAKEOVER_LIMIT
        )
        return [r["task_id"] for r in rows]
