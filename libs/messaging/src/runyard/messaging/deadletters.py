"""Dead-lettered messages: read them back, and publish a parked event again.

The dead-letter topic is the record: the relay parks a reference to an event
the broker could not take (`source: relay`, value `{event_id, stream_id, ...,
reason}`), a consumer parks the message it could not handle (header
`consumer`, the original envelope as value). `read_dead_letters` reads the
topic from the beginning to its end with a consumer without a group, so
listing commits no offset and moves nobody. `republish` reads the event from
the store by id and sends it to its topic as the relay does (same key,
value and headers); consumers dedupe it by event id in their inbox, so a
retry reaches a consumer that had not handled it once and no one twice.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
)
from runyard.eventstore import StoredEvent
from runyard.messaging import codec
from runyard.messaging.settings import KafkaSettings

#: The producer's largest message: Kafka's default `message.max.bytes` (1 MiB).
MAX_MESSAGE_BYTES = 1024 * 1024
#: Errors about one message that sending it again can never fix.
MESSAGE_ERRORS: tuple[type[KafkaError], ...] = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    CorruptRecordException,
    InvalidTimestampError,
)

_BY_ID = """
SELECT global_position, event_id, stream_id, stream_version, event_type, schema_version,
       data::text AS data, metadata::text AS metadata, occurred_at
FROM events WHERE event_id = $1
"""


@dataclass(frozen=True)
class DeadLetter:
    """One message of the dead-letter topic: where it is, who parked it, why, and
    the event it stands for (None where the message does not say)."""

    partition: int
    offset: int
    parked_at: datetime
    source: str  # "relay", or the consumer's name
    reason: str
    event_id: str | None = None
    stream_id: str | None = None
    stream_version: int | None = None
    global_position: int | None = None
    type: str | None = None
    size: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "parked_at": self.parked_at.isoformat()}


class RepublishFailed(Exception):
    """The event could not be published again; `reason` says why."""

    def __init__(self, event_id: str, reason: str) -> None:
        super().__init__(f"event {event_id}: {reason}")
        self.event_id = event_id
        self.reason = reason


@dataclass(frozen=True)
class Republished:
    """Where a retried event went."""

    event_id: str
    stream_id: str
    type: str
    global_position: int
    topic: str
    partition: int
    offset: int
    size: int


def parse_dead_letter(
    partition: int, offset: int, timestamp_ms: int, headers: dict[str, str], value: bytes | None
) -> DeadLetter:
    """A dead-letter message as a `DeadLetter`; a value that is not JSON still lists."""
    try:
        body = json.loads(value or b"")
    except (ValueError, UnicodeDecodeError):
        body = None
    fields = body if isinstance(body, dict) else {}
    source = "relay" if headers.get("source") == "relay" else headers.get("consumer", "?")
    return DeadLetter(
        partition=partition,
        offset=offset,
        parked_at=datetime.fromtimestamp(timestamp_ms / 1000, UTC),
        source=source,
        reason=headers.get("reason") or str(fields.get("reason", "")),
        event_id=_text(fields.get("event_id")),
        stream_id=_text(fields.get("stream_id")),
        stream_version=_number(fields.get("stream_version")),
        global_position=_number(fields.get("global_position")),
        type=_text(fields.get("type")),
        size=_number(fields.get("size")) if source == "relay" else len(value or b""),
    )


async def read_dead_letters(kafka: KafkaSettings) -> list[DeadLetter]:
    """Every message on the dead-letter topic, oldest first per partition.

    Reads up to the end offsets seen at the start, without a consumer group."""
    topic = kafka.topics.dead_letter
    consumer = AIOKafkaConsumer(**kafka.client_options(), group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        await consumer.topics()  # fetches the metadata partitions_for_topic reads
        found = consumer.partitions_for_topic(topic) or set()
        partitions = [TopicPartition(topic, p) for p in sorted(found)]
        if not partitions:
            return []
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        found_letters: list[DeadLetter] = []
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            batches = await consumer.getmany(*partitions, timeout_ms=1000)
            for tp, records in batches.items():
                found_letters.extend(
                    parse_dead_letter(
                        tp.partition,
                        r.offset,
                        r.timestamp,
                        {k: bytes(v).decode(errors="replace") for k, v in r.headers or ()},
                        r.value,
                    )
                    for r in records
                    if r.offset < ends[tp]
                )
        return sorted(found_letters, key=lambda d: (d.parked_at, d.partition, d.offset))
    finally:
        await consumer.stop()


async def load_stored(conn: asyncpg.Connection | asyncpg.Pool, event_id: UUID) -> StoredEvent:
    """The event with this id as stored; `RepublishFailed` when the store has none."""
    row = await conn.fetchrow(_BY_ID, event_id)
    if row is None:
        raise RepublishFailed(str(event_id), "no event with this id in the event store")
    return StoredEvent.from_row(row)


async def republish(
    stored: StoredEvent, kafka: KafkaSettings, *, max_message_bytes: int = MAX_MESSAGE_BYTES
) -> Republished:
    """Send `stored` to its topic as the relay does and wait for the broker's ack.

    `RepublishFailed` with the broker's reason when it still cannot take it."""
    key, value, headers = codec.encode_stored(stored)
    topic = kafka.topics.for_category(stored.category)
    producer = AIOKafkaProducer(
        **kafka.client_options(),
        enable_idempotence=False,  # as the relay: the embedded broker rejects InitProducerId
        acks=1,
        request_timeout_ms=kafka.request_timeout_ms,
        max_request_size=max_message_bytes,
    )
    await producer.start()
    try:
        sent = await producer.send_and_wait(topic, value, key=key, headers=headers)
    except MESSAGE_ERRORS as exc:
        reason = f"the broker cannot take it ({len(value)} bytes): {type(exc).__name__}: {exc}"
        raise RepublishFailed(str(stored.event_id), reason) from exc
    finally:
        await producer.stop()
    return Republished(
        event_id=str(stored.event_id),
        stream_id=stored.stream_id,
        type=stored.event_type,
        global_position=stored.global_position,
        topic=sent.topic,
        partition=sent.partition,
        offset=sent.offset,
        size=len(value),
    )


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _number(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
