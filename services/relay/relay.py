"""The outbox relay: every stored event, to Kafka, in global-position order.

It follows the event store with a gap-safe reader (see
runyard.eventstore.postgres), publishes each batch (topic per stream
category, key = stream id, envelope in headers), waits for the broker's acks,
then saves its checkpoint in Postgres. A crash between publish and checkpoint
publishes a batch twice; consumers dedupe by event id (at-least-once).

The embedded broker keeps everything in memory. The relay writes a marker
topic when it initialises a broker; if the marker is gone, the broker lost its
memory: the relay recreates the topics and publishes again from position 0
(consumers dedupe), instead of assuming the broker kept anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import asyncpg
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from runyard.eventstore import PostgresEventStore, StoredEvent
from runyard.messaging import codec
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


async def load_checkpoint(pool: asyncpg.Pool, name: str = CHECKPOINT) -> int:
    value = await pool.fetchval("SELECT position FROM checkpoints WHERE name = $1", name)
    return int(value or 0)


async def save_checkpoint(pool: asyncpg.Pool, position: int, name: str = CHECKPOINT) -> None:
    await pool.execute(
        """INSERT INTO checkpoints (name, position) VALUES ($1, $2)
           ON CONFLICT (name) DO UPDATE SET position = $2, updated_at = now()""",
        name,
        position,
    )


class OutboxRelay:
    """Publishes the event log to Kafka; one instance per store."""

    def __init__(
        self,
        store: PostgresEventStore,
        kafka: KafkaSettings,
        *,
        batch_size: int = 500,
        poll_interval: float = 0.005,
        broker_check_interval: float = 1.0,
    ) -> None:
        self.store = store
        self.kafka = kafka
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.broker_check_interval = broker_check_interval
        self.stats = RelayStats()
        self._producer: AIOKafkaProducer | None = None
        self._last_broker_check = 0.0
        self.ready = asyncio.Event()

    async def run(self) -> None:
        """Run until cancelled."""
        await self._start_producer()
        assert self._producer is not None
        reader = self.store.all_reader(await load_checkpoint(self.store.pool))
        try:
            while True:
                if await self._broker_lost():
                    reader = self.store.all_reader(0)
                batch = await reader.read_stored(self.batch_size)
                self.ready.set()
                if not batch:
                    await asyncio.sleep(reader.idle_delay(self.poll_interval))
                elif await self._publish(batch):
                    await save_checkpoint(self.store.pool, reader.position)
                else:
                    reader = self.store.all_reader(0)
        finally:
            await self._producer.stop()

    async def _start_producer(self) -> None:
        await ensure_topics(
            self.kafka.bootstrap, self.kafka.topics, **self.kafka.security.client_options()
        )
        self._producer = AIOKafkaProducer(
            **self.kafka.client_options(),
            enable_idempotence=False,  # the embedded broker rejects InitProducerId
            acks=1,
            linger_ms=0,
            request_timeout_ms=self.kafka.request_timeout_ms,
        )
        await self._producer.start()
        await self._mark_epoch()

    async def _mark_epoch(self) -> None:
        assert self._producer is not None
        await create_marker(
            self.kafka.bootstrap, self.kafka.topics, **self.kafka.security.client_options()
        )
        await self._producer.send_and_wait(
            self.kafka.topics.broker_epoch, str(time.time()).encode()
        )

    async def _publish(self, batch: list[StoredEvent]) -> bool:
        """Send a batch and wait for every ack, retrying on errors.

        False when the broker turned out to have lost its memory meanwhile:
        the caller then starts again from position 0.
        """
        assert self._producer is not None
        topics = self.kafka.topics
        while True:
            try:
                futures = []
                for stored in batch:
                    key, value, headers = codec.encode_stored(stored)
                    topic = topics.for_category(stored.category)
                    futures.append(
                        await self._producer.send(topic, value, key=key, headers=headers)
                    )
                await asyncio.gather(*futures)
                self.stats.published += len(batch)
                self.stats.batches += 1
                return True
            except KafkaError as exc:
                self.stats.publish_errors += 1
                log.warning("publish failed (%s); retrying the batch", exc)
                await asyncio.sleep(0.5)
                if await self._broker_lost(force=True):
                    return False

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
        log.warning("broker lost its topics: recreating them and publishing again from 0")
        await ensure_topics(
            self.kafka.bootstrap, self.kafka.topics, **self.kafka.security.client_options()
        )
        await self._mark_epoch()
        self.stats.broker_resets += 1
        return True
