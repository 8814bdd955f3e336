"""How a consumer waits for events and commits, over a real broker and Postgres:
after a poll that found nothing it polls again at once (the poll itself waits
for records up to its timeout), a batch is handed to the handler without a
worker thread, and batches that follow each other share an offset commit (also
in the co-partitioned consumer of events and lines). The broker client logs
through Runyard's logger.

FastStream's batch subscriber pauses for its whole batch timeout after an empty
poll, and an event arriving during the pause waited it out; its context lookup
of the message ran on a worker thread once per batch."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import anyio
import asyncpg
import fast_depends.utils
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from runyard.contracts.loglines import LogRecord
from runyard.eventstore import PostgresEventStore
from runyard.messaging import KafkaSettings, batches, copartition
from runyard.messaging.consumer import IdempotentConsumer, make_broker
from runyard.messaging.copartition import CoPartitionedConsumer
from runyard.messaging.progress import partition_of

from tests.contract.sample_events import happened, sample_mapper
from tests.integration.test_relay import Collector, running_consumer, running_relay, wait_until
from tests.log_records import log_record

pytestmark = pytest.mark.integration


async def test_an_idle_consumer_takes_an_event_without_a_pause_or_a_thread(
    dsn: str, kafka: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    pause = kafka.fetch_max_wait_ms / 1000  # the batch timeout
    pauses: list[float] = []
    threaded: list[object] = []
    sleep, in_thread = anyio.sleep, fast_depends.utils.run_in_threadpool

    async def recorded_sleep(delay: float, *args: Any, **kwargs: Any) -> Any:
        if delay == pause:
            pauses.append(delay)
        return await sleep(delay, *args, **kwargs)

    async def recorded_thread(func: Any, *args: Any, **kwargs: Any) -> Any:
        threaded.append(func)
        return await in_thread(func, *args, **kwargs)

    monkeypatch.setattr(anyio, "sleep", recorded_sleep)
    monkeypatch.setattr(fast_depends.utils, "run_in_threadpool", recorded_thread)
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    try:
        async with running_consumer(dsn, kafka, name="poll") as (consumer, collector):
            client = consumer._subscriber.consumer
            polls = {"empty": 0}
            getmany = client.getmany

            async def counted(*args: Any, **kwargs: Any) -> Any:
                polled = await getmany(*args, **kwargs)
                polls["empty"] += not polled
                return polled

            client.getmany = counted
            await wait_until(lambda: polls["empty"] >= 3, within=60)
            await store.append("test-poll", [happened(1)])
            async with running_relay(store, kafka):
                await wait_until(lambda: consumer.stats.processed >= 1, within=60)
            await asyncio.sleep(3 * pause)  # more empty polls after the event
    finally:
        await store.close()
    assert [e.event.n for e in collector.seen] == [1]  # type: ignore[attr-defined]
    assert pauses == [], "the subscriber paused after an empty poll"
    assert threaded == [], "a batch went through a worker thread"


async def test_offsets_are_committed_together_and_all_of_them_once_quiet(
    dsn: str, kafka: KafkaSettings
) -> None:
    """Batches that follow each other share a commit; the first poll that finds
    nothing commits what was handled, so a restart would read nothing again."""
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    collector = Collector()
    broker = make_broker(kafka)
    consumer = IdempotentConsumer(
        "commits", pool=pool, mapper=sample_mapper(), handler=collector, kafka=kafka, max_records=5
    )
    consumer.commit_every_s = 3600.0  # in effect: only the first batch commits at once
    consumer.subscribe(broker, kafka.topics.for_category("test"))
    # All 30 are in the log before the relay starts: published together, taken in
    # batches of 5 one after the other.
    await store.append("test-commits", [happened(n) for n in range(30)])
    await broker.start()
    try:
        client = consumer._subscriber.consumer
        counts = {"commits": 0, "batches": 0}
        commit, getmany = client.commit, client.getmany

        async def counted_commit(*args: Any, **kwargs: Any) -> None:
            counts["commits"] += 1
            await commit(*args, **kwargs)

        async def counted_getmany(*args: Any, **kwargs: Any) -> Any:
            polled = await getmany(*args, **kwargs)
            counts["batches"] += bool(polled)
            return polled

        client.commit, client.getmany = counted_commit, counted_getmany
        async with running_relay(store, kafka):
            await wait_until(lambda: consumer.stats.processed >= 30, within=60)
            partitions = client.assignment()

            async def all_committed() -> bool:
                """Every offset taken is committed (what a restart would start from)."""
                for tp in partitions:
                    if (await client.committed(tp) or 0) != await client.position(tp):
                        return False
                return True

            for _ in range(600):
                if await all_committed():
                    break
                await asyncio.sleep(0.05)
            assert await all_committed(), "the handled offsets are committed once quiet"
    finally:
        await broker.stop()
        await pool.close()
        await store.close()
    assert [e.event.n for e in collector.seen] == list(range(30))  # type: ignore[attr-defined]
    assert counts["batches"] >= 6
    assert counts["commits"] < counts["batches"], counts


async def test_the_broker_client_logs_through_runyards_logger(
    dsn: str,
    kafka: KafkaSettings,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """FastStream's own lines (a partition assignment, a stopped subscriber) go through
    `runyard.messaging.broker`: the process's format and level, no colors of their own."""
    caplog.set_level(logging.INFO, logger="runyard.messaging.broker")
    async with running_consumer(dsn, kafka, name="logs-through") as (consumer, _):
        await wait_until(lambda: bool(consumer.assignment()), within=60)
    said = [r.getMessage() for r in caplog.records if r.name == "runyard.messaging.broker"]
    assert any("assigned to partitions" in line for line in said), said
    out, err = capfd.readouterr()
    assert "\x1b[" not in out + err, "FastStream printed lines of its own"


