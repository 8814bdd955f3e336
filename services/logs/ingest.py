"""The batch consumer of the `runyard.logs` topic.

Log lines are not events: no inbox row per line. The consumer takes what the
broker has (up to `max_records`), stores it in one multi-row insert, and only
then commits the offsets (it parses the next batch while others are written). A
crash between the two redelivers the batch, and the store's dedupe key turns
the repeats into no-ops. A message that is not a
log line is counted and skipped: a log pipeline must not stall on one. A
database outage is waited out (retried with backoff) rather than fatal.

N ingesters with one group share the topic's partitions (lines are keyed by
task, so one task's lines stay in order in one partition); a partition that
moves in a rebalance is read again from its last committed offset, and the
dedupe key stores each line once. Lines by outcome and the lag of the
partitions held are metrics (`runyard.telemetry.metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from runyard.eventstore.transient import retrying
from runyard.logs.records import LogRecord, MalformedRecord, parse
from runyard.logs.store import LogStore
from runyard.messaging import KafkaSettings
from runyard.messaging.consumer import kafka_lag
from runyard.telemetry.metrics import count_log_lines, track_lag

log = logging.getLogger("runyard.logs.ingest")
GROUP = "logs"

Done = Callable[[], Awaitable[None]]
#: Message values and what to do once they are stored (commit their offsets).
Batch = tuple[list[bytes | None], Done]


@dataclass
class IngestStats:
    received: int = 0
    stored: int = 0
    duplicates: int = 0
    malformed: int = 0
    batches: int = 0


class LogIngester:
    """Reads the logs topic into the store until cancelled."""

    def __init__(
        self,
        store: LogStore,
        kafka: KafkaSettings,
        *,
        group: str = GROUP,
        max_records: int = 5000,
        writers: int = 1,
    ) -> None:
        self.store = store
        self.kafka = kafka
        self.group = group
        self.max_records = max_records
        #: Batches written at once (each on its own connection).
        self.writers = writers
        self.stats = IngestStats()
        self._consumer: AIOKafkaConsumer | None = None

    async def run(self) -> None:
        """Consume the logs topic until cancelled."""
        consumer = AIOKafkaConsumer(
            self.kafka.topics.logs,
            **self.kafka.client_options(),
            group_id=self.kafka.topics.prefix + self.group,
            enable_auto_commit=False,
            max_poll_records=self.max_records,
            **self.kafka.consumer_options(),  # type: ignore[arg-type]
        )
        self._consumer = consumer
        untrack = track_lag(self.group, self.lag)
        try:
            await consumer.start()  # inside: a cancel during the group join still stops it
            await self.pipeline(self._polled(consumer))
        finally:
            untrack()
            self._consumer = None
            with contextlib.suppress(Exception):
                await consumer.stop()

    def assignment(self) -> set[TopicPartition]:
        """The partitions of the logs topic this instance holds now (none when stopped)."""
        return set(self._consumer.assignment()) if self._consumer is not None else set()

    def lag(self) -> dict[str, int]:
        """topic -> lines not taken yet in the partitions this instance holds."""
        return kafka_lag(self._consumer)

    async def _polled(self, consumer: AIOKafkaConsumer) -> AsyncIterator[Batch]:
        while True:
            polled = await consumer.getmany(timeout_ms=200, max_records=self.max_records)
            if not any(polled.values()):
                continue
            offsets = {tp: messages[-1].offset + 1 for tp, messages in polled.items() if messages}

            async def commit(offsets: dict[TopicPartition, int] = offsets) -> None:
                with contextlib.suppress(Exception):  # a lost commit is only a redelivery
                    await asyncio.wait_for(consumer.commit(offsets), timeout=5)

            yield [m.value for messages in polled.values() for m in messages], commit

    async def pipeline(self, batches: AsyncIterator[Batch]) -> None:
        """Store `batches`, up to `writers` at once, parsing the next one meanwhile;
        each batch's `done` (its offset commit) runs once it and every batch
        before it are stored, so a commit never covers an unstored line."""
        writing: deque[tuple[asyncio.Task[int], Done]] = deque()
        try:
            async for values, done in batches:
                records = self.parse_batch(values)
                while len(writing) >= self.writers:
                    await self._finish(writing.popleft())
                task = asyncio.create_task(self._store_counted(records, len(values)))
                writing.append((task, done))
            while writing:
                await self._finish(writing.popleft())
        finally:
            for task, _ in writing:
                task.cancel()
            await asyncio.gather(*(task for task, _ in writing), return_exceptions=True)

    @staticmethod
    async def _finish(writing: tuple[asyncio.Task[int], Done]) -> None:
        task, done = writing
        await task
        await done()

    async def store_batch(self, values: list[bytes | None]) -> int:
        """Parse and store one batch of message values; return the lines stored."""
        return await self._store_counted(self.parse_batch(values), len(values))

    def parse_batch(self, values: list[bytes | None]) -> list[LogRecord]:
        records: list[LogRecord] = []
        for value in values:
            try:
                records.append(parse(value))
            except MalformedRecord as exc:
                self.stats.malformed += 1
                log.warning("skipping a malformed log record: %s", exc)
        if len(records) < len(values):
            count_log_lines(self.group, stored=0, duplicate=0, malformed=len(values) - len(records))
        return records

    async def _store_counted(self, records: list[LogRecord], received: int) -> int:
        stored = await self._store(records)
        self.stats.received += received
        self.stats.stored += stored
        self.stats.duplicates += len(records) - stored
        count_log_lines(self.group, stored=stored, duplicate=len(records) - stored, malformed=0)
        self.stats.batches += 1
        return stored

    async def _store(self, records: list[LogRecord]) -> int:
        """Store `records`, waiting out a database outage (with backoff) for as long
        as it lasts: offsets are committed only after, so nothing is skipped."""
        return await retrying(lambda: self.store.ingest(records), component="log ingest")
