"""The deployer service: `async def run(ctx)` until cancelled.

It builds the local runtime from `runtime.yaml` of the config folder (its
`local:` section: image catalogue, scratch and volume roots, stop grace), and
one runtime per pool its `pools:` section sends elsewhere (`runtime: slurm`:
`runyard.deployer.slurm`), each deployment going to its task's pool's runtime,
starts `DeployerApp`, and subscribes one idempotent consumer to the task
event topic. Worker output goes to the `runyard.logs` topic, one JSON record
per line (time, task, run, attempt, worker, stream, line); workers write to
files, so a slow or absent broker never stalls a worker: the runtime retries
a line until the broker takes it and only then moves its saved offset on. On
cancel every worker it started is stopped; what cannot be recorded then stays
on disk for the next deployer.

The producer is connected first; then, before the consumer starts,
`DeployerApp.reconcile` takes over what an earlier
deployer process left (workers still running, exits nobody recorded,
deployments cut mid-stage, placements nobody deployed); see docs/deployer.md.
Then every `deployer_sweep_s` (15 s) `DeployerApp.sweep` acts on a placement or
a stop request the consumer never handed over.
`runtime.yaml`'s `deployer:` section may cap restart delays
(`max_restart_delay_s`, for development stacks).

Commands: the deployer reads its command topic (`runyard.deployer-commands`,
created here when missing) in a consumer group of its own node agent
(`deployer-commands`, or `deployer-commands.<deployer_node_agent>` when that
setting names the agent), so every agent sees every command and carries out
those for the workers it holds: `CaptureStacks` dumps an attempt's stacks and
appends `StacksCaptured` (`DeployerApp.capture_stacks`).

HTTP: /healthz, /readyz and /metrics (`runyard.api.service`) on the port the
settings give (`deployer_socket`, `deployer_port`, RUNYARD_SERVICE_PORT).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Awaitable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from aiokafka.structs import RecordMetadata
from runyard.api.service import bind, serve_service, service_app
from runyard.contracts.commands import (
    DEPLOYER_COMMANDS,
    DEPLOYER_COMMANDS_PARTITIONS,
    CaptureStacks,
    parse_command,
)
from runyard.contracts.rpc import credential
from runyard.deployer.app import REACTS_TO, DeployerApp
from runyard.deployer.keeper import BrokerWatch, LogServiceLines, OutputKeeper
from runyard.deployer.masking import SecretMasks
from runyard.deployer.pools import PoolRuntimes, build_runtimes
from runyard.deployer.retry import until_done
from runyard.deployer.runtime import LocalRuntime, OutputLine, flag
from runyard.eventstore import PostgresEventStore
from runyard.messaging import KafkaSettings
from runyard.messaging.consumer import IdempotentConsumer, make_broker, read_again_if_lost
from runyard.messaging.topics import LOGS, PARTITIONS
from runyard.stack.context import ServiceContext

CONSUMER = "deployer"
#: The GIL switch interval of the deployer process (see `run`).
SWITCH_INTERVAL_S = 0.001
#: How long a starting deployer tries to compare the broker with what it acknowledged.
FIRST_LOOK_S = 15.0
COMMANDS_GROUP = "deployer-commands"
log = logging.getLogger("runyard.deployer")


async def ensure_command_topic(kafka: KafkaSettings) -> None:
    """Create the deployer's command topic with its partition count, if missing."""
    admin = AIOKafkaAdminClient(**kafka.client_options())
    await admin.start()
    try:
        name = kafka.topics.name(DEPLOYER_COMMANDS)
        if name not in set(await admin.list_topics()):
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics([NewTopic(name, DEPLOYER_COMMANDS_PARTITIONS, 1)])
    finally:
        await admin.close()