async def test_a_co_partitioned_consumer_commits_polls_together_and_all_once_quiet(
    dsn: str, kafka: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for the consumer of events and lines together (fault tolerance's)."""
    commits: list[dict[TopicPartition, int]] = []
    commit_offsets = batches.commit_offsets

    async def counted(reader: str, consumer: Any, offsets: dict[TopicPartition, int]) -> bool:
        done = await commit_offsets(reader, consumer, offsets)
        commits.append(dict(offsets))  # once the broker has it
        return done

    monkeypatch.setattr(copartition, "commit_offsets", counted)
    producer = AIOKafkaProducer(**kafka.client_options())
    await producer.start()
    try:  # all 30 lines are there before the consumer starts: polls of 5 back to back
        for seq in range(30):
            record = log_record(datetime.now(UTC), "t1", f"step {seq}", seq=seq)
            await producer.send(kafka.topics.logs, record.to_bytes(), key=record.key())
        await producer.flush()
    finally:
        await producer.stop()
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    lines: list[list[LogRecord]] = []

    async def on_lines(records: Sequence[LogRecord]) -> None:
        lines.append(list(records))

    events = IdempotentConsumer(
        "copartition-commits", pool=pool, mapper=sample_mapper(), handler=Collector(), kafka=kafka
    )
    events.attach(make_broker(kafka), kafka.topics.task_events)
    reader = CoPartitionedConsumer(events, kafka=kafka, on_lines=on_lines, max_records=5)
    reader.commit_every_s = 3600.0  # in effect: only the first poll commits at once
    task = asyncio.create_task(reader.run())
    try:
        await wait_until(lambda: sum(map(len, lines)) == 30, within=60)
        client = reader._consumer
        assert client is not None
        count = len(client.partitions_for_topic(kafka.topics.logs) or ())
        partition = TopicPartition(kafka.topics.logs, partition_of("task-t1", count))
        await wait_until(lambda: bool(commits) and commits[-1].get(partition) == 30, within=60)
        assert await client.committed(partition) == 30
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pool.close()
    assert len(lines) >= 6
    assert len(commits) < len(lines), (len(commits), len(lines))


async def test_a_handler_cancelled_as_its_broker_stops_is_no_error(
    dsn: str, kafka: KafkaSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """A consumer stopped while its handler waits (an outage waited out when a
    scheduler's term ends, a service asked to stop): the handler is cancelled, which
    is the stop doing its work, not an error with a traceback in the service's log."""
    waiting = asyncio.Event()

    async def waits(event: Any, conn: asyncpg.Connection) -> None:
        waiting.set()
        await asyncio.Event().wait()  # as long as the outage lasts

    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    broker = make_broker(kafka)
    consumer = IdempotentConsumer(
        "cancelled", pool=pool, mapper=sample_mapper(), handler=waits, kafka=kafka
    )
    consumer.subscribe(broker, kafka.topics.for_category("test"))
    try:
        await broker.start()
        await store.append("test-cancelled", [happened(1)])
        async with running_relay(store, kafka):
            await asyncio.wait_for(waiting.wait(), 60)
        with caplog.at_level(logging.DEBUG, logger="runyard.messaging.broker"):
            await broker.stop()
    finally:
        await store.close()
        await pool.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [(r.name, r.getMessage()) for r in errors]
    assert any("CancelledError" in r.getMessage() for r in caplog.records), "it is still said"
