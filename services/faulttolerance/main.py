"""The fault-tolerance service: `async def run(ctx)` until cancelled.

It subscribes one idempotent consumer to the task and pool event topics
(`FaultToleranceApp.handle`), reads the `runyard.logs` topic in its own
consumer group (`follow_logs`: the logs batch consumer of `runyard.messaging.batches`
feeding `on_log`; log lines are not events, so no inbox: a redelivered line is
harmless, detections are idempotent per attempt), ticks once a second
for hang timers and resume deadlines, and serves its HTTP face
(`runyard.api.service`: /healthz, /readyz, /metrics and the routes of
`runyard.faulttolerance.http`) on the port the settings give
(`faulttolerance_socket`, `faulttolerance_port`, RUNYARD_SERVICE_PORT).

Stack captures (after a hang, or on demand) are `CaptureStacks` commands on
the deployer's command topic (`runyard.contracts.commands`), keyed by task;
the deployer that holds the workers answers with `StacksCaptured`.

Settings: `faulttolerance_tick_s` (1 s), `faulttolerance_resume_wait_s` (600 s:
how long after a restart a checkpoint-load line is awaited; tests shorten it),
`faulttolerance_stacks_wait_s` (20 s: how long a capture is awaited).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from functools import partial

from faststream.kafka import KafkaBroker
from runyard.api.security import TokenAuthenticator
from runyard.api.service import bind, serve_service, service_app
from runyard.contracts.commands import DEPLOYER_COMMANDS, CaptureStacks
from runyard.contracts.loglines import LogRecord
from runyard.eventstore import PostgresEventStore, retrying
from runyard.faulttolerance.app import RESUME_WAIT_S, STACKS_WAIT_S, FaultToleranceApp
from runyard.faulttolerance.http import faulttolerance_router
from runyard.faulttolerance.reports import StackReportStore
from runyard.messaging import KafkaSettings
from runyard.messaging.batches import LogBatchConsumer
from runyard.messaging.consumer import IdempotentConsumer, make_broker
from runyard.stack.context import ServiceContext

log = logging.getLogger("runyard.faulttolerance")

CONSUMER = "faulttolerance"
LOGS_GROUP = "faulttolerance-logs"
TICK_S = 1.0
NAME = "faulttolerance"


class KafkaDeployerCommands:
    """Commands to the deployer on its topic, keyed by task (one task's stay in order)."""

    def __init__(self, broker: KafkaBroker, kafka: KafkaSettings) -> None:
        self.broker = broker
        self.topic = kafka.topics.name(DEPLOYER_COMMANDS)

    async def send(self, command: CaptureStacks) -> None:
        await self.broker.publish(
            command.to_bytes(), topic=self.topic, key=command.task_id.encode()
        )


async def follow_logs(app: FaultToleranceApp, kafka: KafkaSettings) -> None:
    """Feed every line of the logs topic to `app.on_log`, one after the other, until
    cancelled; a batch's offsets are committed once each of its lines was handled."""

    async def on_lines(lines: list[LogRecord]) -> None:
        for line in lines:
            try:  # a database outage is waited out: the line is not dropped
                await retrying(partial(app.on_log, line), component="log follower")
            except Exception:
                log.exception("log line of %s not handled", line.task_id)

    await LogBatchConsumer(LOGS_GROUP, kafka=kafka, handler=on_lines, max_records=2000).run()


async def run(ctx: ServiceContext) -> None:
    """Run the fault-tolerance service until cancelled."""
    # The port first: connecting takes seconds, and a port given to this service is
    # only free until something else (an outgoing connection) takes it.
    sock = bind(NAME, ctx.settings)
    settings = {**ctx.settings, f"{NAME}_socket": sock}
    try:
        store = await PostgresEventStore.connect(ctx.dsn, ctx.mapper, min_size=2, max_size=8)
    except BaseException:  # cancelled or failed while connecting: the port goes back
        sock.close()
        raise
    broker = make_broker(ctx.kafka)
    background: list[asyncio.Task[None]] = []
    try:
        reports = StackReportStore(store.pool)
        await reports.migrate()
        app = FaultToleranceApp(
            store,
            reports=reports,
            deployer=KafkaDeployerCommands(broker, ctx.kafka),
            resume_wait_s=float(ctx.settings.get("faulttolerance_resume_wait_s", RESUME_WAIT_S)),
            stacks_wait_s=float(ctx.settings.get("faulttolerance_stacks_wait_s", STACKS_WAIT_S)),
        )

        async def ready() -> dict[str, float]:
            await store.pool.fetchval("SELECT 1")
            return {}

        router = faulttolerance_router(app, reports, TokenAuthenticator(store.pool))
        face = service_app(NAME, routers=[router], ready=ready)
        background.append(
            asyncio.create_task(
                serve_service(NAME, face, settings=settings, endpoints=ctx.endpoints)
            )
        )
        consumer = IdempotentConsumer(
            CONSUMER, pool=store.pool, mapper=ctx.mapper, handler=app.handle, kafka=ctx.kafka
        )
        consumer.subscribe(broker, ctx.kafka.topics.task_events, ctx.kafka.topics.pool_events)
        await broker.start()
        background.append(asyncio.create_task(follow_logs(app, ctx.kafka)))
        await _tick(app, float(ctx.settings.get("faulttolerance_tick_s", TICK_S)), background)
    finally:
        for task in background:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        with contextlib.suppress(Exception):
            await broker.stop()
        sock.close()
        await store.close()


async def _tick(app: FaultToleranceApp, tick_s: float, watched: list[asyncio.Task[None]]) -> None:
    """`app.tick()` every `tick_s`, until cancelled or one of `watched` ends (an error)."""
    while True:
        await asyncio.sleep(tick_s)
        for task in watched:
            if task.done():
                task.result()
                raise RuntimeError(f"{NAME}: a part of the service ended")
        try:
            await app.tick()
        except Exception:
            log.exception("fault-tolerance tick failed")
