"""The relay on the real stack: Postgres -> relay -> Kafka -> idempotent consumer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import ConsumerRecord
from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent
from runyard.contracts.envelope import utcnow
from runyard.eventstore import PostgresEventStore
from runyard.messaging import KafkaSettings
from runyard.messaging.consumer import IdempotentConsumer, make_broker
from runyard.relay import OutboxRelay, load_checkpoint
from runyard.stack.embedded import EmbeddedKafka

from tests.conftest import QUICK_GROUP
from tests.contract.sample_events import Renamed, happened, sample_mapper

pytestmark = pytest.mark.integration


@contextlib.asynccontextmanager
async def running_relay(
    store: PostgresEventStore, kafka: KafkaSettings
) -> AsyncIterator[OutboxRelay]:
    relay = OutboxRelay(store, kafka, broker_check_interval=0.2)
    task = asyncio.create_task(relay.run())
    await asyncio.wait_for(relay.ready.wait(), 20)
    try:
        yield relay
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class Collector:
    """A consumer handler that records what it saw, in the consumer's transaction."""

    def __init__(self) -> None:
        self.seen: list[RecordedEvent[Event]] = []

    async def __call__(self, event: RecordedEvent[Event], conn: asyncpg.Connection) -> None:
        self.seen.append(event)


@contextlib.asynccontextmanager
async def running_consumer(
    dsn: str, kafka: KafkaSettings, name: str = "collector"
) -> AsyncIterator[tuple[IdempotentConsumer, Collector]]:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    collector = Collector()
    broker = make_broker(kafka)
    consumer = IdempotentConsumer(
        name, pool=pool, mapper=sample_mapper(), handler=collector, kafka=kafka
    )
    consumer.subscribe(broker, kafka.topics.for_category("test"))
    await broker.start()
    try:
        yield consumer, collector
    finally:
        await broker.stop()
        await pool.close()


async def checkpoint_reaches(store: PostgresEventStore, position: int) -> None:
    """Wait for the relay's checkpoint: it is saved after the broker's acks, so possibly
    after a consumer already has the event."""
    for _ in range(600):
        if await load_checkpoint(store.pool) == position:
            return
        await asyncio.sleep(0.05)


