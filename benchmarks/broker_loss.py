"""Broker loss benchmark: what the relay publishes again, and the stall, against the log size.

For each log size: a log of that many events, all handled by a consumer group;
then, with the consumer away, a tail of `tail` events that reach the broker
and nobody else. The broker (embedded Tansu, memory only; always started here,
since it is killed) dies and comes back empty on the same port. Measured: the
events the relay publishes again (`RelayStats.republished`) and the stall,
from the broker's restart until the consumer has handled the whole tail.
Both should stay flat as the log grows: a loss costs what was lost.

Postgres: DATABASE_URL, or an embedded one started here (fsync off: the
figure is about the broker, not the disk). `--quick` runs in under a minute.
The last line is exactly
`broker_loss: log_sizes=<a>,<b> republished=<x>,<y> stall_s=<s>,<t>`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg
from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent, default_mapper, utcnow
from runyard.contracts.task_events import TaskQueued
from runyard.eventstore import AppendRequest, PostgresEventStore
from runyard.messaging import KafkaSettings, Topics, ensure_topics
from runyard.messaging.consumer import IdempotentConsumer, make_broker
from runyard.relay import OutboxRelay
from runyard.stack.embedded import EmbeddedKafka, EmbeddedPostgres

QUICK = ((1_000, 10_000), 200)
FULL = ((10_000, 100_000), 500)
STREAMS = 50


def new_event(i: int) -> NewEvent[Event]:
    event = TaskQueued(
        run=1, reason=f"{i % 97} tasks ahead", position=i % 97, gpus_needed=8, launchable=1
    )
    return NewEvent(event, Metadata(actor="service:scheduler"), utcnow())


async def append(store: PostgresEventStore, start: int, count: int) -> None:
    """`count` events over STREAMS task streams, 100 per transaction."""
    for first in range(start, start + count, 100):
        numbers = range(first, min(first + 100, start + count))
        requests = [AppendRequest(f"task-b{n % STREAMS}", [new_event(n)]) for n in numbers]
        await store.append_many(requests)


async def nothing(event: RecordedEvent[Event], conn: asyncpg.Connection) -> None:
    """The consumer's handler: the inbox row is the work."""


async def wait_for(condition: object, within: float = 600.0) -> None:
    deadline = time.monotonic() + within
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("the benchmark did not reach its condition in time")
        await asyncio.sleep(0.01)


async def consume_until(pool: asyncpg.Pool, kafka: KafkaSettings, count: int) -> None:
    broker = make_broker(kafka)
    consumer = IdempotentConsumer(
        "bench", pool=pool, mapper=default_mapper(), handler=nothing, kafka=kafka
    )
    consumer.subscribe(broker, kafka.topics.task_events)
    await broker.start()
    try:
        await wait_for(lambda: consumer.stats.processed >= count)
    finally:
        await broker.stop()


async def one(dsn: str, broker: EmbeddedKafka, log_size: int, tail: int) -> tuple[int, float]:
    """(events published again, stall in s) after a loss with `log_size` events handled."""
    kafka = KafkaSettings(bootstrap=broker.bootstrap, topics=Topics(f"b{uuid.uuid4().hex[:6]}."))
    await ensure_topics(kafka.bootstrap, kafka.topics)
    store = await PostgresEventStore.connect(dsn, default_mapper())
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    relay = OutboxRelay(store, kafka, broker_check_interval=0.2)
    running = asyncio.create_task(relay.run())
    try:
        await append(store, 0, log_size)
        await consume_until(pool, kafka, log_size)
        await append(store, log_size, tail)  # the consumer is away: on the broker only
        await wait_for(lambda: relay.stats.published >= log_size + tail)
        broker.kill()
        broker.start()  # same port, empty memory
        restarted = time.monotonic()
        await ensure_topics(kafka.bootstrap, kafka.topics)
        await consume_until(pool, kafka, tail)
        return relay.stats.republished, time.monotonic() - restarted
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await pool.close()
        await store.close()


async def bench(base: str, sizes: tuple[int, ...], tail: int) -> str:
    broker = EmbeddedKafka()
    broker.start()
    results: list[tuple[int, float]] = []
    try:
        print(f"{'log size':>10} {'tail':>6} {'published again':>16} {'stall s':>8}")
        for size in sizes:
            name = f"bench_{uuid.uuid4().hex[:8]}"
            admin = await asyncpg.connect(base)
            await admin.execute(f'CREATE DATABASE "{name}"')
            await admin.close()
            try:
                republished, stall = await one(
                    f"{base.rpartition('/')[0]}/{name}", broker, size, tail
                )
            finally:
                admin = await asyncpg.connect(base)
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                await admin.close()
            results.append((republished, stall))
            print(f"{size + tail:>10} {tail:>6} {republished:>16} {stall:>8.2f}")
    finally:
        broker.stop()
    return (
        f"broker_loss: log_sizes={','.join(str(s + tail) for s in sizes)}"
        f" republished={','.join(str(r) for r, _ in results)}"
        f" stall_s={','.join(f'{s:.2f}' for _, s in results)}"
    )


async def with_servers(args: argparse.Namespace) -> str:
    sizes, tail = QUICK if args.quick else FULL
    base = os.environ.get("DATABASE_URL")
    root = Path(tempfile.mkdtemp(prefix="runyard-bench-bl-"))
    pg: EmbeddedPostgres | None = None
    try:
        if base is None:
            pg = EmbeddedPostgres(root / "data", settings={"fsync": "off"})
            base = pg.start()
        return await bench(base, sizes, tail)
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller logs: under a minute")
    print(asyncio.run(with_servers(parser.parse_args())))


if __name__ == "__main__":
    main()
