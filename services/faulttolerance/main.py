"""The fault-tolerance service: `async def run(ctx)` until cancelled.

It subscribes one idempotent consumer to the task and pool event topics
(`FaultToleranceApp.handle`), reads the `runyard.logs` topic in its own
consumer group (`on_log`; log lines are not events, so no inbox: a redelivered
line is harmless, detections are idempotent per attempt), and ticks once a
second for hang timers and resume deadlines.

Worker processes for stack capture: when the deployer runs in the same process
(`runyard up`), its runtime's `pids(key)` (published as
`ctx.settings["deployer_app"].runtime`) says where the workers are; otherwise
no stacks are captured and `HangDetected` still is. The running app is
published as `ctx.settings["faulttolerance_app"]`, and registered by database
(`publish_in_process`) so that an in-process gateway's `POST /v1/tasks/{id}/stacks`
can ask it for an on-demand capture (see `runyard.faulttolerance.http`).

Settings: `faulttolerance_tick_s` (1 s), `faulttolerance_resume_wait_s` (600 s:
how long after a restart a checkpoint-load line is awaited; tests shorten it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from functools import partial
from typing import Any

from aiokafka import AIOKafkaConsumer
from runyard.eventstore import PostgresEventStore, retrying
from runyard.faulttolerance.app import (
    RESUME_WAIT_S,
    DeploymentKey,
    FaultToleranceApp,
    LogLine,
    database_key,
    publish_in_process,
    withdraw_in_process,
)
from runyard.faulttolerance.reports import StackReportStore
from runyard.messaging import KafkaSettings
from runyard.messaging.consumer import IdempotentConsumer, make_broker
from runyard.stack.context import ServiceContext

log = logging.getLogger("runyard.faulttolerance")

CONSUMER = "faulttolerance"
LOGS_GROUP = "faulttolerance-logs"
TICK_S = 1.0


class InProcessDeployer:
    """Worker processes as the in-process deployer's runtime knows them (looked up late)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings

    def pids(self, key: DeploymentKey) -> dict[int, int]:
        app = self.settings.get("deployer_app")
        runtime = getattr(app, "runtime", None)
        pids = getattr(runtime, "pids", None)
        if pids is None:
            return {}
        return dict(pids(key))


async def follow_logs(app: FaultToleranceApp, kafka: KafkaSettings) -> None:
    """Feed every line of the logs topic to `app.on_log`, until cancelled."""
    consumer = AIOKafkaConsumer(
        kafka.topics.logs,
        **kafka.client_options(),
        group_id=kafka.topics.prefix + LOGS_GROUP,
        enable_auto_commit=False,
        **kafka.consumer_options(),
    )
    try:
        await consumer.start()  # inside: a cancel during the group join still stops it
        while True:
            batches = await consumer.getmany(timeout_ms=200, max_records=2000)
            for message in (m for part in batches.values() for m in part):
                line = LogLine.from_bytes(message.value)
                if line is None:
                    continue
                try:  # a database outage is waited out: the line is not dropped
                    await retrying(partial(app.on_log, line), component="log follower")
                except Exception:
                    log.exception("log line of %s not handled", line.task_id)
            if batches:
                with contextlib.suppress(Exception):  # a lost commit is only a redelivery
                    await asyncio.wait_for(consumer.commit(), timeout=5)
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()


async def run(ctx: ServiceContext) -> None:
    """Run the fault-tolerance service until cancelled."""
    store = await PostgresEventStore.connect(ctx.dsn, ctx.mapper, min_size=2, max_size=8)
    broker = make_broker(ctx.kafka)
    logs: asyncio.Task[None] | None = None
    key: str | None = None
    try:
        reports = StackReportStore(store.pool)
        await reports.migrate()
        app = FaultToleranceApp(
            store,
            reports=reports,
            processes=InProcessDeployer(ctx.settings),
            resume_wait_s=float(ctx.settings.get("faulttolerance_resume_wait_s", RESUME_WAIT_S)),
        )
        ctx.settings["faulttolerance_app"] = app
        key = await database_key(store.pool)
        publish_in_process(key, app)
        consumer = IdempotentConsumer(
            CONSUMER, pool=store.pool, mapper=ctx.mapper, handler=app.handle, kafka=ctx.kafka
        )
        consumer.subscribe(broker, ctx.kafka.topics.task_events, ctx.kafka.topics.pool_events)
        await broker.start()
        logs = asyncio.create_task(follow_logs(app, ctx.kafka))
        tick_s = float(ctx.settings.get("faulttolerance_tick_s", TICK_S))
        while True:
            await asyncio.sleep(tick_s)
            try:
                await app.tick()
            except Exception:
                log.exception("fault-tolerance tick failed")
    finally:
        if key is not None:
            withdraw_in_process(key, app)
        if logs is not None:
            logs.cancel()
            with contextlib.suppress(BaseException):
                await logs
        with contextlib.suppress(Exception):
            await broker.stop()
        await store.close()