async def follow_commands(app: DeployerApp, kafka: KafkaSettings, group: str) -> None:
    """Carry out the commands of the deployer's topic, until cancelled.

    Each command runs in the background (a capture must not hold up the next
    one); offsets are committed once read: a command is worth doing only while
    its asker waits, so one lost in a crash is not redone. After a broker that lost
    its memory, a position past the topic's end is read from the start again: what
    is there came after the loss, so its askers may still wait."""
    consumer = AIOKafkaConsumer(
        kafka.topics.name(DEPLOYER_COMMANDS),
        **kafka.client_options(),
        group_id=kafka.topics.prefix + group,
        enable_auto_commit=False,
        **kafka.consumer_options(),
    )
    running: set[asyncio.Task[object]] = set()
    try:
        await consumer.start()
        while True:
            batches = await consumer.getmany(timeout_ms=200, max_records=100)
            # A broker that lost its memory: what it got since is read from its start.
            await read_again_if_lost(group, consumer, consumer.assignment())
            for message in (m for part in batches.values() for m in part):
                command = parse_command(message.value)
                if isinstance(command, CaptureStacks):
                    task = asyncio.create_task(app.capture_stacks(command))
                    running.add(task)
                    task.add_done_callback(running.discard)
                    task.add_done_callback(_log_failure)
            if batches:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(5):
                        await consumer.commit()
    finally:
        for pending in running:
            pending.cancel()
        with contextlib.suppress(Exception):
            await consumer.stop()