async def wait_until(condition: object, within: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_concurrent_appenders_every_event_once_in_stream_order(
    dsn: str, kafka: KafkaSettings
) -> None:
    """16 writers x 500 events: every event arrives, once after dedupe, in stream order,
    and the relay skipped no global position."""
    store = await PostgresEventStore.connect(dsn, sample_mapper(), max_size=20)
    writers, per_writer = 16, 500

    async def writer(w: int) -> None:
        for i in range(per_writer):
            # Several writers share streams, so appends also race on versions.
            await store.append(f"test-{(w * 7 + i) % 40}", [happened(w * per_writer + i)])

    async with running_consumer(dsn, kafka) as (consumer, collector), running_relay(store, kafka):
        await asyncio.gather(*(writer(w) for w in range(writers)))
        total = writers * per_writer
        await wait_until(lambda: consumer.stats.processed >= total, within=120)
        await asyncio.sleep(0.3)

    assert consumer.stats.processed == total
    assert consumer.stats.dead_lettered == 0
    assert consumer.stats.rewinds == 0, "a partition was read again with nothing lost"
    numbers = sorted(e.event.n for e in collector.seen)  # type: ignore[attr-defined]
    assert numbers == list(range(total))
    positions = sorted(e.global_position for e in collector.seen)
    stored = [
        r["global_position"]
        for r in await store.pool.fetch("SELECT global_position FROM events ORDER BY 1")
    ]
    assert positions == stored, "every stored position was delivered"
    by_stream: dict[str, list[int]] = defaultdict(list)
    for event in collector.seen:
        by_stream[event.stream_id].append(event.stream_version)
    for versions in by_stream.values():
        assert versions == list(range(1, len(versions) + 1))
    await store.close()


async def test_relay_resumes_from_its_checkpoint(dsn: str, kafka: KafkaSettings) -> None:
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    await store.append("test-1", [happened(i) for i in range(5)])
    async with running_relay(store, kafka) as relay:
        await wait_until(lambda: relay.stats.published == 5)
        # saved after the acks: a relay stopped before that publishes them again
        await checkpoint_reaches(store, 5)
    await store.append("test-1", [happened(i) for i in range(5, 8)])
    async with running_relay(store, kafka) as relay:
        await wait_until(lambda: relay.stats.published == 3)
        await asyncio.sleep(0.2)
        assert relay.stats.published == 3, "only what came after the checkpoint"
    await store.close()


async def test_headers_carry_the_envelope(dsn: str, kafka: KafkaSettings) -> None:
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    await store.append("test-9", [happened(42)])
    consumer = AIOKafkaConsumer(
        kafka.topics.for_category("test"),
        bootstrap_servers=kafka.bootstrap,
        auto_offset_reset="earliest",
        group_id="headers-check",
        **QUICK_GROUP,  # a reader of its own: it joins in about a second
        fetch_max_wait_ms=10,
    )
    await consumer.start()
    try:
        async with running_relay(store, kafka):
            message = await asyncio.wait_for(consumer.getone(), 30)
    finally:
        await consumer.stop()
    headers = {k: v.decode() for k, v in message.headers}
    assert message.key == b"test-9"
    assert headers["event_type"] == "Happened"
    assert headers["actor"] == "user:acme/alice"
    assert headers["correlation_id"] == "corr-1"
    assert headers["stream_version"] == "1"
    assert int(headers["global_position"]) >= 1
    await store.close()


async def test_poison_message_goes_to_dead_letter_and_partition_moves_on(
    dsn: str, kafka: KafkaSettings
) -> None:
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    topic = kafka.topics.for_category("test")
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    await producer.start()
    async with running_consumer(dsn, kafka) as (consumer, collector):
        # Same key, so the same partition: the poison comes first.
        await producer.send_and_wait(topic, b"{not json", key=b"test-1", partition=0)
        async with running_relay(store, kafka):
            await store.append("test-1", [happened(1)])
            await wait_until(lambda: consumer.stats.processed == 1, within=60)
    await producer.stop()
    assert consumer.stats.dead_lettered == 1
    assert [e.event.n for e in collector.seen] == [1]  # type: ignore[attr-defined]
    dlq = AIOKafkaConsumer(
        kafka.topics.dead_letter,
        bootstrap_servers=kafka.bootstrap,
        auto_offset_reset="earliest",
        group_id="dlq-check",
        **QUICK_GROUP,  # a reader of its own: it joins in about a second
    )
    await dlq.start()
    try:
        parked = await asyncio.wait_for(dlq.getone(), 30)
    finally:
        await dlq.stop()
    headers = {k: v.decode() for k, v in parked.headers}
    assert parked.value == b"{not json"
    assert "not JSON" in headers["reason"]
    assert headers["source_topic"] == topic
    await store.close()


async def test_redelivered_events_are_processed_once(dsn: str, kafka: KafkaSettings) -> None:
    """Publishing the log twice (a relay crash before its checkpoint) changes nothing."""
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    await store.append("test-1", [happened(i) for i in range(10)])
    async with running_consumer(dsn, kafka) as (consumer, collector):
        async with running_relay(store, kafka) as relay:
            await wait_until(lambda: consumer.stats.processed == 10)
        await store.pool.execute("UPDATE checkpoints SET position = 0 WHERE name = 'relay'")
        async with running_relay(store, kafka) as relay:
            await wait_until(lambda: relay.stats.published == 10)
            await wait_until(lambda: consumer.stats.duplicates == 10)
    assert consumer.stats.processed == 10
    assert len(collector.seen) == 10
    await store.close()


@pytest.mark.slow
async def test_broker_crash_mid_stream_loses_nothing(dsn: str, postgres_url: str) -> None:
    """Kill the (memory-only) broker while events flow; after its restart the relay
    notices the loss, recreates the topics, publishes again, and the consumer,
    deduping, ends up with every event exactly once."""
    from runyard.messaging import Topics, ensure_topics

    broker = EmbeddedKafka()
    broker.start()
    kafka = KafkaSettings(bootstrap=broker.bootstrap, topics=Topics("crash."))
    await ensure_topics(kafka.bootstrap, kafka.topics)
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    total = 600
    try:
        async with (
            running_consumer(dsn, kafka) as (consumer, collector),
            running_relay(store, kafka) as relay,
        ):
            for i in range(total // 2):
                await store.append(f"test-{i % 10}", [happened(i)])
            await wait_until(lambda: consumer.stats.processed > 50)
            broker.kill()
            for i in range(total // 2, total):
                await store.append(f"test-{i % 10}", [happened(i)])
            broker.start()  # same port, empty memory
            # What `runyard up`'s broker watch does: topics come back at once,
            # but not the relay's marker, so the relay still sees the loss.
            await ensure_topics(kafka.bootstrap, kafka.topics)
            await wait_until(lambda: relay.stats.broker_resets >= 1, within=60)
            await wait_until(lambda: consumer.stats.processed >= total, within=120)
        assert sorted(e.event.n for e in collector.seen) == list(range(total))  # type: ignore[attr-defined]
    finally:
        broker.stop()
        await store.close()


@dataclass
class Loss:
    """What `after_a_loss` leaves: the broker's settings, what the group handled
    before the loss, and each partition's end offset before the loss and after."""

    kafka: KafkaSettings
    first: Collector
    ends: dict[int, int]
    refilled: dict[int, int]


@contextlib.asynccontextmanager
async def after_a_loss(
    dsn: str, prefix: str, group: str, before: int, after: int
) -> AsyncIterator[Loss]:
    """Group `group` handles `before` events; the broker then loses its memory, the
    relay refills it, `after` more events are appended, and the group's offsets from
    before the loss are committed to the refilled broker (as a busy client does before
    it rejoins). The relay runs on while the caller reads."""
    from aiokafka import TopicPartition
    from runyard.messaging import ensure_topics

    async with broker_of_its_own(dsn, prefix) as (broker, kafka, store):
        topic = kafka.topics.for_category("test")
        async with running_relay(store, kafka) as relay:
            async with running_consumer(dsn, kafka, name=group) as (consumer, first):
                for i in range(before):
                    await store.append(f"test-{i % 10}", [happened(i)])
                await wait_until(lambda: consumer.stats.processed >= before)
            ends = await _end_offsets(kafka, topic)
            broker.kill()
            broker.start()  # same port, empty memory
            await ensure_topics(kafka.bootstrap, kafka.topics)
            await wait_until(lambda: relay.stats.broker_resets >= 1, within=60)
            for i in range(before, before + after):
                await store.append(f"test-{i % 10}", [happened(i)])
            await checkpoint_reaches(store, before + after)
            refilled = await _end_offsets(kafka, topic)
            stale = AIOKafkaConsumer(
                bootstrap_servers=kafka.bootstrap,
                group_id=kafka.topics.prefix + group,
                enable_auto_commit=False,
            )
            await stale.start()
            try:
                stale.assign([TopicPartition(topic, p) for p in ends])
                await stale.commit({TopicPartition(topic, p): o for p, o in ends.items()})
            finally:
                await stale.stop()
            yield Loss(kafka, first, ends, refilled)


async def test_a_consumer_whose_offset_outlived_the_broker_reads_what_it_jumped_over(
    dsn: str,
) -> None:
    """A client that keeps its offset across a broker that lost its memory would start
    past the first events of the new log. Each message names the previous one of its
    partition, so the consumer sees the jump, reads the partition again from its
    start, and gets every event, once, in stream order."""
    before, after = 200, 600
    async with after_a_loss(dsn, "jump.", "jumper", before, after) as loss:
        assert all(loss.refilled[p] > loss.ends[p] for p in loss.ends), loss
        async with running_consumer(dsn, loss.kafka, name="jumper") as (consumer, second):
            await wait_until(lambda: consumer.stats.processed >= after, within=90)
            assert consumer.stats.rewinds >= 1
    seen = [e.event.n for e in loss.first.seen + second.seen]  # type: ignore[attr-defined]
    assert sorted(seen) == list(range(before + after))
    by_stream: dict[str, list[int]] = defaultdict(list)
    for e in loss.first.seen + second.seen:
        by_stream[e.stream_id].append(e.stream_version)
    assert all(v == sorted(v) for v in by_stream.values())


async def test_a_consumer_whose_offset_is_past_the_refilled_log_reads_it_from_its_start(
    dsn: str,
) -> None:
    """The same stale offsets, but the refilled log stays shorter than them (the
    relay publishes again only what no group had handled, here nothing): the broker
    answers the stale client's fetches with nothing, so no message ever arrives to
    show the jump. The consumer sees its position past the partition's end, reads the
    partition from its start, and handles every event published after the loss."""
    before, after = 300, 20
    async with after_a_loss(dsn, "short.", "stale", before, after) as loss:
        assert all(loss.refilled[p] < loss.ends[p] for p in loss.ends), loss
        async with running_consumer(dsn, loss.kafka, name="stale") as (consumer, second):
            await wait_until(lambda: consumer.stats.processed >= after, within=60)
            assert consumer.stats.rewinds >= 1
    assert sorted(e.event.n for e in second.seen) == list(range(before, before + after))  # type: ignore[attr-defined]
    assert sorted(e.event.n for e in loss.first.seen) == list(range(before))  # type: ignore[attr-defined]


async def test_a_jump_over_events_that_never_come_again_is_waited_for_once_then_passed(
    dsn: str,
    kafka: KafkaSettings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A partition whose chain has a hole no relay will fill (its events were never
    published again): the consumer reads the partition again from its start once,
    waits `GAP_WAIT_S` for the missing events, then says they never came and takes
    what followed them, each once. Never a loop of reading again."""
    from runyard.messaging import codec
    from runyard.messaging import consumer as consumer_module

    monkeypatch.setattr(consumer_module, "GAP_WAIT_S", 1.5)
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    stream = f"test-{uuid.uuid4().hex[:8]}"
    await store.append(stream, [happened(n) for n in range(7)])
    stored = [e for e in await store.all_reader(0).read_stored(100_000) if e.stream_id == stream]
    topic = kafka.topics.for_category("test")
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    await producer.start()

    async def publish(event_numbers: list[int], prev: int | None) -> None:
        for n in event_numbers:
            key, value, headers = codec.encode_stored(stored[n])
            if prev is not None:
                headers.append(("prev", str(prev).encode()))
            await producer.send_and_wait(topic, value, key=key, headers=headers, partition=0)
            prev = stored[n].global_position

    name = f"holey-{uuid.uuid4().hex[:6]}"
    try:
        async with running_consumer(dsn, kafka, name=name) as (consumer, collector):
            await publish([0, 1, 2], prev=None)
            await wait_until(lambda: consumer.stats.processed == 3)
            # Events 3 and 4 never come: 5 names 4 as the one before it.
            await publish([5, 6], prev=stored[4].global_position)
            await wait_until(lambda: consumer.stats.processed == 5, within=30)
            await asyncio.sleep(1.0)  # no reading again after the wait
            assert consumer.stats.rewinds == 2  # for the jump, and after the wait
            assert consumer.stats.given_up == 1
            assert consumer.stats.processed == 5 and consumer.stats.dead_lettered == 0
    finally:
        await producer.stop()
        await store.close()
    assert [e.event.n for e in collector.seen] == [0, 1, 2, 5, 6]  # type: ignore[attr-defined]
    lost = [r for r in caplog.records if "never came again" in r.getMessage()]
    assert len(lost) == 1 and lost[0].levelname == "ERROR", caplog.text
    assert f"between positions {stored[2].global_position} and {stored[4].global_position}" in (
        lost[0].getMessage()
    )


async def test_a_relay_started_on_a_broker_that_lost_what_it_published_refills_it(
    dsn: str,
) -> None:
    """The relay and its broker stop together (the embedded broker of a crashed
    `runyard up`); the new broker is empty. The relay, started again, finds no marker
    on it while its checkpoint says it published: it publishes again what a group had
    not handled (here a group that handled the first 10 events), not only what came
    after its checkpoint."""
    from runyard.messaging import ensure_topics
    from runyard.messaging.positions import save_positions

    total = 40
    async with broker_of_its_own(dsn, "refill.") as (broker, kafka, store):
        topic = kafka.topics.for_category("test")
        await store.append("test-1", [happened(i) for i in range(total)])
        async with running_relay(store, kafka) as relay:
            await wait_until(lambda: relay.stats.published == total)
            await checkpoint_reaches(store, total)
        partitions = set(await _end_offsets(kafka, topic))
        async with store.pool.acquire() as conn:  # a group that lags at position 10
            await save_positions(conn, "laggard", {(topic, p): 10 for p in partitions})
        broker.kill()
        broker.start()  # same port, empty memory
        await ensure_topics(kafka.bootstrap, kafka.topics)
        async with running_relay(store, kafka) as relay:
            assert relay.stats.broker_resets == 1
            await wait_until(lambda: relay.stats.published == total - 10)
        positions = sorted(
            int(dict(r.headers)["global_position"]) for r in await _read_all(kafka, topic)
        )
        assert positions == list(range(11, total + 1))


@contextlib.asynccontextmanager
async def broker_of_its_own(
    dsn: str, prefix: str
) -> AsyncIterator[tuple[EmbeddedKafka, KafkaSettings, PostgresEventStore]]:
    """A broker for this test alone (it kills it), its topics, and a store."""
    from runyard.messaging import Topics, ensure_topics

    broker = EmbeddedKafka()
    broker.start()
    kafka = KafkaSettings(bootstrap=broker.bootstrap, topics=Topics(prefix))
    store: PostgresEventStore | None = None
    try:
        await ensure_topics(kafka.bootstrap, kafka.topics)
        store = await PostgresEventStore.connect(dsn, sample_mapper())
        yield broker, kafka, store
    finally:
        broker.stop()
        if store is not None:
            await store.close()


async def _read_all(kafka: KafkaSettings, topic: str) -> list[ConsumerRecord[Any, Any]]:
    """Every message on `topic` now (a reader of no group)."""
    from aiokafka import TopicPartition

    reader = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False)
    await reader.start()
    try:
        partitions = [
            TopicPartition(topic, p) for p in sorted(reader.partitions_for_topic(topic) or [])
        ]
        ends = await reader.end_offsets(partitions)
        reader.assign(partitions)
        await reader.seek_to_beginning(*partitions)
        found: list[ConsumerRecord[Any, Any]] = []
        while [tp for tp in partitions if await reader.position(tp) < ends[tp]]:
            for records in (await reader.getmany(timeout_ms=500)).values():
                found.extend(records)
        return found
    finally:
        await reader.stop()


async def _end_offsets(kafka: KafkaSettings, topic: str) -> dict[int, int]:
    from aiokafka import TopicPartition

    reader = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False)
    await reader.start()
    try:
        numbers = sorted(reader.partitions_for_topic(topic) or [])
        partitions = [TopicPartition(topic, p) for p in numbers]
        ends = await reader.end_offsets(partitions)
        return {tp.partition: offset for tp, offset in ends.items()}
    finally:
        await reader.stop()


def renamed(first: str) -> NewEvent[Renamed]:
    return NewEvent(
        Renamed(first=first, last="x"), Metadata(actor="user:acme/alice"), occurred_at=utcnow()
    )


async def dead_letters(kafka: KafkaSettings, count: int) -> list[ConsumerRecord[Any, Any]]:
    dlq = AIOKafkaConsumer(
        kafka.topics.dead_letter,
        bootstrap_servers=kafka.bootstrap,
        auto_offset_reset="earliest",
        group_id=f"dlq-{uuid.uuid4().hex[:8]}",
        **QUICK_GROUP,  # a reader of its own: it joins in about a second
    )
    await dlq.start()
    try:
        return [await asyncio.wait_for(dlq.getone(), 30) for _ in range(count)]
    finally:
        await dlq.stop()


async def test_an_event_the_broker_cannot_take_is_dead_lettered_and_the_log_goes_on(
    dsn: str, kafka: KafkaSettings
) -> None:
    """An event over the broker's message size (here a relay whose limit is 4 KiB)
    stops nothing: it is parked with the reason, later events of every stream flow."""
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    await store.append("test-1", [happened(1)])
    await store.append("test-2", [renamed("a" * 10_000)])
    await store.append("test-3", [happened(3)])
    head = 4
    async with running_consumer(dsn, kafka) as (consumer, collector):
        relay = OutboxRelay(store, kafka, broker_check_interval=0.2, max_message_bytes=4096)
        task = asyncio.create_task(relay.run())
        try:
            await wait_until(lambda: consumer.stats.processed == 2, within=60)
            await store.append("test-4", [happened(4)])
            await wait_until(lambda: consumer.stats.processed == 3, within=60)
            await checkpoint_reaches(store, head)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert [e.event.n for e in collector.seen] == [1, 3, 4]  # type: ignore[attr-defined]
    assert relay.stats.dead_lettered == 1
    (parked,) = await dead_letters(kafka, 1)
    headers = {k: v.decode() for k, v in parked.headers}
    reference = json.loads(parked.value)
    assert headers["source"] == "relay" and "MessageSizeTooLarge" in headers["reason"]
    assert (reference["stream_id"], reference["type"]) == ("test-2", "Renamed")
    assert await load_checkpoint(store.pool) == await store.head_position() == head
    await store.close()


@pytest.mark.slow
async def test_a_relay_started_without_a_broker_waits_for_one(dsn: str) -> None:
    """No broker on the port yet: the relay is listed as waiting (not crashed), and
    publishes the log once a broker comes up there."""
    from runyard.eventstore import HEALTH
    from runyard.messaging import Topics
    from runyard.stack.ports import free_port

    broker = EmbeddedKafka(port=free_port())
    kafka = KafkaSettings(bootstrap=broker.bootstrap, topics=Topics("late."))
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    await store.append("test-1", [happened(i) for i in range(5)])
    relay = OutboxRelay(store, kafka, broker_check_interval=0.2)
    task = asyncio.create_task(relay.run())
    try:
        await wait_until(lambda: "relay" in HEALTH.down, within=60)
        assert not task.done() and not relay.ready.is_set()
        broker.start()
        await wait_until(lambda: relay.stats.published == 5, within=60)
        assert "relay" not in HEALTH.down
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        broker.stop()
        await store.close()


async def test_an_idle_relay_publishes_the_next_event_when_postgres_tells_it(
    dsn: str, kafka: KafkaSettings
) -> None:
    """The relay waits on the append signal as well as its poll: with its polls two
    minutes apart, an append announced after a quiet spell is published all the same."""
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    store.notify_after_quiet_s = 0  # every append is announced
    relay = OutboxRelay(
        store,
        kafka,
        broker_check_interval=0.2,
        poll_interval=120,
        quiet_poll_interval=120,
        listened_poll_interval=120,
    )
    task = asyncio.create_task(relay.run())
    try:
        await asyncio.wait_for(relay.ready.wait(), 20)
        await wait_until(lambda: relay.appended is not None and relay.appended.listening)
        await asyncio.sleep(0.2)  # the read after it began listening found the log empty

        async def published(count: int) -> None:
            await wait_until(lambda: relay.stats.published == count, within=20)

        for n in range(3):
            await store.append("test-1", [happened(n)])
            await published(n + 1)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.close()


class LateCloseProxy:
    """A TCP proxy to Postgres that passes the server's close on to the client
    `hold_s` late. A client reads the server's last words ("terminating connection due
    to administrator command": a stop, a restart, a terminated session) at once and
    the close that follows them later, as it does whenever the two come in separate
    reads, here for long enough to be sure it acts in between."""

    def __init__(self, dsn: str, hold_s: float = 1.0) -> None:
        self.upstream = urlsplit(dsn)
        self.hold_s = hold_s
        self.opened = self.ended = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self, application_name: str) -> str:
        """The DSN through the proxy, its sessions named `application_name`."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        netloc = f"{self.upstream.netloc.rpartition('@')[0]}@127.0.0.1:{port}"
        query = f"application_name={application_name}"
        return self.upstream._replace(netloc=netloc, query=query).geturl()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        if self._server is not None:
            await self._server.wait_closed()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, port = unquote(self.upstream.hostname or ""), self.upstream.port or 5432
        if host.startswith("/"):  # the embedded server's socket: its peer auth is ours
            return await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
        return await asyncio.open_connection(host, port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await self._connect()
        self._writers += [writer, up_writer]
        self.opened += 1

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()

        async def client_side() -> None:
            await pipe(reader, up_writer)
            up_writer.close()

        async def server_side() -> None:
            await pipe(up_reader, writer)
            self.ended += 1
            await asyncio.sleep(self.hold_s)
            writer.close()

        await asyncio.gather(client_side(), server_side())


async def test_sessions_the_server_ended_are_waited_out(dsn: str, kafka: KafkaSettings) -> None:
    """Postgres stopping or restarting (fast shutdown) ends every session with words of
    its own before closing it; a pooled connection that has read them and not yet its
    close is unusable (asyncpg: 'another operation (2) is in progress'). The relay waits
    that out like any outage and goes on with new connections; it does not stop."""
    proxy = LateCloseProxy(dsn)
    store = await PostgresEventStore.connect(await proxy.start("held"), sample_mapper())
    writer = await PostgresEventStore.connect(dsn, sample_mapper())
    relay = OutboxRelay(store, kafka, broker_check_interval=0.2)
    task: asyncio.Task[None] | None = None
    try:
        await writer.append("test-1", [happened(0)])
        ended = await writer.pool.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = 'held'"
        )
        assert ended == proxy.opened == 1
        await wait_until(lambda: proxy.ended == 1, within=20)
        await asyncio.sleep(0.05)  # the pooled connection reads what the proxy passed on
        task = asyncio.create_task(relay.run())
        await wait_until(lambda: relay.stats.published == 1 or task.done(), within=30)
        assert not task.done(), f"the relay stopped: {task.exception()!r}"
        await writer.append("test-1", [happened(1)])
        await wait_until(lambda: relay.stats.published == 2, within=30)
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await store.close()
        await writer.close()
        await proxy.close()
