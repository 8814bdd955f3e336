"""Background exports (R-41): a file of a task's lines, with progress.

Without filters or search an export holds the last 30 days of the task's
lines; otherwise exactly the lines the query matches. The record (state,
lines done / total) lives in `log_exports`; the file under the export folder.
Only the last `KEEP` exports of a user are kept; older ones are deleted with
their files when a new one starts.

An export runs in the process that started it (a log service instance): the record
names that process (`owner`, a fresh id per `Exports`) and the process
refreshes `heartbeat_at` every `HEARTBEAT_S` while it runs. A process that
stops mid-way leaves the record `running` with an old heartbeat; `recover`
(called when a log service starts, and before exports are listed) marks each such export
`failed`, with the reason, and removes its partial file. Exports of another
live process (a fresh heartbeat) are left alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from runyard.logs.errors import ExportNotFound, InvalidQuery
from runyard.logs.search import LogQuery
from runyard.logs.store import LogLine, LogStore

log = logging.getLogger("runyard.logs.exports")
KEEP = 5
#: How often a running export says it is alive, and after how long without a
#: word it is taken for abandoned (its process stopped).
HEARTBEAT_S = 10.0
STALE_AFTER_S = 60.0
ABANDONED = (
    "abandoned: the log service process running it stopped before it finished; start it again"
)
UNFILTERED_DAYS = 30
Format = Literal["text", "jsonl"]
_COLUMNS = (
    "export_id, task_id, query, format, state, lines_done, lines_total, error,"
    " created_at, finished_at"
)


def text_line(line: LogLine) -> str:
    """The plain-text form: a prefix a reader can see but a search never matches."""
    return (
        f"{line.at.isoformat()} run={line.run} attempt={line.attempt}"
        f" worker={line.worker} {line.stream} | {line.line}"
    )


class Exports:
    """Starts exports, runs them in the background, answers their state."""

    def __init__(
        self,
        store: LogStore,
        folder: Path,
        *,
        batch: int = 1000,
        heartbeat_s: float = HEARTBEAT_S,
        stale_after_s: float = STALE_AFTER_S,
    ) -> None:
        self.store = store
        self.folder = folder
        self.batch = batch
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = stale_after_s
        #: This process's name on the exports it runs.
        self.owner = uuid.uuid4().hex
        self._running: set[asyncio.Task[None]] = set()
        self._heartbeat: asyncio.Task[None] | None = None

    async def recover(self) -> list[str]:
        """Mark failed the exports left `running` by a process that stopped (no
        heartbeat for `stale_after_s`), remove their partial files; their ids."""
        rows = await self.store.pool.fetch(
            """UPDATE log_exports SET state = 'failed', error = $2,
                      finished_at = clock_timestamp()
               WHERE state = 'running' AND owner IS DISTINCT FROM $1
                 AND coalesce(heartbeat_at, created_at)
                     < clock_timestamp() - make_interval(secs => $3)
               RETURNING export_id, path""",
            self.owner,
            ABANDONED,
            self.stale_after_s,
        )
        for row in rows:
            log.warning("export %s: %s", row["export_id"], ABANDONED)
            if row["path"]:
                await asyncio.to_thread(Path(row["path"]).unlink, missing_ok=True)
        return [row["export_id"] for row in rows]

    async def _beat(self) -> None:
        """While exports run here: refresh their heartbeat every `heartbeat_s`."""
        while self._running:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self.store.pool.execute(
                    """UPDATE log_exports SET heartbeat_at = clock_timestamp()
                       WHERE owner = $1 AND state = 'running'""",
                    self.owner,
                )
            except Exception:  # the next beat tries again
                log.exception("export heartbeat failed")

    async def start(
        self, tenant: str, user: str, query: LogQuery, fmt: str = "text"
    ) -> dict[str, Any]:
        """Record a new export, drop the user's old ones, start the work."""
        if fmt not in ("text", "jsonl"):
            raise InvalidQuery(
                "export.format", "format is text or jsonl", "text or jsonl", "format"
            )
        if not query.has_filters:
            query = replace(query, not_before=datetime.now(UTC) - timedelta(days=UNFILTERED_DAYS))
        await self.store.count(query)  # refuses a bad query now, not in the background
        export_id = uuid.uuid4().hex
        path = self.folder / f"{export_id}.{'txt' if fmt == 'text' else 'jsonl'}"
        await self.store.pool.execute(
            """INSERT INTO log_exports (export_id, tenant, user_name, task_id, query, format,
                                        state, path, owner, heartbeat_at)
               VALUES ($1, $2, $3, $4, $5, $6, 'running', $7, $8, clock_timestamp())""",
            export_id,
            tenant,
            user,
            query.task_id,
            json.dumps(query.to_json()),
            fmt,
            str(path),
            self.owner,
        )
        await self._prune(tenant, user)
        # In the background its searches wait their tenant's turn as long as it takes.
        task = asyncio.create_task(
            self._run(export_id, replace(query, patient=True), path, fmt),
            name=f"export-{export_id}",
        )
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.create_task(self._beat(), name="export-heartbeat")
        return await self.get(tenant, user, export_id)

    async def get(self, tenant: str, user: str, export_id: str) -> dict[str, Any]:
        row = await self.store.pool.fetchrow(
            f"SELECT {_COLUMNS} FROM log_exports"
            " WHERE export_id = $1 AND tenant = $2 AND user_name = $3",
            export_id,
            tenant,
            user,
        )
        if row is None:
            raise ExportNotFound(
                "export.not_found", f"export {export_id!r} does not exist", "list yours"
            )
        return _view(row)

    async def list(self, tenant: str, user: str) -> list[dict[str, Any]]:
        rows = await self.store.pool.fetch(
            f"SELECT {_COLUMNS} FROM log_exports WHERE tenant = $1 AND user_name = $2"
            " ORDER BY created_at DESC",
            tenant,
            user,
        )
        return [_view(r) for r in rows]

    async def file(self, tenant: str, user: str, export_id: str) -> tuple[Path, str]:
        """The finished export's file and its media type."""
        view = await self.get(tenant, user, export_id)
        if view["state"] != "done":
            raise ExportNotFound(
                "export.not_ready", f"export {export_id!r} is {view['state']}", "wait for done"
            )
        path = await self.store.pool.fetchval(
            "SELECT path FROM log_exports WHERE export_id = $1", export_id
        )
        media = "text/plain" if view["format"] == "text" else "application/x-ndjson"
        return Path(path), media

    async def wait(self) -> None:
        """Until every export started here has finished (tests, shutdown)."""
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._running):
            task.cancel()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        await asyncio.gather(*list(self._running), return_exceptions=True)
        if self._heartbeat is not None:
            await asyncio.gather(self._heartbeat, return_exceptions=True)

    async def _run(self, export_id: str, query: LogQuery, path: Path, fmt: str) -> None:
        pool = self.store.pool
        try:
            total = await self.store.count(query)
            await pool.execute(
                "UPDATE log_exports SET lines_total = $2 WHERE export_id = $1", export_id, total
            )
            await asyncio.to_thread(self.folder.mkdir, parents=True, exist_ok=True)
            done = 0
            with path.open("w", encoding="utf-8") as out:
                async for lines in self.store.scan(replace(query, order="oldest"), self.batch):
                    text = "".join(_render(line, fmt) + "\n" for line in lines)
                    await asyncio.to_thread(out.write, text)
                    done += len(lines)
                    await pool.execute(
                        """UPDATE log_exports SET lines_done = $2, heartbeat_at = clock_timestamp()
                           WHERE export_id = $1""",
                        export_id,
                        done,
                    )
            await pool.execute(
                """UPDATE log_exports SET state = 'done', lines_done = $2, lines_total = $2,
                          finished_at = clock_timestamp() WHERE export_id = $1""",
                export_id,
                done,
            )
        except Exception as exc:
            log.exception("export %s failed", export_id)
            await pool.execute(
                """UPDATE log_exports SET state = 'failed', error = $2,
                          finished_at = clock_timestamp() WHERE export_id = $1""",
                export_id,
                f"{type(exc).__name__}: {exc}",
            )

    async def _prune(self, tenant: str, user: str) -> None:
        rows = await self.store.pool.fetch(
            """DELETE FROM log_exports WHERE export_id IN (
                   SELECT export_id FROM log_exports WHERE tenant = $1 AND user_name = $2
                   ORDER BY created_at DESC OFFSET $3)
               RETURNING export_id, path""",
            tenant,
            user,
            KEEP,
        )
        for row in rows:
            for task in self._running:
                if task.get_name() == f"export-{row['export_id']}":
                    task.cancel()
            if row["path"]:
                await asyncio.to_thread(Path(row["path"]).unlink, missing_ok=True)


def _render(line: LogLine, fmt: str) -> str:
    if fmt == "jsonl":
        return json.dumps(line.to_json())
    return text_line(line)


def _view(row: Any) -> dict[str, Any]:
    return {
        "export_id": row["export_id"],
        "task_id": row["task_id"],
        "query": json.loads(row["query"]),
        "format": row["format"],
        "state": row["state"],
        "lines_done": row["lines_done"],
        "lines_total": row["lines_total"],
        "error": row["error"],
        "created_at": row["created_at"].isoformat(),
        "finished_at": row["finished_at"].isoformat() if row["finished_at"] else None,
    }