def _log_failure(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("deployer command failed", exc_info=task.exception())


def build_runtime(ctx: ServiceContext, *, keep_output: bool = False) -> LocalRuntime | PoolRuntimes:
    """The local runtime, or one runtime per pool when runtime.yaml's `pools:` names
    another (`runtime: slurm`; see runyard.deployer.pools)."""
    return build_runtimes(
        ctx.config("runtime.yaml"),
        data_dir=ctx.data_dir,
        base_dir=ctx.config_dir,
        keep_output=keep_output,
    )


class LogsTopicEnds:
    """The end offsets of the logs topic's partitions (`BrokerWatch`'s probe), from a
    consumer of no group, started at the first call."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self.consumer = AIOKafkaConsumer(**kafka.client_options(), enable_auto_commit=False)
        self.partitions = [TopicPartition(kafka.topics.logs, p) for p in range(PARTITIONS[LOGS])]
        self.started = False

    async def __call__(self) -> dict[int, int]:
        if not self.started:
            await self.consumer.start()
            self.started = True
        async with asyncio.timeout(10):
            ends = await self.consumer.end_offsets(self.partitions)
        return {tp.partition: offset for tp, offset in ends.items()}

    async def close(self) -> None:
        """Stop the consumer (started or not: an unstopped one warns when collected)."""
        with contextlib.suppress(Exception):
            await self.consumer.stop()


async def run(ctx: ServiceContext) -> None:
    """Run the deployer until cancelled."""
    # The event loop makes many short system calls (files, sockets); after each it
    # waits for the GIL while the runtime's threads (cleanups, namespace setup) hold
    # it, up to the switch interval (5 ms by default). 1 ms: measured in
    # benchmarks/e2e.py, about a quarter more tasks per second under a burst.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # The port first (see runyard.faulttolerance.main: a given port is only free so long).
    sock = bind("deployer", ctx.settings)
    settings = {**ctx.settings, "deployer_socket": sock}
    try:
        store = await PostgresEventStore.connect(ctx.dsn, ctx.mapper, min_size=2, max_size=8)
    except BaseException:  # cancelled or failed while connecting: the port goes back
        sock.close()
        raise
    broker = make_broker(ctx.kafka)
    logs_topic = ctx.kafka.topics.logs
    options = ctx.config("runtime.yaml").get("deployer") or {}
    runtime = build_runtime(ctx, keep_output=bool(options.get("keep_output", True)))
    watch = BrokerWatch(runtime.config.scratch_root / "logs-topic-acked.json")

    masks = SecretMasks(store)  # a worker's line never carries its task's secrets

    async def republish(line: OutputLine) -> RecordMetadata:
        record = (await masks.masked(line)).record()
        return await broker.publish(record.to_bytes(), topic=logs_topic, key=record.key())

    class Publish:
        """The runtime's sink: each stream's lines one after the other (the watch
        notices an offset going back), confirmed in the order handed over.

        `submit` (the runtime's pipelined pump) sends through a plain producer of its
        own: the broker's publish wraps every message in a trace span and metrics,
        which cost about half of the deployer's time per line. A line is keyed as
        through the broker (its partition is the same). Calling it (a line again after
        a failure, with backoff) goes through the broker."""

        def __init__(self) -> None:
            self.producer: AIOKafkaProducer | None = None
            self.starting = asyncio.Lock()  # one producer for every deployment's pump

        async def __call__(self, line: OutputLine) -> None:
            self.saw(line, await republish(line))

        async def submit(self, line: OutputLine) -> Awaitable[object]:
            record = (await masks.masked(line)).record()
            producer = self.producer or await self._start()
            future: asyncio.Future[RecordMetadata] = await producer.send(
                logs_topic, record.to_bytes(), key=record.key()
            )
            future.add_done_callback(
                lambda f: f.cancelled() or f.exception() or self.saw(line, f.result())
            )
            return future

        async def _start(self) -> AIOKafkaProducer:
            async with self.starting:
                return self.producer or await self._new()

        async def _new(self) -> AIOKafkaProducer:
            producer = AIOKafkaProducer(
                **ctx.kafka.client_options(),
                enable_idempotence=False,  # as the relay: the embedded broker rejects it
                acks=1,
                linger_ms=2,
                request_timeout_ms=ctx.kafka.request_timeout_ms,
            )
            try:
                await producer.start()
            except BaseException:
                await producer.stop()
                raise
            self.producer = producer
            return producer

        async def close(self) -> None:
            if self.producer is not None:
                await self.producer.stop()

        @staticmethod
        def saw(line: OutputLine, acked: RecordMetadata) -> None:
            stream = (line.task_id, line.run, line.attempt, line.worker, line.stream)
            watch.saw(stream, acked.partition, acked.offset)

    publish = Publish()

    keep_workers = flag(options, "keep_workers_on_stop", False, section="deployer")
    cap = options.get("max_restart_delay_s")
    app = DeployerApp(
        store,
        runtime,
        on_output=publish,
        max_restart_delay_s=float(cap) if cap is not None else None,
    )
    app.sweep_s = float(ctx.settings.get("deployer_sweep_s", app.sweep_s))
    stored = LogServiceLines(ctx.endpoints, credential.service_token(ctx.settings, ctx.data_dir))
    agent = ctx.settings.get("deployer_node_agent")
    group = f"{COMMANDS_GROUP}.{agent}" if agent else COMMANDS_GROUP

    async def ready() -> dict[str, float]:
        await store.pool.fetchval("SELECT 1")
        return {}

    http = asyncio.create_task(
        serve_service(
            "deployer",
            service_app("deployer", ready=ready),
            settings=settings,
            endpoints=ctx.endpoints,
        )
    )
    commands: asyncio.Task[None] | None = None
    keeping: asyncio.Task[None] | None = None
    sweeping: asyncio.Task[None] | None = None
    ends = LogsTopicEnds(ctx.kafka)
    keeper = OutputKeeper(runtime, stored, republish, watch=watch, probe=ends)
    try:
        consumer = IdempotentConsumer(
            CONSUMER,
            pool=store.pool,
            mapper=ctx.mapper,
            handler=app.handle,
            kafka=ctx.kafka,
            event_types=REACTS_TO,
            isolated=False,  # the handler only starts background work
        )
        consumer.subscribe(broker, ctx.kafka.topics.task_events)
        # The producer first: adopted workers' output (the rest of it, from the saved
        # offsets) is published from the moment reconcile adopts them. Consuming starts
        # after reconcile, so placements are never deployed twice.
        await until_done(
            broker.connect,
            what="connecting to the broker",
            component="deployer (broker)",
            any_error=True,
        )
        # Before any adopted worker's output goes out: did the broker lose lines while
        # this deployer was away? (Its acknowledged offsets are on disk.)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(FIRST_LOOK_S):
                await until_done(
                    keeper.look,
                    what="asking the broker for the logs topic's end offsets",
                    component="deployer (broker)",
                    any_error=True,
                )
        taken = await app.reconcile()
        if taken:
            log.info("took over %d task(s) from an earlier deployer: %s", len(taken), taken)
        await broker.start()
        await until_done(
            lambda: ensure_command_topic(ctx.kafka),
            what="creating the command topic",
            component="deployer (broker)",
            any_error=True,
        )
        commands = asyncio.create_task(follow_commands(app, ctx.kafka, group))
        keeping = asyncio.create_task(keeper.run())
        sweeping = asyncio.create_task(app.sweep_forever())
        running = [http, commands, keeping, sweeping]
        await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        for done in running:
            if done.done():
                done.result()  # a server or consumer that ended is an error of the service
        raise RuntimeError(
            "the deployer's HTTP face, command consumer, output keeper or sweep ended"
        )
    finally:
        for task in (sweeping, keeping, commands, http):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        with contextlib.suppress(Exception):
            await app.close(keep_workers=keep_workers)
        with contextlib.suppress(Exception):
            await broker.stop()
        with contextlib.suppress(Exception):
            await publish.close()
        await ends.close()
        await stored.close()
        sock.close()
        await store.close()
