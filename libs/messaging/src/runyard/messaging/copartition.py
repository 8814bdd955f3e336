"""One consumer for a task's events and its worker lines together, so N instances
can share the work of a reader that keeps per-task state over both.

A reader such as fault tolerance's watches needs every event and every line of a
task in the same process: a hang timer that sees the task start running but not
its lines would fire on a busy task. Two consumer groups (one per topic) give no
such guarantee: each balances its partitions on its own. Here one consumer, in
one group, reads the task event topic and the logs topic, and the group uses the
range assignor: for every topic the members are sorted alike and partition `p`
goes to the same member. Both topics are keyed by the task's stream id
(`task-<id>`) and have the same partition count (`runyard.messaging.topics`), so a
task's events and lines live in partitions of the same number and reach the same
instance ("co-partitioning", as Kafka Streams calls it).

- Events go to an `IdempotentConsumer` (`process_batch`: inbox, savepoints,
  dead letters, positions), lines to a handler of `LogRecord`s (`runyard.messaging
  .batches`: malformed ones are counted and skipped). In each poll, event batches
  are handled before line batches, so a line rarely comes before the event that
  started its attempt (the reader still copes: the topics are not ordered).
- Offsets are committed after the poll's batches are handled, at most every
  `COMMIT_EVERY_S` while polls keep bringing some (the polls in between are
  covered by the next commit), and by the first poll that brings nothing; a
  failed commit is only a redelivery (the inbox and the reader's idempotence
  absorb it). An outage is waited out (`retrying`), holding the batch.
- A partition of either topic whose position is past its end (the broker lost
  what it had) is read again from its start (`read_again_if_lost`); an events
  partition also has the relay's chain (`runyard.messaging.consumer`) for a
  refilled log that grew past the position.
- After a rebalance, `on_revoked` gets the partition numbers this instance gave
  up, so it drops the state it kept for their tasks (a hang timer that no longer
  sees a task's lines must not fire), and `on_assigned` those it took over (all
  of them at start), so it sets up the state of their tasks at once.
- Which partitions an instance holds is gauge `runyard_consumer_partitions_held`
  (1 per topic and partition) on its /metrics.
- Topics of different partition counts cannot be co-partitioned: that is said at
  start (an operator changed one of them), and each topic is still read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from runyard.eventstore.transient import retrying
from runyard.messaging.batches import POLL_MS, Handler, commit_offsets, decode_lines
from runyard.messaging.consumer import (
    COMMIT_EVERY_S,
    IdempotentConsumer,
    kafka_lag,
    read_again_if_lost,
)
from runyard.messaging.settings import KafkaSettings
from runyard.telemetry.metrics import register_gauge, track_lag

log = logging.getLogger("runyard.messaging.copartition")

#: Which partitions an instance holds, for operators (and tests) to see the split.
HELD_GAUGE = "runyard_consumer_partitions_held"

#: Told partition numbers this instance gave up, or took over, in a rebalance.
Moved = Callable[[set[int]], Awaitable[object]]


class CoPartitionedConsumer:
    """Reads `events_topic` into `events` and `lines_topic` into `on_lines`, in one
    group whose members hold the same partition numbers of both (see the module)."""

    def __init__(
        self,
        events: IdempotentConsumer,
        *,
        kafka: KafkaSettings,
        on_lines: Handler,
        on_revoked: Moved | None = None,
        on_assigned: Moved | None = None,
        events_topic: str | None = None,
        lines_topic: str | None = None,
        max_records: int = 2000,
    ) -> None:
        self.events = events
        self.kafka = kafka
        self.on_lines = on_lines
        self.on_revoked = on_revoked
        self.on_assigned = on_assigned
        self.events_topic = events_topic or kafka.topics.task_events
        self.lines_topic = lines_topic or kafka.topics.logs
        self.max_records = max_records
        self.lines_malformed = 0
        self._consumer: AIOKafkaConsumer | None = None
        #: The partition numbers held since the last rebalance.
        self._held: set[int] = set()
        #: Handled offsets not committed yet, and when offsets were last committed
        #: (see `COMMIT_EVERY_S`).
        self.commit_every_s = COMMIT_EVERY_S
        self._owed: dict[TopicPartition, int] = {}
        self._last_commit = -math.inf

    @property
    def name(self) -> str:
        return self.events.name

    async def run(self) -> None:
        """Consume both topics until cancelled."""
        consumer = AIOKafkaConsumer(
            **self.kafka.client_options(),
            group_id=self.events.group_id,
            enable_auto_commit=False,
            max_poll_records=self.max_records,
            partition_assignment_strategy=(RangePartitionAssignor,),
            **self.kafka.consumer_options(),
        )
        consumer.subscribe([self.events_topic, self.lines_topic], listener=_Listener(self))
        self._consumer = consumer
        self.events.read_by(consumer)  # it seeks back a partition whose events it jumped over
        untrack = track_lag(self.name, self.lag)
        unregister = register_gauge(
            HELD_GAUGE,
            "Partitions a co-partitioned consumer of this process holds (1 each),"
            " by consumer, topic and partition.",
            self._held_partitions,
        )
        try:
            await consumer.start()
            self._check_counts(consumer)
            loop = asyncio.get_running_loop()
            while True:
                polled = await consumer.getmany(timeout_ms=POLL_MS, max_records=self.max_records)
                # A position past its end: the broker lost what it had (see consumer).
                sought = await read_again_if_lost(self.name, consumer, consumer.assignment())
                self.events.read_again(tp for tp in sought if tp.topic == self.events_topic)
                for tp in sought:  # offsets of what the broker lost are owed no commit
                    self._owed.pop(tp, None)
                polled = {tp: m for tp, m in polled.items() if tp not in sought}
                if any(polled.values()):
                    await self._handle(polled)
                    self._owe(polled)
                    if loop.time() - self._last_commit >= self.commit_every_s:
                        await self._commit(consumer)
                elif self._owed:
                    await self._commit(consumer)  # quiet: commit what is still owed
        finally:
            untrack()
            unregister()
            self._consumer = None
            self.events.read_by(None)
            with contextlib.suppress(Exception):
                await consumer.stop()

    def assignment(self) -> set[TopicPartition]:
        """The partitions this instance holds now (none when stopped)."""
        return set(self._consumer.assignment()) if self._consumer is not None else set()

    def _held_partitions(self) -> list[tuple[float, dict[str, str]]]:
        return [
            (1, {"consumer": self.name, "topic": tp.topic, "partition": str(tp.partition)})
            for tp in sorted(self.assignment())
        ]

    def lag(self) -> dict[str, int]:
        """topic -> messages not taken yet in the partitions this instance holds."""
        return kafka_lag(self._consumer)

    async def _handle(self, polled: Mapping[TopicPartition, list[Any]]) -> None:
        events = [(tp, m) for tp, m in polled.items() if tp.topic == self.events_topic and m]
        lines = [(tp, m) for tp, m in polled.items() if tp.topic == self.lines_topic and m]
        for _, messages in events:
            await self.events.process_batch(list(messages))
        for _, messages in lines:
            records, malformed = decode_lines(self.name, [m.value for m in messages])
            self.lines_malformed += malformed
            if records:
                handle = partial(self.on_lines, records)
                await retrying(handle, component=f"consumer {self.name}")

    def _owe(self, polled: Mapping[TopicPartition, list[Any]]) -> None:
        """Owe a commit of the handled `polled`; a partition read again from its start
        (not handled yet, and its earlier offsets may name a log the broker lost) owes
        nothing."""
        sought = self.events.take_sought()
        for tp in sought:
            self._owed.pop(tp, None)
        for tp, messages in polled.items():
            if messages and tp not in sought:
                self._owed[tp] = messages[-1].offset + 1

    async def _commit(self, consumer: AIOKafkaConsumer) -> None:
        """Commit what is owed for the partitions still held (between polls: only
        handled offsets), once the positions the events consumer owes are saved; a
        failed commit is owed again."""
        self._last_commit = asyncio.get_running_loop().time()
        if not await self.events.flush_positions():
            return  # the offsets wait for the saved positions of the events they cover
        held = consumer.assignment()
        offsets = {tp: offset for tp, offset in self._owed.items() if tp in held}
        self._owed = {}
        if offsets and not await commit_offsets(self.name, consumer, offsets):
            self._owed = offsets

    def _check_counts(self, consumer: AIOKafkaConsumer) -> None:
        topics = (self.events_topic, self.lines_topic)
        sizes = {t: len(p) for t in topics if (p := consumer.partitions_for_topic(t))}
        if len(set(sizes.values())) > 1:
            log.error(
                "%s: topics %s have different partition counts: a task's events and lines"
                " may reach different instances; run one instance until they match",
                self.name,
                sizes,
            )

    async def reassigned(self, assigned: set[TopicPartition]) -> None:
        """A rebalance ended: the partition numbers held before and not now go to
        `on_revoked`, those held now and not before to `on_assigned`. (A rebalance
        first revokes every partition, then assigns, often the same ones: only those
        that really moved count.)"""
        numbers = {tp.partition for tp in assigned if tp.topic == self.events_topic}
        lost, gained = self._held - numbers, numbers - self._held
        self._held = numbers
        if lost and self.on_revoked is not None:
            await self.on_revoked(lost)
        if gained and self.on_assigned is not None:
            await self.on_assigned(gained)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: CoPartitionedConsumer) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        return None

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        try:
            await self.owner.reassigned(set(assigned))
        except Exception:
            log.exception("%s: handing over the state of moved partitions failed", self.owner.name)
