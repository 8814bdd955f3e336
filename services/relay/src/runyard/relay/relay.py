"""The outbox relay: every stored event, to Kafka, in global-position order.

It follows the event store with a gap-safe reader (see
runyard.eventstore.postgres), publishes each batch (topic per stream
category, key = stream id, envelope in headers), waits for the broker's acks,
then saves its checkpoint in Postgres. A crash between publish and checkpoint
publishes a batch twice; consumers dedupe by event id (at-least-once).

The embedded broker keeps everything in memory. The relay writes a marker
topic when it initialises a broker; if the marker is gone, the broker lost its
memory: the relay recreates the topics and publishes again what some consumer
group had not handled yet: from the lowest position a group lags at in a
partition (`runyard.messaging.positions`), not from the start of the log.
It remembers the highest position it published to each partition, with its
checkpoint (consumers dedupe what they see twice).

Each message names the previous event the relay published to its partition
(header `prev`; none on the first message after a broker loss, where the chain
starts again). A consumer whose position in a partition jumped past events (a
client that kept its offset across a broker that lost its memory) sees a `prev`
it has not handled, and reads the partition again instead of skipping them
(`runyard.messaging.consumer`). So the relay chooses each message's partition
itself, with the producer's own partitioner (murmur2 of the key).

Outages are waited out: a database or broker that cannot be reached is retried
with backoff (`runyard.eventstore.transient`), the relay is marked down in the
process's health meanwhile, and it resumes where it was.

One event that the broker can never take (over its message size, or refused
as a record) must not stop the log for everyone: the relay dead-letters it,
a small reference with the reason on the dead-letter topic (the event itself
stays in the store), counts it in `RelayStats.dead_lettered`, logs an error
and goes on with the next event. Errors that concern the broker rather than
one message (unreachable, timeouts, leadership changes) are retried as
before. docs/operations.md says how to find and replay a dead-lettered event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from functools import partial

import asyncpg
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner
from runyard.eventstore import PostgresAllReader, PostgresEventStore, StoredEvent
from runyard.eventstore.appended import AppendSignal
from runyard.eventstore.transient import Backoff, cancel_and_wait, retrying
from runyard.messaging import codec
from runyard.messaging.deadletters import MAX_MESSAGE_BYTES, MESSAGE_ERRORS
from runyard.messaging.positions import Positions, load_consumer_positions, replay_start
from runyard.messaging.settings import KafkaSettings
from runyard.messaging.topics import create_marker, ensure_topics

log = logging.getLogger("runyard.relay")

CHECKPOINT = "relay"


@dataclass
class RelayStats:
    published: int = 0
    batches: int = 0
    broker_resets: int = 0
    publish_errors: int = 0
    #: Events the broker could never take, parked on the dead-letter topic.
    dead_lettered: int = 0
    #: Events published again after the broker lost its memory (the unconfirmed tail).
    republished: int = 0


async def load_checkpoint(pool: asyncpg.Pool, name: str = CHECKPOINT) -> int:
    value = await pool.fetchval("SELECT position FROM checkpoints WHERE name = $1", name)
    return int(value or 0)


async def save_checkpoint(
    pool: asyncpg.Pool,
    position: int,
    name: str = CHECKPOINT,
    published: Positions | None = None,
) -> None:
    """Save the checkpoint, and with it the highest position published per partition.

    One statement (both writes commit together, in one round trip instead of four:
    the relay saves after every batch it publishes)."""
    keys = list(published or ())
    await pool.execute(
        _SAVE_CHECKPOINT,
        name,
        position,
        [t for t, _ in keys],
        [p for _, p in keys],
        [published[k] for k in keys] if published else [],
    )


_SAVE_CHECKPOINT = """
WITH partitions AS (
    INSERT INTO relay_partitions (topic, partition, position)
    SELECT * FROM unnest($3::text[], $4::int[], $5::bigint[])
    ON CONFLICT (topic, partition) DO UPDATE SET position = EXCLUDED.position
)
INSERT INTO checkpoints (name, position) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET position = $2, updated_at = now()
"""


async def load_published(pool: asyncpg.Pool) -> Positions:
    """The highest position published per partition, as saved with the checkpoint."""
    rows = await pool.fetch("SELECT topic, partition, position FROM relay_partitions")
    return {(r["topic"], r["partition"]): r["position"] for r in rows}


class OutboxRelay:
    """Publishes the event log to Kafka; one instance per store."""

    def __init__(
        self,
        store: PostgresEventStore,
        kafka: KafkaSettings,
        *,
        batch_size: int = 500,
        poll_interval: float = 0.005,
        quiet_poll_interval: float = 0.025,
        listened_poll_interval: float = 0.1,
        quiet_after_s: float = 0.25,
        broker_check_interval: float = 1.0,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.store = store
        self.kafka = kafka
        self.batch_size = batch_size
        #: How often an empty log is read again: every `poll_interval` while events
        #: came within `quiet_after_s`, else every `listened_poll_interval` while the
        #: store's append signal listens (`runyard.eventstore.appended`: an append
        #: after a quiet spell is announced, and the relay reads at once), and every
        #: `quiet_poll_interval` while it does not. An append that is not announced
        #: follows its store's previous one by less than `NOTIFY_AFTER_QUIET_S`
        #: (0.1 s), below `quiet_after_s`: the relay is still polling fast then.
        #: The slow polls are a safety net (appends made in a consumer's own batch
        #: transaction are not announced).
        self.poll_interval = poll_interval
        self.quiet_poll_interval = quiet_poll_interval
        self.listened_poll_interval = listened_poll_interval
        self.quiet_after_s = quiet_after_s
        self.broker_check_interval = broker_check_interval
        self.max_message_bytes = max_message_bytes
        self.stats = RelayStats()
        self._producer: AIOKafkaProducer | None = None
        self._last_broker_check = 0.0
        #: (topic, partition) -> highest global position published there.
        self._published: Positions = {}
        self._published_complete = True
        #: (topic, partition) -> the last position published there since the broker
        #: was last found empty: each message's `prev` (the chain consumers check).
        self._chain: Positions = {}
        #: topic -> its partitions, sorted (asked of the broker once per broker life).
        self._partitions: dict[str, list[int]] = {}
        self._partitioner = DefaultPartitioner()
        #: Events up to here were published before the last broker loss.
        self._replay_until = 0
        self.ready = asyncio.Event()
        #: Tells the relay that events were appended (set while it runs).
        self.appended: AppendSignal | None = None

    async def run(self) -> None:
        """Run until cancelled; outages of the database or the broker are waited out."""
        pool = self.store.pool
        unmarked = await retrying(self._start_producer, component="relay")
        assert self._producer is not None
        position = await retrying(lambda: load_checkpoint(pool), component="relay")
        self._published = await retrying(lambda: load_published(pool), component="relay")
        self._chain = dict(self._published)
        # Saved partitions cover the log up to the checkpoint only if they were kept
        # from the start (not for a log published before they were): else replay it all.
        self._published_complete = position == 0 or bool(self._published)
        reader = self.store.all_reader(position)
        if unmarked and position > 0:
            # A broker without the marker never had what this relay published (e.g.
            # the embedded one, started afresh with the whole platform): refill it.
            log.warning("the broker has none of the events published before: refilling it")
            self.stats.broker_resets += 1
            reader = await self._replay_reader(position)
        loop = asyncio.get_running_loop()
        last_event = loop.time()
        appended = self.appended = AppendSignal(pool)
        listening = asyncio.create_task(appended.run(), name="relay-append-signal")
        try:
            while True:
                if await self._broker_lost():
                    reader = await self._replay_reader(reader.position)
                start = reader.position
                appended.clear()
                batch = await retrying(
                    partial(reader.read_stored, self.batch_size), component="relay"
                )
                self.ready.set()
                if not batch:
                    poll = self.idle_poll(loop.time() - last_event, appended.listening)
                    await appended.wait(reader.idle_delay(poll))
                    continue
                last_event = loop.time()
                if await self._publish(batch):
                    self._count_replayed(batch)
                    published = dict(self._published)
                    save = partial(save_checkpoint, pool, reader.position, published=published)
                    await retrying(save, component="relay")
                else:
                    reader = await self._replay_reader(start)
        finally:
            await cancel_and_wait(listening)
            await self._producer.stop()

    def idle_poll(self, since_event_s: float, listening: bool) -> float:
        """How long to wait before reading an empty log again (see `__init__`)."""
        if since_event_s <= self.quiet_after_s:
            return self.poll_interval
        return self.listened_poll_interval if listening else self.quiet_poll_interval

    async def _replay_reader(self, upto: int) -> PostgresAllReader:
        """A reader from where the refilled broker must start again.

        `upto`: the relay's position before any event it may have lost (every event
        up to it was published and is covered by `_published`)."""
        start = 0
        if self._published_complete:
            confirmed = await retrying(
                lambda: load_consumer_positions(self.store.pool), component="relay"
            )
            start = replay_start(self._published, confirmed, upto)
        log.warning("publishing again from position %d (the relay had reached %d)", start, upto)
        self._replay_until = max(self._replay_until, upto)
        self._chain = {}  # an empty broker: each partition's chain starts again
        self._partitions = {}
        return self.store.all_reader(start)

    def _count_replayed(self, batch: list[StoredEvent]) -> None:
        if batch[0].global_position <= self._replay_until:
            self.stats.republished += sum(
                1 for e in batch if e.global_position <= self._replay_until
            )

    async def _start_producer(self) -> bool:
        """Topics, the producer and the marker; a try that fails leaves no client open.
        True when the broker had no marker (one this relay never published to)."""
        await ensure_topics(
            self.kafka.bootstrap, self.kafka.topics, **self.kafka.security.client_options()
        )
        producer = AIOKafkaProducer(
            **self.kafka.client_options(),
            enable_idempotence=False,  # the embedded broker rejects InitProducerId
            acks=1,
            linger_ms=0,
            request_timeout_ms=self.kafka.request_timeout_ms,
            max_request_size=self.max_message_bytes,
        )
        try:
            await producer.start()
            metadata = await producer.client.fetch_all_metadata()
            unmarked = self.kafka.topics.broker_epoch not in metadata.topics()
            if unmarked:
                await self._mark_epoch()
        except BaseException:
            await producer.stop()
            raise
        self._producer = producer
        return unmarked

    async def _recreate_topics(self) -> None:
        await ensure_topics(
            self.kafka.bootstrap, self.kafka.topics, **self.kafka.security.client_options()
        )
        await self._mark_epoch()

    async def _mark_epoch(self) -> None:
        """Create the marker topic and write the epoch to it, with a producer of its own:
        the publishing producer never asks the broker about the marker (a metadata
        refresh after a restart could otherwise have the broker create it again,
        empty, before the relay looks, and hide the loss)."""
        await create_marker(
            self.kafka.bootstrap, self.kafka.topics, **self.kafka.security.client_options()
        )
        marker = AIOKafkaProducer(
            **self.kafka.client_options(),
            enable_idempotence=False,
            request_timeout_ms=self.kafka.request_timeout_ms,
        )
        try:
            await marker.start()
            await marker.send_and_wait(self.kafka.topics.broker_epoch, str(time.time()).encode())
        finally:
            await marker.stop()

    async def _publish(self, batch: list[StoredEvent]) -> bool:
        """Send a batch and wait for every ack, retrying on errors.

        An event the broker can never take is dead-lettered, not retried (see the
        module docstring). False when the broker turned out to have lost its
        memory meanwhile: the caller then starts again from position 0.
        """
        parked: set[int] = set()
        backoff = Backoff(base=0.25, cap=2.0)
        while True:
            try:
                await self._send_all(batch, parked)
                self.stats.published += len(batch) - len(parked)
                self.stats.batches += 1
                return True
            except (KafkaError, OSError) as exc:
                self.stats.publish_errors += 1
                log.warning("publish failed (%s); retrying the batch", exc)
                await backoff.wait()
                if await self._broker_lost(force=True):
                    return False

    async def _send_all(self, batch: list[StoredEvent], parked: set[int]) -> None:
        """Send every event not parked yet; park the ones the broker can never take.

        An event refused only at its ack was already named as the next one's `prev`:
        the batch is sent again without it, so every chain names published events."""
        while True:
            parked_before = len(parked)
            sent = await self._send_once(batch, parked)
            if len(parked) == parked_before:
                break
        for where, position in sent.items():  # the whole batch is in: remember where it went
            self._published[where] = max(self._published.get(where, 0), position)
            self._chain[where] = position

    async def _send_once(self, batch: list[StoredEvent], parked: set[int]) -> Positions:
        """One try at sending the batch; the last position sent to each partition."""
        assert self._producer is not None
        chain = dict(self._chain)
        pending: list[tuple[StoredEvent, asyncio.Future[object]]] = []
        for stored in batch:
            if stored.global_position in parked:
                continue
            key, value, headers = codec.encode_stored(stored)
            topic = self.kafka.topics.for_category(stored.category)
            where = (topic, await self._partition(topic, key))
            if chain.get(where, stored.global_position) < stored.global_position:
                # (a chain past this event: a replay after a loss, resumed by a restarted
                # relay from its checkpoint; the chain starts again here)
                headers.append(("prev", str(chain[where]).encode()))
            try:
                future = await self._producer.send(
                    topic, value, key=key, headers=headers, partition=where[1]
                )
            except MESSAGE_ERRORS as exc:
                await self._dead_letter(stored, len(value), exc, parked)
                continue
            chain[where] = stored.global_position
            pending.append((stored, future))
        results = await asyncio.gather(*(f for _, f in pending), return_exceptions=True)
        sent: Positions = {}
        for (stored, _), result in zip(pending, results, strict=True):
            if isinstance(result, MESSAGE_ERRORS):
                await self._dead_letter(stored, None, result, parked)
            elif isinstance(result, BaseException):
                raise result
            else:
                where = (result.topic, result.partition)  # type: ignore[attr-defined]
                sent[where] = max(sent.get(where, 0), stored.global_position)
        return sent

    async def _partition(self, topic: str, key: bytes) -> int:
        """The partition the producer would choose for `key` (murmur2, as Kafka's
        default partitioner), chosen here so the relay knows it before sending."""
        partitions = self._partitions.get(topic)
        if partitions is None:
            assert self._producer is not None
            partitions = self._partitions[topic] = sorted(
                await self._producer.partitions_for(topic)
            )
        return int(self._partitioner(key, partitions, partitions))

    async def _dead_letter(
        self, stored: StoredEvent, size: int | None, error: Exception, parked: set[int]
    ) -> None:
        """Park a reference to `stored` on the dead-letter topic, with why."""
        assert self._producer is not None
        reason = f"relay could not publish: {type(error).__name__}: {error}"[:1000]
        log.error(
            "dead-lettering event %s (%s of %s, position %s, %s bytes): %s",
            stored.event_id,
            stored.event_type,
            stored.stream_id,
            stored.global_position,
            size if size is not None else "?",
            reason,
        )
        reference = {
            "event_id": str(stored.event_id),
            "stream_id": stored.stream_id,
            "stream_version": stored.stream_version,
            "global_position": stored.global_position,
            "type": stored.event_type,
            "size": size,
            "reason": reason,
        }
        headers = [
            ("reason", reason.encode()),
            ("source", b"relay"),
            ("event_id", str(stored.event_id).encode()),
            ("event_type", stored.event_type.encode()),
            ("global_position", str(stored.global_position).encode()),
        ]
        await self._producer.send_and_wait(
            self.kafka.topics.dead_letter,
            json.dumps(reference).encode(),
            key=stored.stream_id.encode(),
            headers=headers,
        )
        parked.add(stored.global_position)
        self.stats.dead_lettered += 1

    async def _broker_lost(self, *, force: bool = False) -> bool:
        """Detect a broker that lost its memory; recreate topics and say so."""
        now = time.monotonic()
        if not force and now - self._last_broker_check < self.broker_check_interval:
            return False
        self._last_broker_check = now
        assert self._producer is not None
        try:
            metadata = await self._producer.client.fetch_all_metadata()
        except KafkaError:
            return False
        if self.kafka.topics.broker_epoch in metadata.topics():
            return False
        log.warning("broker lost its topics: recreating them and publishing the unconfirmed tail")
        await retrying(self._recreate_topics, component="relay")
        self.stats.broker_resets += 1
        return True
