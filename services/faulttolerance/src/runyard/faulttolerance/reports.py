"""Where stack reports are kept: the `ft_stack_reports` table (raw stacks included)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg
from runyard.eventstore import apply_migrations, load_migrations
from runyard.faulttolerance.stacks import StackReport

MIGRATIONS = Path(__file__).parent / "migrations"


class StackReportStore:
    """Stack reports by id and by task, in Postgres."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def migrate(self) -> None:
        async with self.pool.acquire() as conn:
            await apply_migrations(conn, load_migrations("faulttolerance", MIGRATIONS))

    async def save(self, report: StackReport) -> None:
        await self.pool.execute(
            """INSERT INTO ft_stack_reports
                   (report_id, task_id, run, attempt, captured_at, summary, report)
               VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb)
               ON CONFLICT (report_id) DO NOTHING""",
            report.report_id,
            report.task_id,
            report.run,
            report.attempt,
            report.captured_at,
            report.summary,
            json.dumps(report.to_dict()),
        )

    async def get(self, report_id: str) -> dict[str, Any] | None:
        raw = await self.pool.fetchval(
            "SELECT report FROM ft_stack_reports WHERE report_id = $1", report_id
        )
        return json.loads(raw) if raw is not None else None

    async def for_task(self, task_id: str) -> list[dict[str, Any]]:
        """Reports of a task, oldest first: id, run, attempt, time and summary."""
        rows = await self.pool.fetch(
            """SELECT report_id, run, attempt, captured_at, summary FROM ft_stack_reports
               WHERE task_id = $1 ORDER BY captured_at""",
            task_id,
        )
        return [dict(r) for r in rows]
