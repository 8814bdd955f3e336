"""The scheduler service: `async def run(ctx)` until cancelled.

Several schedulers may run; one holds the "scheduler" lease and schedules, the
others stand by and take over within seconds when it dies or is cut off
(`runyard.stack.leader`). Every instance serves its HTTP face at once
(`runyard.api.service`: health, readiness, metrics, the pool admin routes and
the queue route of `runyard.scheduler.http`); a standby is ready too (it serves
those routes), and /healthz and /readyz say its `role`.

A term (while the lease is held) loads the pools file (`pools.yaml` of the
config folder), starts a fresh application (`SchedulerApp.start`: registers
pools, rebuilds its memory from the log, plans once), subscribes one
idempotent consumer to the task and pool event topics, and ticks every
`scheduler_tick_s` seconds (5) for time limits (R-08) and pending queue
reports; every `scheduler_sweep_s` seconds (15) the tick also sweeps for what
the consumer should have brought and did not (`SchedulerApp.sweep`). For every
pool runtime.yaml runs on Slurm it keeps the nodes' health in line with Slurm's
(`runyard.scheduler.slurm_nodes`). When the lease may be lost the term is
cancelled at once: its consumer stops and the instance stands by again.

No double booking, even from an instance that has not noticed yet that it lost
the lease: each placement appends `WorkersAllocated` and `TaskPlaced` in one
transaction with the versions of the pool and task streams it read, so it
conflicts with anything another instance appended since (see
`runyard.stack.leader` and `runyard.scheduler.app`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from runyard.api.service import serve_service
from runyard.eventstore import PostgresEventStore, retrying
from runyard.messaging.consumer import IdempotentConsumer, make_broker
from runyard.scheduler.app import IGNORED, SchedulerApp
from runyard.scheduler.config import PoolConfig, load_pools_file
from runyard.scheduler.http import http_app
from runyard.scheduler.slurm_nodes import SlurmNodeWatch, slurm_pools
from runyard.scheduler.views import ensure_schema
from runyard.stack.context import ServiceContext
from runyard.stack.leader import Leadership, Lease, Role
from runyard.telemetry.metrics import GaugeReading, register_gauge

log = logging.getLogger("runyard.scheduler")

NAME = "scheduler"
CONSUMER = "scheduler"
TICK_S = 5.0
#: Seconds between anti-entropy sweeps (`SchedulerApp.sweep`).
SWEEP_S = 15.0
#: How long the end of a term waits for its consumer to stop (its handler may be waiting
#: out a database outage: the term's events must not be left to it).
TERM_STOP_S = 120.0


class SchedulerService:
    """One scheduler instance: its lease, and the application of its current term."""

    def __init__(self, ctx: ServiceContext, store: PostgresEventStore) -> None:
        self.ctx = ctx
        self.store = store
        # A term may wait TERM_STOP_S for its consumer: only past that is it stuck.
        self.leadership = Leadership.for_service(ctx, NAME, stop_within_s=TERM_STOP_S + 30)
        #: The application of the current term (None while standing by).
        self.app: SchedulerApp | None = None

    @property
    def role(self) -> Role:
        return self.leadership.role

    async def schedule(self, _lease: Lease) -> None:
        """One term: a fresh application rebuilt from the log, its consumer and its
        ticks, until cancelled (the lease lost, or the service stopping)."""
        pools: list[PoolConfig] = load_pools_file(self.ctx.config_dir / "pools.yaml")
        sweep_s = float(self.ctx.settings.get("scheduler_sweep_s", SWEEP_S))
        app = SchedulerApp(self.store, pools, sweep_s=sweep_s)
        await retrying(app.start, component="scheduler start")
        app.defer_planning = True  # one placement pass per consumer batch
        broker = make_broker(self.ctx.kafka)
        consumer = IdempotentConsumer(
            CONSUMER,
            pool=self.store.pool,
            mapper=self.ctx.mapper,
            handler=app.handle,
            kafka=self.ctx.kafka,
            after_batch=app.after_batch,
            event_types=frozenset(self.ctx.mapper.models) - IGNORED,
        )
        topics = self.ctx.kafka.topics
        consumer.subscribe(broker, topics.task_events, topics.pool_events)
        self.app = app
        # Node truth of the pools Slurm runs (runtime.yaml `pools:`): one watch each.
        watches = [
            asyncio.create_task(
                SlurmNodeWatch(self.store, pool, slurm_conf=conf, partition=partition).run()
            )
            for pool, (conf, partition) in slurm_pools(self.ctx.config("runtime.yaml")).items()
        ]
        try:
            await broker.start()
            tick_s = float(self.ctx.settings.get("scheduler_tick_s", TICK_S))
            while True:
                await asyncio.sleep(tick_s)
                await retrying(app.tick, component="scheduler tick")  # outages are waited out
        finally:
            self.app = None
            for watch in watches:
                watch.cancel()
            # The consumer must be gone before another term starts: one left running
            # (its handler waiting out an outage when the lease was lost) would keep
            # partitions for this term's app, and its events would never reach the next.
            try:
                async with asyncio.timeout(TERM_STOP_S):
                    await broker.stop()
            except Exception:
                log.exception("scheduler: the term's consumer did not stop")

    async def ready(self) -> Mapping[str, float]:
        """Ready when its database answers, active or standby (both serve the routes)."""
        await self.store.pool.fetchval("SELECT 1")  # an outage raises: not ready
        return {}


#: The instances running in this process (one, but for tests that run several), for
#: the queue length gauge, which is one per process.
_RUNNING: set[SchedulerService] = set()


def queue_lengths() -> GaugeReading:
    """Tasks waiting per pool, as the active term holds them (nothing on a standby)."""
    return [
        (len(runtime.queue), {"pool": pool})
        for service in list(_RUNNING)
        if (app := service.app) is not None
        for pool, runtime in app.pools.items()
    ]


async def run(ctx: ServiceContext) -> None:
    """Serve the HTTP face, and schedule while holding the lease, until cancelled."""
    store = await retrying(
        lambda: PostgresEventStore.connect(ctx.dsn, ctx.mapper, min_size=2, max_size=8),
        component="scheduler store",
    )
    service = SchedulerService(ctx, store)
    _RUNNING.add(service)
    unregister = register_gauge(
        "runyard_scheduler_queue_length",
        "Tasks waiting in each pool's queue (reported by the active scheduler).",
        queue_lengths,
    )
    try:
        await retrying(lambda: ensure_schema(store.pool), component="scheduler migrations")
        app = http_app(store, role=lambda: service.role, ready=service.ready)
        serving = serve_service(NAME, app, settings=ctx.settings, endpoints=ctx.endpoints)
        async with asyncio.TaskGroup() as group:
            group.create_task(serving, name="scheduler-http")
            group.create_task(service.leadership.run(service.schedule), name="scheduler-work")
    finally:
        _RUNNING.discard(service)
        if not _RUNNING:
            unregister()
        await store.close()
