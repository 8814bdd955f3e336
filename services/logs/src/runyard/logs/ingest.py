"""The log service's reader of the `runyard.logs` topic: worker lines into the store.

Log lines are not events: no inbox row per line. The batch consumer
(`runyard.messaging.batches`, group `logs`) takes what the broker has (up to
`max_records`), and each batch is stored in one multi-row insert; its offsets
are committed only then (the next batch is decoded while `writers` batches are
written). A crash between the two redelivers the batch, and the store's dedupe
key (`LogRecord.dedupe`) turns the repeats into no-ops. A message that is not
a log record is counted and skipped: a log pipeline must not stall on one. A
database outage is waited out (retried with backoff) rather than fatal.

N ingesters with one group share the topic's partitions; a partition that
moves in a rebalance is read again from its last committed offset, and the
dedupe key stores each line once. Lines by outcome (stored, duplicate,
malformed) and the lag of the partitions held are metrics
(`runyard.telemetry.metrics`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka import TopicPartition
from runyard.contracts.loglines import LogRecord
from runyard.logs.store import LogStore
from runyard.messaging import KafkaSettings
from runyard.messaging.batches import LogBatchConsumer
from runyard.telemetry.metrics import count_log_lines

GROUP = "logs"


@dataclass
class IngestStats:
    """Lines stored, and lines already stored (a redelivery); what was received and
    skipped is the consumer's (`LogIngester.consumer.stats`)."""

    stored: int = 0
    duplicates: int = 0


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
        self.group = group
        self.stats = IngestStats()
        #: `writers`: batches written at once (each on its own connection).
        self.consumer = LogBatchConsumer(
            group, kafka=kafka, handler=self.ingest, max_records=max_records, in_flight=writers
        )

    async def run(self) -> None:
        """Consume the logs topic until cancelled."""
        await self.consumer.run()

    def assignment(self) -> set[TopicPartition]:
        """The partitions of the logs topic this instance holds now (none when stopped)."""
        return self.consumer.assignment()

    async def ingest(self, records: Sequence[LogRecord]) -> int:
        """Store one batch; return the lines stored (the others were stored already)."""
        stored = await self.store.ingest(records)
        duplicates = len(records) - stored
        self.stats.stored += stored
        self.stats.duplicates += duplicates
        count_log_lines(self.group, stored=stored, duplicate=duplicates, malformed=0)
        return stored
