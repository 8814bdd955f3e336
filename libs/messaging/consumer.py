"""The consumer pattern every Runyard service uses.

- Idempotent: each event id is recorded in the `inbox` table in the same
  transaction as the handler's effects; a redelivered event finds its row and
  is skipped. Kafka gives at-least-once, the inbox makes it exactly-once.
- Never blocks a partition: a message that cannot be decoded, or whose
  handler keeps failing, goes to the dead-letter topic with the reason, and
  the next message is processed.
- Retryable errors (a stream that moved on, a database hiccup) are retried a
  few times with backoff first; the handler reloads and decides again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
from aiokafka import ConsumerRecord
from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage
from faststream.middlewares import AckPolicy
from runyard.contracts import Event, EventMapper, RecordedEvent
from runyard.messaging import codec
from runyard.messaging.settings import KafkaSettings

log = logging.getLogger("runyard.consumer")

Handler = Callable[[RecordedEvent[Event], asyncpg.Connection], Awaitable[None]]


@dataclass
class ConsumerStats:
    processed: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    retries: int = 0
    commit_failures: int = 0


class IdempotentConsumer:
    """One consumer group running one handler over some event topics."""

    def __init__(
        self,
        name: str,
        *,
        pool: asyncpg.Pool,
        mapper: EventMapper,
        handler: Handler,
        kafka: KafkaSettings,
        max_attempts: int = 5,
    ) -> None:
        self.name = name
        self.pool = pool
        self.mapper = mapper
        self.handler = handler
        self.kafka = kafka
        self.max_attempts = max_attempts
        self.stats = ConsumerStats()
        self._broker: KafkaBroker | None = None
        self._commits_paused_until = 0.0

    def subscribe(self, broker: KafkaBroker, *topics: str) -> None:
        """Register the subscriber on `broker` (FastStream) for `topics`."""
        self._broker = broker

        @broker.subscriber(  # type: ignore[misc]
            *topics,
            group_id=self.name,
            ack_policy=AckPolicy.MANUAL,
            decoder=_raw_body,  # we decode ourselves, so a bad message can be dead-lettered
            **self.kafka.consumer_options(),  # type: ignore[arg-type]
        )
        async def on_message(body: bytes, message: KafkaMessage) -> None:
            await self.process(message.raw_message)  # type: ignore[arg-type]
            await self._commit(message)

    async def _commit(self, message: KafkaMessage) -> None:
        """Commit the offset after processing; a failed commit only means a
        redelivery, which the inbox absorbs, so it must never wedge the consumer
        (e.g. while the embedded broker restarts with no memory of the group)."""
        loop = asyncio.get_running_loop()
        if loop.time() < self._commits_paused_until:
            return  # a later commit covers this offset too
        try:
            await asyncio.wait_for(message.ack(), timeout=0.5)
        except Exception as exc:
            self.stats.commit_failures += 1
            self._commits_paused_until = loop.time() + 2.0
            log.debug("%s: offset commit failed (%r); redelivery will be deduped", self.name, exc)

    async def process(self, record: ConsumerRecord[Any, Any]) -> None:
        try:
            event = codec.decode(record.value, self.mapper)
        except codec.UndecodableMessage as exc:
            await self.dead_letter(record, exc.reason)
            return
        await self._handle(record, event)

    async def _handle(self, record: ConsumerRecord[Any, Any], event: RecordedEvent[Event]) -> None:
        for attempt in range(1, self.max_attempts + 1):
            try:
                await self._handle_once(event)
                return
            except Exception as exc:
                if getattr(exc, "retryable", False) and attempt < self.max_attempts:
                    self.stats.retries += 1
                    await asyncio.sleep(0.05 * 2**attempt)
                    continue
                log.exception("%s: handler failed on %s", self.name, event.event_id)
                await self.dead_letter(record, f"handler failed: {type(exc).__name__}: {exc}")
                return

    async def _handle_once(self, event: RecordedEvent[Event]) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            fresh = await conn.fetchval(
                """INSERT INTO inbox (consumer, event_id, global_position) VALUES ($1, $2, $3)
                   ON CONFLICT DO NOTHING RETURNING true""",
                self.name,
                event.event_id,
                event.global_position,
            )
            if not fresh:
                self.stats.duplicates += 1
                return
            await self.handler(event, conn)
        self.stats.processed += 1

    async def dead_letter(self, record: ConsumerRecord[Any, Any], reason: str) -> None:
        """Park a message on the dead-letter topic with why, where it came from."""
        assert self._broker is not None, "subscribe() first"
        self.stats.dead_lettered += 1
        log.warning(
            "%s: dead-lettering %s[%s]@%s: %s",
            self.name,
            record.topic,
            record.partition,
            record.offset,
            reason,
        )
        await self._broker.publish(
            record.value or b"",
            topic=self.kafka.topics.dead_letter,
            key=record.key,
            headers={
                "reason": reason[:1000],
                "consumer": self.name,
                "source_topic": record.topic,
                "source_partition": str(record.partition),
                "source_offset": str(record.offset),
            },
        )


async def _raw_body(message: Any) -> bytes:
    return bytes(message.body)


def make_broker(kafka: KafkaSettings, **options: Any) -> KafkaBroker:
    """A FastStream broker on `kafka.bootstrap`, with tracing middleware."""
    from faststream.kafka.opentelemetry import KafkaTelemetryMiddleware

    return KafkaBroker(
        kafka.bootstrap,
        log_level=logging.DEBUG,  # per-message access logs only when asked for
        enable_idempotence=False,
        request_timeout_ms=kafka.request_timeout_ms,
        middlewares=[KafkaTelemetryMiddleware()],
        **options,
    )
