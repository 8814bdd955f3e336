"""The batch consumer of the logs topic: how every reader of `runyard.logs` reads it.

Log records are not events: no inbox row per line, no dead letter. A reader
makes a redelivered line harmless itself (the log store's dedupe key; the
fault-tolerance detections are idempotent per attempt), so the consumer only
has to never skip a line and never stall on one:

- Batches: whatever the broker has, up to `max_records`, decoded into
  `LogRecord`s (`runyard.contracts.loglines`). A message that is not one is
  counted (`runyard_log_lines_total{outcome="malformed"}`, and `stats`) and
  skipped.
- The handler gets each batch's records; the batch's offsets are committed
  only once it returned, so a crash in between redelivers the batch. A commit
  that fails is only a redelivery too: it never stops the consumer.
- An outage the handler meets (`runyard.eventstore.transient`: the database
  away) is waited out with backoff: the batch is held, neither lost nor
  committed, and handled once the outage is over. Any other error ends `run`
  with it, the batch uncommitted.
- Up to `in_flight` batches are handled at once, and the next one is polled
  and decoded meanwhile; commits follow the order of the batches, so a commit
  never covers a batch that is not handled yet. One in flight: batches are
  handled one after the other, in the order of the partition.
- A position past the end of its partition means the broker lost what it had
  (an embedded broker restarted without its data) while the client kept its
  offset: the broker answers such a fetch with nothing, not an error, and
  lines published again after the loss would land below the position and be
  jumped over. The partition is then read again from its start
  (`read_again_if_lost`; the refilled partition is short, and a line read
  twice is harmless).
- N consumers with one name form one group and share the topic's partitions
  (lines are keyed by task, so one task's lines stay in one partition, in
  order); a partition that moves in a rebalance is read again from its last
  committed offset. The lag of the partitions this one holds is
  `runyard_consumer_lag{consumer=name}`.
- Cancelled, it cancels the handlers in flight and closes the consumer (it
  leaves its group at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Sequence,
)
from dataclasses import dataclass
from functools import partial

from aiokafka import AIOKafkaConsumer, TopicPartition
from runyard.contracts.loglines import LogRecord, MalformedLogRecord
from runyard.eventstore.transient import retrying
from runyard.messaging.consumer import kafka_lag, read_again_if_lost
from runyard.messaging.settings import KafkaSettings
from runyard.telemetry.metrics import count_log_lines, track_lag

log = logging.getLogger("runyard.messaging.batches")

#: What a reader does with one batch's records (its return value is not used).
Handler = Callable[[list[LogRecord]], Awaitable[object]]
Commit = Callable[[], Awaitable[None]]
#: Message values polled together, and how to commit their offsets.
Polled = tuple[list[bytes | None], Commit]
#: How long one poll waits for messages, and one commit for the broker.
POLL_MS = 200
COMMIT_TIMEOUT_S = 5.0


@dataclass
class BatchStats:
    #: Messages of the batches handled and committed (malformed ones included).
    received: int = 0
    malformed: int = 0
    batches: int = 0
    commit_failures: int = 0


class LogBatchConsumer:
    """Reads the logs topic in batches into `handler` until cancelled (see the module)."""

    def __init__(
        self,
        name: str,
        *,
        kafka: KafkaSettings,
        handler: Handler,
        topic: str | None = None,
        max_records: int = 5000,
        in_flight: int = 1,
    ) -> None:
        self.name = name
        self.kafka = kafka
        self.handler = handler
        self.topic = topic or kafka.topics.logs
        self.max_records = max_records
        self.in_flight = in_flight
        self.stats = BatchStats()
        self._consumer: AIOKafkaConsumer | None = None

    @property
    def group_id(self) -> str:
        """The consumer group: the name under the topic prefix."""
        return self.kafka.topics.prefix + self.name

    async def run(self) -> None:
        """Consume the topic until cancelled."""
        consumer = AIOKafkaConsumer(
            self.topic,
            **self.kafka.client_options(),
            group_id=self.group_id,
            enable_auto_commit=False,
            max_poll_records=self.max_records,
            **self.kafka.consumer_options(),
        )
        self._consumer = consumer
        untrack = track_lag(self.name, self.lag)
        try:
            await consumer.start()  # inside: a cancel during the group join still stops it
            async with contextlib.aclosing(self._polled(consumer)) as polled:
                await self.pipeline(polled)
        finally:
            untrack()
            self._consumer = None
            with contextlib.suppress(Exception):
                await consumer.stop()

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer holds now (none when stopped)."""
        return set(self._consumer.assignment()) if self._consumer is not None else set()

    def lag(self) -> dict[str, int]:
        """topic -> messages not taken yet in the partitions this consumer holds."""
        return kafka_lag(self._consumer)

    async def pipeline(self, batches: AsyncIterator[Polled]) -> None:
        """Decode and handle `batches`, up to `in_flight` at once, decoding the next
        one meanwhile; each batch is committed once it and every batch before it are
        handled, so a commit never covers an unhandled line. A handler that fails
        (other than an outage) ends the pipeline with its error, at once."""
        try:
            async with asyncio.TaskGroup() as group:
                uncommitted: deque[asyncio.Task[None]] = deque()
                last: asyncio.Task[None] | None = None
                async for values, commit in batches:
                    records = self.decode(values)
                    while uncommitted and uncommitted[0].done():
                        uncommitted.popleft()
                    if len(uncommitted) >= self.in_flight:
                        await asyncio.wait([uncommitted.popleft()])  # they end in order
                    last = group.create_task(self._batch(records, len(values), commit, last))
                    uncommitted.append(last)
        except BaseExceptionGroup as failed:  # the group cancelled the rest
            raise failed.exceptions[0] from None

    def decode(self, values: Sequence[bytes | None]) -> list[LogRecord]:
        """The log records among `values`; the others are counted and skipped."""
        records, malformed = decode_lines(self.name, values)
        self.stats.malformed += malformed
        return records

    async def _batch(
        self,
        records: list[LogRecord],
        received: int,
        commit: Commit,
        previous: asyncio.Task[None] | None,
    ) -> None:
        """Handle one batch, then commit it once the batch before it is committed."""
        if records:  # a batch of nothing but malformed messages is only committed
            await retrying(lambda: self.handler(records), component=f"consumer {self.name}")
        if previous is not None:
            await asyncio.wait([previous])
            if previous.cancelled() or previous.exception() is not None:
                return  # never commit past a batch that was not handled
        await commit()
        self.stats.received += received
        self.stats.batches += 1

    async def _polled(self, consumer: AIOKafkaConsumer) -> AsyncGenerator[Polled, None]:
        while True:
            polled = await consumer.getmany(timeout_ms=POLL_MS, max_records=self.max_records)
            await read_again_if_lost(self.name, consumer, consumer.assignment())
            if not any(polled.values()):
                continue
            offsets = {tp: messages[-1].offset + 1 for tp, messages in polled.items() if messages}
            values = [m.value for messages in polled.values() for m in messages]
            yield values, partial(self._commit, consumer, offsets)

    async def _commit(self, consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, int]) -> None:
        """Commit `offsets` (`commit_offsets`), counting a failure."""
        if not await commit_offsets(self.name, consumer, offsets):
            self.stats.commit_failures += 1


async def commit_offsets(
    reader: str, consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, int]
) -> bool:
    """Commit `offsets`; False when that failed. A commit that fails only means a
    redelivery, so it never stops the consumer (e.g. a partition that moved to another
    member meanwhile)."""
    try:
        async with asyncio.timeout(COMMIT_TIMEOUT_S):
            await consumer.commit(offsets)
    except Exception as exc:
        log.debug("%s: offset commit failed (%r); the batch may come again", reader, exc)
        return False
    return True


def decode_lines(reader: str, values: Sequence[bytes | None]) -> tuple[list[LogRecord], int]:
    """The log records among `values` and how many were not one (logged, and counted
    as `runyard_log_lines_total{consumer=reader, outcome="malformed"}`)."""
    records: list[LogRecord] = []
    for value in values:
        try:
            records.append(LogRecord.from_bytes(value))
        except MalformedLogRecord as exc:
            log.warning("%s: skipping a malformed log record: %s", reader, exc)
    malformed = len(values) - len(records)
    if malformed:
        count_log_lines(reader, stored=0, duplicate=0, malformed=malformed)
    return records, malformed
