"""The scheduler service: `async def run(ctx)` until cancelled.

It loads the pools file (`pools.yaml` of the config folder), starts the
application (`SchedulerApp.start`: registers pools, rebuilds its memory from
the log, plans once), subscribes one idempotent consumer to the task and pool
event topics, and ticks every `tick_s` seconds for time limits (R-08) and
pending queue reports. The running app is published in `ctx.settings`
(`scheduler_app`) for in-process use; admin changes made elsewhere (the
gateway's admin API, `runyard.scheduler.admin`) reach it as pool events.
"""

from __future__ import annotations

import asyncio
import contextlib

from runyard.eventstore import PostgresEventStore, retrying
from runyard.messaging.consumer import IdempotentConsumer, make_broker
from runyard.scheduler.app import IGNORED, SchedulerApp
from runyard.scheduler.config import load_pools_file
from runyard.stack.context import ServiceContext

CONSUMER = "scheduler"
TICK_S = 5.0


async def run(ctx: ServiceContext) -> None:
    """Run the scheduler until cancelled."""
    store = await PostgresEventStore.connect(ctx.dsn, ctx.mapper, min_size=2, max_size=8)
    broker = make_broker(ctx.kafka)
    try:
        app = SchedulerApp(store, load_pools_file(ctx.config_dir / "pools.yaml"))
        await app.start()
        ctx.settings["scheduler_app"] = app
        app.defer_planning = True  # one placement pass per consumer batch
        consumer = IdempotentConsumer(
            CONSUMER,
            pool=store.pool,
            mapper=ctx.mapper,
            handler=app.handle,
            kafka=ctx.kafka,
            after_batch=app.after_batch,
            event_types=frozenset(ctx.mapper.models) - IGNORED,
        )
        consumer.subscribe(broker, ctx.kafka.topics.task_events, ctx.kafka.topics.pool_events)
        await broker.start()
        tick_s = float(ctx.settings.get("scheduler_tick_s", TICK_S))
        while True:
            await asyncio.sleep(tick_s)
            await retrying(app.tick, component="scheduler tick")  # outages are waited out
    finally:
        with contextlib.suppress(Exception):
            await broker.stop()
        await store.close()
