"""A consumer's saved positions and its offset commits, over a real Postgres and
broker: a batch whose events the consumer only skips writes nothing at once; its
positions are saved with the next handled batch, or before the next offset
commit, so a committed offset never runs ahead of the saved positions (a client
that starts from it must not see events as jumped over). When the positions
cannot be saved, the commit waits."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import asyncpg
import pytest
from aiokafka import TopicPartition
from runyard.contracts import Metadata, NewEvent, utcnow
from runyard.eventstore import PostgresEventStore
from runyard.messaging import KafkaSettings, batches, copartition
from runyard.messaging import consumer as consumer_module
from runyard.messaging.consumer import IdempotentConsumer, make_broker
from runyard.messaging.copartition import CoPartitionedConsumer

from tests.contract.sample_events import Renamed, happened, sample_mapper
from tests.integration.test_consumer_inbox import consumer_record
from tests.integration.test_relay import Collector, running_relay, wait_until

pytestmark = pytest.mark.integration


def _renamed_only(name: str, pool: asyncpg.Pool, kafka: KafkaSettings) -> IdempotentConsumer:
    """A consumer that handles `Renamed` events only: it skips `Happened`."""
    return IdempotentConsumer(
        name,
        pool=pool,
        mapper=sample_mapper(),
        handler=Collector(),
        kafka=kafka,
        event_types=frozenset({"Renamed"}),
    )


def renamed(first: str) -> NewEvent[Renamed]:
    return NewEvent(Renamed(first=first, last="x"), Metadata(actor="t"), utcnow())


async def _saved(pool: asyncpg.Pool, name: str) -> dict[int, int]:
    rows = await pool.fetch(
        "SELECT partition, position FROM consumer_positions"
        " WHERE consumer = $1 AND topic = 'test' AND partition >= 0",
        name,
    )
    return {row["partition"]: row["position"] for row in rows}


@asynccontextmanager
async def _attached(dsn: str, kafka: KafkaSettings, name: str) -> AsyncIterator[IdempotentConsumer]:
    """A consumer of `Renamed` only, fed by the test (no broker poll)."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    broker = make_broker(kafka)
    consumer = _renamed_only(name, pool, kafka)
    consumer.attach(broker, "test")
    consumer.commit_every_s = 0.0  # every batch commits at once
    try:
        yield consumer
    finally:
        await pool.close()


