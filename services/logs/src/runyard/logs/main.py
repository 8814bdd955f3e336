"""The log service: `async def run(ctx)` until cancelled.

It applies its migrations, reads the `runyard.logs` topic into Postgres in
batches (`LogIngester`), once an hour creates the day partitions ahead and
drops those past retention, and serves its HTTP face (`runyard.api.service`:
health, readiness, metrics and the log routes of `runyard.logs.http`, which
the gateway routes authenticated requests to). Settings (`logs.yaml` of the
config folder, or `ctx.settings["logs"]`): `retention_days` (30),
`ingest_parts` (4: connections each batch is written on at once, split by
worker stream), `ingest_writers` (1: batches written at once). Exports are
written under `<data dir>/exports`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import UTC, datetime

import asyncpg
from fastapi import FastAPI
from runyard.api.security import TokenAuthenticator
from runyard.api.service import serve_service, service_app
from runyard.contracts.rpc import credential
from runyard.eventstore import PostgresEventStore
from runyard.logs.http import LogApi, internal_router, logs_router
from runyard.logs.ingest import LogIngester
from runyard.logs.slots import (
    FOLLOWS_PER_TENANT,
    SEARCH_WAIT_S,
    SEARCHES_AT_ONCE,
    SEARCHES_PER_TENANT,
    OpenFollows,
    SearchSlots,
)
from runyard.logs.store import DEFAULT_PARTS, DEFAULT_RETENTION_DAYS, QUERY_TIMEOUT_S, LogStore
from runyard.stack.context import ServiceContext

log = logging.getLogger("runyard.logs")
MAINTENANCE_EVERY_S = 3600.0
NAME = "logs"


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


def http_app(api: LogApi, pool: asyncpg.Pool, service_token: str) -> FastAPI:
    """The log service's HTTP face: health, readiness (its database answers), its routes
    (and the internal ones, for callers with the platform's `service_token`)."""

    async def ready() -> Mapping[str, float]:
        await pool.fetchval("SELECT 1")  # an outage raises: not ready
        return {}

    routers = [
        logs_router(api, TokenAuthenticator(pool)),
        internal_router(api.store, service_token),
    ]
    return service_app(NAME, routers=routers, ready=ready)


async def run(ctx: ServiceContext) -> None:
    """Ingest worker output, keep partitions and serve the log routes until cancelled."""
    config = {**ctx.config("logs.yaml"), **ctx.settings.get("logs", {})}
    retention = int(config.get("retention_days", DEFAULT_RETENTION_DAYS))
    parts = max(1, int(config.get("ingest_parts", DEFAULT_PARTS)))
    searches = SearchSlots(
        int(config.get("searches_at_once", SEARCHES_AT_ONCE)),
        int(config.get("searches_per_tenant", SEARCHES_PER_TENANT)),
    )
    # the parts of a batch, the searches at once, and the log routes' other reads
    pool = await asyncpg.create_pool(ctx.dsn, min_size=1, max_size=parts + searches.total + 2)
    store = LogStore(
        pool,
        retention_days=retention,
        parts=parts,
        query_timeout_s=float(config.get("query_timeout_s", QUERY_TIMEOUT_S)),
        searches=searches,
        search_wait_s=float(config.get("search_wait_s", SEARCH_WAIT_S)),
    )
    follows = OpenFollows(int(config.get("follows_per_tenant", FOLLOWS_PER_TENANT)))
    events = PostgresEventStore(pool, ctx.mapper)
    api = LogApi(events, store, ctx.data_dir / "exports", follows=follows)
    try:
        await store.migrate()
        await store.maintain(datetime.now(UTC))
        await api.recover()
        ingester = LogIngester(store, ctx.kafka, writers=int(config.get("ingest_writers", 1)))
        app = http_app(api, pool, credential.service_token(ctx.settings, ctx.data_dir))
        serving = serve_service(NAME, app, settings=ctx.settings, endpoints=ctx.endpoints)
        tasks = [
            asyncio.create_task(ingester.run(), name="logs-ingest"),
            asyncio.create_task(maintain_forever(store), name="logs-maintenance"),
            asyncio.create_task(serving, name="logs-http"),
        ]
        try:
            # `wait`, not `gather`: cancelling it leaves the tasks alone, so each is
            # cancelled once below and can close its consumer undisturbed.
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # a crash of any is the service's crash
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await api.close()
        await pool.close()
