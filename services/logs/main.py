"""The log service: `async def run(ctx)` until cancelled.

It applies its migrations, reads the `runyard.logs` topic into Postgres in
batches (`LogIngester`), and once an hour creates the day partitions ahead
and drops those past retention. Settings (`logs.yaml` of the config folder,
or `ctx.settings["logs"]`): `retention_days` (30), `ingest_writers` (1: batches
written at once; more helps on a many-core database, not on a 2-core one).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import asyncpg
from runyard.logs.ingest import LogIngester
from runyard.logs.store import DEFAULT_RETENTION_DAYS, LogStore
from runyard.stack.context import ServiceContext

log = logging.getLogger("runyard.logs")
MAINTENANCE_EVERY_S = 3600.0


async def maintain_forever(store: LogStore, every_s: float = MAINTENANCE_EVERY_S) -> None:
    """Partitions ahead, retention behind, every `every_s` seconds."""
    while True:
        try:
            dropped = await store.maintain(datetime.now(UTC))
            if dropped:
                log.info("retention dropped %s", ", ".join(dropped))
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):  # e.g. an outage
            log.exception("log partition maintenance failed; next try in %ss", every_s)
        await asyncio.sleep(every_s)


async def run(ctx: ServiceContext) -> None:
    """Ingest worker output and keep partitions until cancelled."""
    config = {**ctx.config("logs.yaml"), **ctx.settings.get("logs", {})}
    retention = int(config.get("retention_days", DEFAULT_RETENTION_DAYS))
    pool = await asyncpg.create_pool(ctx.dsn, min_size=1, max_size=4)
    store = LogStore(pool, retention_days=retention)
    try:
        await store.migrate()
        await store.maintain(datetime.now(UTC))
        ingester = LogIngester(store, ctx.kafka, writers=int(config.get("ingest_writers", 1)))
        ctx.settings["log_ingester"] = ingester
        tasks = [
            asyncio.create_task(ingester.run(), name="logs-ingest"),
            asyncio.create_task(maintain_forever(store), name="logs-maintenance"),
        ]
        try:
            # `wait`, not `gather`: cancelling it leaves the tasks alone, so each is
            # cancelled once below and can close its consumer undisturbed.
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # a crash of either is the service's crash
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await pool.close()
