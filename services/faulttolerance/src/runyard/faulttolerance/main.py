"""The fault-tolerance service: `async def run(ctx)` until cancelled.

It reads a task's events and its worker lines together: one consumer in group
`faulttolerance` (`runyard.messaging.copartition.CoPartitionedConsumer`) over the
task event topic (`FaultToleranceApp.handle` behind the idempotent consumer's
inbox) and the `runyard.logs` topic (`on_log`; lines are not events, so no inbox:
a redelivered line is harmless, detections are idempotent per attempt). Both
topics are keyed by the task's stream id and read with the range assignor, so N
instances share the tasks: each holds the same partition numbers of both topics,
and with them every event and line of its tasks, which its in-memory watches
need. A rebalance drops the watches of the tasks an instance gives up.

Pool events (node faults) concern tasks of every partition, so every instance
reads all of them, in a group of its own (`faulttolerance-pools-<instance>`), and
acts for the tasks it watches. The instance name is `faulttolerance_instance` in
the settings, else RUNYARD_INSTANCE, else `0`; give each instance its own (and
keep it across restarts: it names the group whose offsets it resumes from).

It ticks once a second for hang timers and resume deadlines, and serves its HTTP
face (`runyard.api.service`: /healthz, /readyz, /metrics and the routes of
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
import os
import re
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from faststream.kafka import KafkaBroker
from runyard.api.security import TokenAuthenticator
from runyard.api.service import bind, serve_service, service_app
from runyard.contracts.commands import DEPLOYER_COMMANDS, CaptureStacks
from runyard.contracts.loglines import LogRecord
from runyard.eventstore import PostgresEventStore, retrying
from runyard.faulttolerance.app import RESUME_WAIT_S, STACKS_WAIT_S, FaultToleranceApp
from runyard.faulttolerance.http import faulttolerance_router
from runyard.faulttolerance.reports import StackReportStore
from runyard.faulttolerance.watched import WatchedTasks
from runyard.messaging import KafkaSettings
from runyard.messaging.consumer import IdempotentConsumer, make_broker
from runyard.messaging.copartition import CoPartitionedConsumer
from runyard.messaging.progress import partition_of
from runyard.messaging.topics import PARTITIONS, TASK_EVENTS
from runyard.stack.context import ServiceContext

log = logging.getLogger("runyard.faulttolerance")

CONSUMER = "faulttolerance"
#: Each instance's own group on the pool event topic: `<POOLS_GROUP>-<instance>`.
POOLS_GROUP = "faulttolerance-pools"
_INSTANCE = re.compile(r"[A-Za-z0-9._-]{1,64}")
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


def line_handler(app: FaultToleranceApp) -> Callable[[list[LogRecord]], Awaitable[None]]:
    """Lines to `app.on_log`, one after the other; a database outage is waited out
    (the line is not dropped), any other error is logged and the next line follows."""

    async def on_lines(lines: list[LogRecord]) -> None:
        for line in lines:
            try:
                await retrying(partial(app.on_log, line), component="log follower")
            except Exception:
                log.exception("log line of %s not handled", line.task_id)

    return on_lines


def instance_name(settings: dict[str, Any]) -> str:
    """This instance's name (see the module): settings, RUNYARD_INSTANCE, or `0`."""
    name = str(settings.get(f"{NAME}_instance") or os.environ.get("RUNYARD_INSTANCE") or "0")
    if not _INSTANCE.fullmatch(name):
        raise ValueError(
            f"fault-tolerance instance name {name!r}: use 1-64 letters, digits, '.', '_'"
            " or '-' (it names a consumer group)"
        )
    return name


def watched_tasks(
    app: FaultToleranceApp, store: PostgresEventStore, kafka: KafkaSettings
) -> CoPartitionedConsumer:
    """The task events and lines of the tasks whose partitions this instance holds."""
    # The handler appends through the store, never through the batch's connection.
    events = IdempotentConsumer(
        CONSUMER,
        pool=store.pool,
        mapper=store.mapper,
        handler=app.handle,
        kafka=kafka,
        isolated=False,
    )
    partitions = PARTITIONS[TASK_EVENTS]

    def of(numbers: set[int]) -> Callable[[str], bool]:
        return lambda task_id: partition_of(f"task-{task_id}", partitions) in numbers

    async def revoked(numbers: set[int]) -> None:
        app.drop(of(numbers))

    async def assigned(numbers: set[int]) -> None:
        await retrying(partial(app.adopt, of(numbers)), component="takeover")

    return CoPartitionedConsumer(
        events,
        kafka=kafka,
        on_lines=line_handler(app),
        on_revoked=revoked,
        on_assigned=assigned,
    )


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
            watched=WatchedTasks(store.pool),
            deployer=KafkaDeployerCommands(broker, ctx.kafka),
            resume_wait_s=float(ctx.settings.get("faulttolerance_resume_wait_s", RESUME_WAIT_S)),
            stacks_wait_s=float(ctx.settings.get("faulttolerance_stacks_wait_s", STACKS_WAIT_S)),
        )

        tasks = watched_tasks(app, store, ctx.kafka)

        async def ready() -> dict[str, float]:
            await store.pool.fetchval("SELECT 1")
            # Not before it holds its tasks' partitions: a task run meanwhile would be
            # seen only once it ended, too late for its watches.
            return {} if tasks.assignment() else {"task consumer group": 0.0}

        router = faulttolerance_router(app, reports, TokenAuthenticator(store.pool))
        face = service_app(NAME, routers=[router], ready=ready)
        background.append(
            asyncio.create_task(
                serve_service(NAME, face, settings=settings, endpoints=ctx.endpoints)
            )
        )
        pools = IdempotentConsumer(
            f"{POOLS_GROUP}-{instance_name(ctx.settings)}",
            pool=store.pool,
            mapper=ctx.mapper,
            handler=app.handle,
            kafka=ctx.kafka,
            isolated=False,
        )
        pools.subscribe(broker, ctx.kafka.topics.pool_events)
        tasks.events.attach(broker, ctx.kafka.topics.task_events)
        # Each consumer's start waits for its group to assign it partitions (a join,
        # seconds): the task consumer joins while the pool consumer does. It may hand
        # its handler events from then on, which can publish: the broker's producer is
        # connected first.
        await broker.connect()
        background.append(asyncio.create_task(tasks.run()))
        await broker.start()
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