async def test_skipped_batches_owe_their_positions_until_a_batch_or_a_commit_saves_them(
    dsn: str, kafka: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    await store.append("test-skip", [happened(n) for n in range(1, 4)])
    await store.append("test-want", [renamed("a")])
    one, two, three = await store.read_stream("test-skip")
    [wanted] = await store.read_stream("test-want")
    name = f"positions-{uuid.uuid4().hex[:6]}"
    commits: list[dict[int, int]] = []
    try:
        async with _attached(dsn, kafka, name) as consumer:
            pool = consumer.pool

            async def ack() -> None:  # what the broker would be told: after the save
                commits.append(await _saved(pool, name))

            message = SimpleNamespace(ack=ack)
            # Two batches of skipped events (partitions 0 and 1): nothing written.
            await consumer.process_batch([consumer_record(one, 0, 0)])
            await consumer.process_batch([consumer_record(two, 0, 1)])
            assert consumer.stats.skipped == 2
            assert await _saved(pool, name) == {}
            # A handled batch in partition 0 saves what partition 1 owed too.
            await consumer.process_batch([consumer_record(wanted, 1, 0)])
            assert consumer.stats.processed == 1
            assert await _saved(pool, name) == {
                0: wanted.global_position,
                1: two.global_position,
            }
            # A skipped batch, then its commit: the save comes first.
            await consumer.process_batch([consumer_record(three, 1, 1)])
            assert (await _saved(pool, name))[1] == two.global_position
            await consumer._commit(message)  # type: ignore[arg-type]
            assert commits == [{0: wanted.global_position, 1: three.global_position}]

            # The database away: the owed positions cannot be saved, so no commit.
            monkeypatch.setattr(consumer_module, "FLUSH_RETRY_S", 0.0)
            await store.append("test-skip", [happened(4)])
            [*_, four] = await store.read_stream("test-skip")
            await consumer.process_batch([consumer_record(four, 2, 1)])
            away = await asyncpg.create_pool(dsn, min_size=0, max_size=1)
            await away.close()
            consumer.pool = away
            await consumer._commit(message)  # type: ignore[arg-type]
            assert len(commits) == 1, "offsets were committed past unsaved positions"
            assert await consumer.flush_positions() is False
            consumer.pool = pool  # back: the next commit saves, then commits
            consumer._commits_paused_until = 0.0
            await consumer._commit(message)  # type: ignore[arg-type]
            assert commits[-1] == {0: wanted.global_position, 1: four.global_position}
            assert await consumer.flush_positions() is True  # nothing owed
    finally:
        await store.close()


async def test_a_committed_offset_never_runs_ahead_of_the_saved_positions(
    dsn: str, kafka: KafkaSettings
) -> None:
    """Over the broker: a consumer that skips a trickle of events. Whenever the
    broker holds a committed offset, the events before it have their positions
    saved; once quiet, the last one's is."""
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    broker = make_broker(kafka)
    name = f"ahead-{uuid.uuid4().hex[:6]}"
    consumer = _renamed_only(name, pool, kafka)
    consumer.commit_every_s = 0.05
    topic = kafka.topics.for_category("test")
    consumer.subscribe(broker, topic)
    await broker.start()
    violations: list[tuple[int, int, int]] = []
    checks = 0
    try:
        client = consumer._subscriber.consumer
        async with running_relay(store, kafka):
            for n in range(40):  # one stream: one partition, offset k = its k-th event
                await store.append("test-trickle", [happened(n)])
                await asyncio.sleep(0.01)
                positions = [e.global_position for e in await store.read_stream("test-trickle")]
                for tp in client.assignment():
                    committed = await client.committed(tp)
                    if not committed:
                        continue
                    rows = await pool.fetch(
                        "SELECT position FROM consumer_positions"
                        " WHERE consumer = $1 AND topic = $2 AND partition = $3",
                        name,
                        tp.topic,
                        tp.partition,
                    )
                    saved = rows[0]["position"] if rows else 0
                    checks += 1
                    if saved < positions[committed - 1]:
                        violations.append((committed, saved, positions[committed - 1]))
            await wait_until(lambda: consumer.stats.skipped >= 40, within=60)
            last = positions[-1]

            async def caught_up() -> tuple[int | None, list[int | None]]:
                """The highest saved position, and the offsets committed."""
                found = await pool.fetchval(
                    "SELECT max(position) FROM consumer_positions"
                    " WHERE consumer = $1 AND partition >= 0",
                    name,
                )
                return found, [await client.committed(tp) for tp in client.assignment()]

            for _ in range(600):
                saved, committed = await caught_up()
                if saved == last and 40 in committed:
                    break
                await asyncio.sleep(0.05)
            assert saved == last, "the skipped events' positions are saved once quiet"
            assert 40 in committed, committed
    finally:
        await broker.stop()
        await pool.close()
        await store.close()
    assert checks > 0
    assert violations == [], violations


async def test_a_co_partitioned_consumer_commits_only_saved_positions(
    dsn: str, kafka: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for the consumer of events and lines together: each commit of an
    events partition comes after the positions it covers are saved."""
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    name = f"copartition-{uuid.uuid4().hex[:6]}"
    topic = kafka.topics.for_category("test")
    seen: list[tuple[int, int]] = []  # (offset committed, position saved then)
    commit_offsets = batches.commit_offsets

    async def checked(reader: str, client: Any, offsets: dict[TopicPartition, int]) -> bool:
        for tp, offset in offsets.items():
            if tp.topic == topic:
                saved = await pool.fetchval(
                    "SELECT position FROM consumer_positions"
                    " WHERE consumer = $1 AND topic = $2 AND partition = $3",
                    name,
                    tp.topic,
                    tp.partition,
                )
                seen.append((offset, saved or 0))
        return await commit_offsets(reader, client, offsets)

    monkeypatch.setattr(copartition, "commit_offsets", checked)
    events = _renamed_only(name, pool, kafka)
    events.attach(make_broker(kafka), topic)

    async def on_lines(records: Any) -> None:
        return None

    reader = CoPartitionedConsumer(events, kafka=kafka, on_lines=on_lines, events_topic=topic)
    reader.commit_every_s = 0.05
    task = asyncio.create_task(reader.run())
    try:
        async with running_relay(store, kafka):
            for n in range(20):  # one stream: one partition, offset k = its k-th event
                await store.append("test-co", [happened(n)])
                await asyncio.sleep(0.01)
            await wait_until(lambda: events.stats.skipped >= 20, within=60)
            await wait_until(lambda: any(offset == 20 for offset, _ in seen), within=60)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pool.close()
    positions = [e.global_position for e in await store.read_stream("test-co")]
    await store.close()
    behind = [(o, saved) for o, saved in seen if saved < positions[o - 1]]
    assert behind == [], f"offsets committed past unsaved positions: {behind}"
