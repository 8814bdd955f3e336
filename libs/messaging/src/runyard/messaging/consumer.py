"""The consumer pattern every Runyard service uses.

- Idempotent: each event id is recorded in the `inbox` table in the same
  transaction as the handler's effects; a redelivered event finds its row and
  is skipped. Kafka gives at-least-once, the inbox makes it exactly-once.
- Never blocks a partition: a message that cannot be decoded, or whose
  handler keeps failing, goes to the dead-letter topic with the reason, and
  the next message is processed.
- Retryable errors (a stream that moved on) are retried a few times with
  backoff first; the handler reloads and decides again.
- Outages are waited out: while the database (or the broker, for a dead
  letter) cannot be reached, the batch is retried with backoff and jitter,
  the consumer is marked down in the process's health, and nothing is dead-
  lettered or skipped; the partition simply waits.
- Each batch's transaction also raises the group's positions per partition
  (`runyard.messaging.positions`): after a broker loss, the relay publishes
  again only what some group had not handled. A batch whose events the
  consumer skips (none of its types) writes nothing: its positions are owed,
  and saved with the next batch's transaction or before the next offset
  commit, whichever comes first (`flush_positions`). So a committed offset
  never runs ahead of the saved positions, and a service that cares for two
  of a task's fifteen events does not commit a transaction for the other
  thirteen.
- Never jumps over events: each message names the previous event the relay
  published to its partition (header `prev`). A message whose `prev` is past
  what the group handled there (memory first, then the group's stored position)
  means events were jumped over: a client kept its offset across a broker that
  lost its memory, and the refilled log reached that offset before the client
  read again. The partition is then read again from its start (the refilled
  log is short: the relay publishes again only the unconfirmed tail), and the
  rest of the batch in that partition is left for then. Past the jump, a
  message that still does not follow (one the relay sent before it noticed the
  loss; it comes again, in order) is left for when it does, for at most
  `GAP_WAIT_S`; then the consumer says what never came and reads the partition
  from its start once more, taking what was left out of order. A partition is
  read again once per jump, never in a loop: a refilled log whose chain has a
  hole no relay will fill costs one wait, not a stuck partition.
- Never waits past the end either: when the refilled log stays shorter than
  the kept offset, the broker answers the client's fetches with nothing, so no
  message comes to show the jump. Every `ENDS_CHECK_S` the consumer compares
  each partition's position with its end (what the last fetch said); a
  position past the end is read again from the start the same way.
- Scales out: N instances with one name form one consumer group and share the
  topics' partitions. A partition that moves to another instance in a
  rebalance is read again from its last committed offset; what the previous
  owner handled after that offset finds its inbox rows and is skipped.
- Measured (`runyard.telemetry.metrics`): events taken by outcome, handler
  time, and the lag of the partitions it holds.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from time import perf_counter
from typing import Any
from uuid import UUID

import asyncpg
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.errors import IllegalStateError
from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage
from faststream.middlewares import AckPolicy
from opentelemetry import trace
from opentelemetry.propagate import extract
from runyard.contracts import Event, EventMapper, RecordedEvent
from runyard.eventstore.transient import is_transient, retrying
from runyard.messaging import codec
from runyard.messaging.positions import (
    Positions,
    global_position,
    previous_position,
    save_positions,
)
from runyard.messaging.settings import KafkaSettings
from runyard.telemetry.metrics import ConsumerMetrics, track_lag

log = logging.getLogger("runyard.consumer")

#: How long a consumer that read a partition again waits for the events it missed
#: to come, in order, before it goes on without them (and logs an error).
GAP_WAIT_S = 60.0
#: How often a consumer checks that no position of its is past its partition's end.
ENDS_CHECK_S = 1.0
#: After a failed save of owed positions, the next try waits this long (the
#: offsets it holds back wait too; a redelivery is only skipped again).
FLUSH_RETRY_S = 2.0
#: How long a save of owed positions may take before it counts as failed.
FLUSH_TIMEOUT_S = 5.0
#: Offsets are committed at most this often while batches keep coming; the
#: batches in between are covered by the next commit, or by the first poll that
#: finds nothing (between batches, so only handled offsets are committed). A
#: commit is a broker request; committing every batch of a trickle cost about
#: as much CPU as handling it. A crash or rebalance reads again at most this
#: much, which the inbox skips.
COMMIT_EVERY_S = 0.25
_tracer = trace.get_tracer("runyard.messaging")

Handler = Callable[[RecordedEvent[Event], asyncpg.Connection], Awaitable[None]]
#: Runs in the batch's transaction after its events (e.g. one planning pass).
BatchHook = Callable[[asyncpg.Connection], Awaitable[None]]


@dataclass
class ConsumerStats:
    processed: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    retries: int = 0
    commit_failures: int = 0
    skipped: int = 0
    #: Partitions read again from their start: events had been jumped over.
    rewinds: int = 0
    #: Messages left for later, as they did not follow what was handled.
    out_of_order: int = 0
    #: Jumps whose missing events never came again within `GAP_WAIT_S`.
    given_up: int = 0


class IdempotentConsumer:
    """One consumer group running one handler over some event topics.

    Messages come in batches (whatever the broker has, up to `max_records`).
    A batch is handled in one database transaction: one statement records the
    inbox rows of all its events (and tells which are new), then each new event
    is handled inside its own savepoint, so a batch costs one commit instead of
    one per event, and a failing event is rolled back alone (its inbox row too,
    so a retried dead letter is handled again). A handler that never writes
    through the batch's connection (`isolated=False`: it appends through its
    own store, or only starts background work) runs without the savepoint.
    Offsets are committed after the transaction, at most every `COMMIT_EVERY_S`
    (the batches in between are covered by the next commit). Events whose
    type the handler does not care about (`event_types`) are skipped before any
    database work.
    """

    def __init__(
        self,
        name: str,
        *,
        pool: asyncpg.Pool,
        mapper: EventMapper,
        handler: Handler,
        kafka: KafkaSettings,
        max_attempts: int = 5,
        event_types: frozenset[str] | None = None,
        max_records: int = 200,
        after_batch: BatchHook | None = None,
        isolated: bool = True,
    ) -> None:
        self.name = name
        self.pool = pool
        self.mapper = mapper
        self.handler = handler
        self.kafka = kafka
        self.max_attempts = max_attempts
        self.event_types = event_types
        self.max_records = max_records
        self.after_batch = after_batch
        self.isolated = isolated
        self.stats = ConsumerStats()
        self.metrics = ConsumerMetrics(name)
        self._broker: KafkaBroker | None = None
        self._subscriber: Any = None
        self._commits_paused_until = 0.0
        #: See COMMIT_EVERY_S: when offsets were last committed, and whether handled
        #: offsets wait for a commit.
        self.commit_every_s = COMMIT_EVERY_S
        self._last_commit = -math.inf
        self._commit_owed = False
        #: Positions of batches that were only skipped, not saved yet (see the
        #: module); a failed save pauses commits (`_commits_paused_until`).
        self._positions_owed: Positions = {}
        #: Subscribed topics whose registration row is not written yet.
        self._unregistered: set[str] = set()
        #: (topic, partition) -> the highest position taken there (see `_in_order`).
        self._taken: Positions = {}
        #: (topic, partition) -> when it was read again from its start, until a
        #: message follows what was handled (and, after a jump, until the event the
        #: jump's message followed is taken: `_awaited`).
        self._rewound_at: dict[tuple[str, int], float] = {}
        #: (topic, partition) -> the position a jumping message said came before it
        #: (`prev`), awaited since the partition was read again for it.
        self._awaited: Positions = {}
        #: Partitions sought back since `take_sought`: their offsets must not be
        #: committed from the batch that saw the jump.
        self._sought: set[TopicPartition] = set()
        #: The client that reads for `attach`ed consumers (it seeks for them).
        self._reader: AIOKafkaConsumer | None = None
        #: The check of positions past their partition's end (see `_watch_ends`).
        self._ends_watch: asyncio.Task[None] | None = None

    @property
    def group_id(self) -> str:
        """The consumer group: the name under the topic prefix, so isolated
        deployments (and tests) never share groups."""
        return self.kafka.topics.prefix + self.name

    def subscribe(self, broker: KafkaBroker, *topics: str) -> None:
        """Register the subscriber on `broker` (FastStream) for `topics`."""
        self._broker = broker
        self._unregistered.update(topics)
        self._subscriber = broker.subscriber(  # type: ignore[call-overload]
            *topics,
            group_id=self.group_id,
            batch=True,
            max_records=self.max_records,
            batch_timeout_ms=self.kafka.fetch_max_wait_ms,
            ack_policy=AckPolicy.MANUAL,
            decoder=_the_message,  # we decode ourselves, so a bad message can be dead-lettered
            listener=_WatchEnds(self),
            **self.kafka.consumer_options(),
        )
        subscriber = self._subscriber

        async def poll(consumer: AIOKafkaConsumer) -> tuple[ConsumerRecord[Any, Any], ...]:
            return await self._poll(consumer, subscriber.batch_timeout_ms)

        subscriber.get_msg = poll  # FastStream's, replaced: see `_poll`
        track_lag(self.name, self.lag)

        @self._subscriber  # type: ignore[untyped-decorator]  # FastStream's is not annotated
        async def on_messages(message: Any) -> None:  # a KafkaMessage (see _the_message)
            records = message.raw_message
            batch = records if isinstance(records, tuple) else (records,)
            await self.process_batch(list(batch))
            await self._commit(message)

    def attach(
        self, broker: KafkaBroker, *topics: str, reader: AIOKafkaConsumer | None = None
    ) -> None:
        """Read `topics` through another consumer that hands their batches to
        `process_batch` (`runyard.messaging.copartition`); `broker` carries dead letters,
        `reader` (or a later `read_by`) is that consumer's client."""
        self._broker = broker
        self._unregistered.update(topics)
        self._reader = reader

    def read_by(self, reader: AIOKafkaConsumer | None) -> None:
        """The client an `attach`ed consumer's batches come from (None: stopped)."""
        self._reader = reader

    def watch_ends(self) -> None:
        """Start checking, every `ENDS_CHECK_S` while a client runs, that no position
        is past its partition's end (called once partitions are assigned)."""
        if self._kafka_consumer() is None:
            return
        if self._ends_watch is None or self._ends_watch.done():
            self._ends_watch = asyncio.create_task(self._watch_ends())

    async def _watch_ends(self) -> None:
        """Until no client runs: read again from its start each partition whose
        position is past its end (see the module). A client started again meanwhile
        (the broker stopped and started) is checked in turn."""
        while True:
            await asyncio.sleep(ENDS_CHECK_S)
            current = self._kafka_consumer()
            if current is None:
                return
            try:
                lost = await read_again_if_lost(self.name, current, current.assignment())
            except Exception as exc:  # the client stopping meanwhile
                log.debug("%s: could not compare positions with ends (%r)", self.name, exc)
                continue
            self.read_again(lost)
            for key in list(self._awaited):  # also in a quiet partition: no message comes
                if self._overdue(key):  # (a batch may have taken it since the list was made)
                    await self._give_up(key)

    def read_again(self, partitions: Iterable[TopicPartition]) -> None:
        """Note `partitions` as sought back to their start by the client (their
        batch's offsets must not be committed; what comes first may not follow)."""
        now = asyncio.get_running_loop().time()
        for tp in partitions:
            self._rewound_at[(tp.topic, tp.partition)] = now
            self._sought.add(tp)
            self.stats.rewinds += 1

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """`partitions` went to another instance: a jump awaited there is its now."""
        for tp in partitions:
            self._rewound_at.pop((tp.topic, tp.partition), None)
            self._awaited.pop((tp.topic, tp.partition), None)

    def take_sought(self) -> set[TopicPartition]:
        """The partitions read again from their start since the last call (their
        batch's offsets must not be committed)."""
        sought, self._sought = self._sought, set()
        return sought

    def lag(self) -> Mapping[str, int]:
        """topic -> messages not taken yet in the partitions this instance holds."""
        return kafka_lag(self._kafka_consumer())

    def assignment(self) -> set[TopicPartition]:
        """The partitions this instance holds now (none before the broker starts)."""
        consumer = self._kafka_consumer()
        return set(consumer.assignment()) if consumer is not None else set()

    def _kafka_consumer(self) -> AIOKafkaConsumer | None:
        if self._reader is not None:
            return self._reader
        # FastStream's subscriber holds its aiokafka consumer while it runs.
        return getattr(self._subscriber, "consumer", None)

    async def _poll(
        self, consumer: AIOKafkaConsumer, timeout_ms: int
    ) -> tuple[ConsumerRecord[Any, Any], ...]:
        """The next batch: FastStream's batch poll, without its pause after an empty
        one, and committing the offsets a quiet consumer still owes.

        FastStream 0.7's batch subscriber sleeps `batch_timeout_ms` after every poll
        that found nothing, and a message arriving meanwhile waits out that sleep:
        half an idle consumer's time, about 11 ms a hop on average with the 50 ms
        wait. `getmany` already waits up to the timeout for records, so the loop
        does not spin without the sleep."""
        polled = await consumer.getmany(timeout_ms=timeout_ms, max_records=self.max_records)
        if not polled:
            await self._commit_owed_offsets(consumer.commit)
        return tuple(itertools.chain.from_iterable(polled.values()))

    async def _commit(self, message: KafkaMessage) -> None:
        """After a batch is handled: commit its offsets, or leave them to the next
        commit if the last was less than `commit_every_s` ago."""
        if self.take_sought():
            return  # a partition was sought back: these offsets are not handled yet
        self._commit_owed = True
        if asyncio.get_running_loop().time() - self._last_commit >= self.commit_every_s:
            await self._commit_owed_offsets(message.ack)

    async def _commit_owed_offsets(self, commit: Callable[[], Awaitable[None]]) -> None:
        """Commit the consumer's offsets (only ever called between batches, when all it
        took is handled). A failed commit only means a redelivery, which the inbox
        absorbs, so it must never wedge the consumer (e.g. while the embedded broker
        restarts with no memory of the group)."""
        loop = asyncio.get_running_loop()
        if not self._commit_owed or loop.time() < self._commits_paused_until:
            return  # nothing owed, or a later commit covers these offsets too
        if not await self.flush_positions():
            return  # the offsets wait for the positions of what they cover
        self._commit_owed = False
        self._last_commit = loop.time()
        try:
            async with asyncio.timeout(0.5):
                await commit()
        except Exception as exc:
            self.stats.commit_failures += 1
            self._commit_owed = True
            self._commits_paused_until = loop.time() + 2.0
            log.debug("%s: offset commit failed (%r); redelivery will be deduped", self.name, exc)

    async def process(self, record: ConsumerRecord[Any, Any]) -> None:
        """Handle one message (a batch of one)."""
        await self.process_batch([record])

    async def process_batch(self, records: list[ConsumerRecord[Any, Any]]) -> None:
        """Decode, filter and handle a batch; never raises for one bad message.

        While the database cannot be reached it waits (retrying with backoff) and
        does not return: the batch is handled once the database is back."""
        records, positions = await self._in_order(records)
        wanted: list[tuple[ConsumerRecord[Any, Any], RecordedEvent[Event]]] = []
        for record in records:
            if not self._wants(record):
                self.stats.skipped += 1
                continue
            try:
                wanted.append((record, codec.decode(record.value, self.mapper)))
            except codec.UndecodableMessage as exc:
                self.metrics.handled("unknown", "undecodable")
                await self.dead_letter(record, exc.reason)
        component = f"consumer {self.name}"
        if not wanted:
            self._positions_owed = _highest(self._positions_owed, positions)  # see flush_positions
            return
        done = await retrying(lambda: self._handle_batch(wanted, positions), component=component)
        self.stats.processed += sum(done)

    async def _handle_batch(
        self,
        wanted: list[tuple[ConsumerRecord[Any, Any], RecordedEvent[Event]]],
        positions: Positions,
    ) -> list[bool]:
        """Handle `wanted` in one transaction (or one by one if that fails);
        transient errors raise, for `retrying` to wait out."""
        owed = dict(self._positions_owed)
        positions = _highest(owed, positions)
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                fresh = await self._record(conn, [event for _, event in wanted])
                done = [await self._handle(conn, record, event, fresh) for record, event in wanted]
                if self.after_batch is not None:
                    await self.after_batch(conn)
                await self._write_positions(conn, positions)
            self._registered()
            self._paid(owed)
            return done
        except Exception as exc:
            if is_transient(exc):
                raise
            # The batch transaction itself failed: nothing of it is committed;
            # handle each event on its own instead.
            log.warning("%s: batch of %d failed; one by one", self.name, len(wanted))
        done = []
        for record, event in wanted:
            async with self.pool.acquire() as conn, conn.transaction():
                fresh = await self._record(conn, [event])
                done.append(await self._handle(conn, record, event, fresh))
                if self.after_batch is not None:
                    await self.after_batch(conn)
        await self._save_positions(positions)
        self._paid(owed)
        return done

    async def _in_order(
        self, records: list[ConsumerRecord[Any, Any]]
    ) -> tuple[list[ConsumerRecord[Any, Any]], Positions]:
        """The records that follow what the group handled in their partition, and the
        highest position among them per partition (what the batch's transaction
        records as handled); a jump over events sends the partition back to its start
        (see the module docstring). A message without a position (not from the relay)
        counts for no position."""
        kept: list[ConsumerRecord[Any, Any]] = []
        positions: Positions = {}
        sought: set[tuple[str, int]] = set()
        for record in records:
            key = (record.topic, record.partition)
            if key in sought:
                continue  # read again from the start: this one comes again, in order
            prev = previous_position(record)
            if prev is not None and prev > self._taken.get(key, -1):
                # Memory may lag (another instance held the partition): ask the store.
                handled = await retrying(
                    partial(self._group_position, key), component=f"consumer {self.name}"
                )
                # No position stored: the group never handled this partition, so
                # nothing of it can have been jumped over.
                taken = prev if handled is None else handled
                self._taken[key] = max(self._taken.get(key, -1), taken)
            if prev is not None and prev > self._taken[key]:
                if key not in self._rewound_at:
                    await self._read_again(key, prev)
                    sought.add(key)
                elif self._overdue(key):
                    await self._give_up(key)
                    sought.add(key)
                else:
                    self.stats.out_of_order += 1
                continue
            position = global_position(record)
            if position is not None:
                self._taken[key] = max(self._taken.get(key, -1), position)
                positions[key] = max(positions.get(key, 0), position)
            if self._taken.get(key, -1) >= self._awaited.get(key, -1):
                # What was read again follows on (after a jump: the awaited event came).
                self._rewound_at.pop(key, None)
                self._awaited.pop(key, None)
            kept.append(record)
        return kept, positions

    async def _group_position(self, key: tuple[str, int]) -> int | None:
        """The highest position the group handled in the partition (None: nothing yet)."""
        value = await self.pool.fetchval(
            """SELECT position FROM consumer_positions
               WHERE consumer = $1 AND topic = $2 AND partition = $3""",
            self.name,
            *key,
        )
        return None if value is None else int(value)

    async def _read_again(self, key: tuple[str, int], prev: int) -> None:
        """Seek the partition back to its start: events before `prev` were jumped over."""
        log.warning(
            "%s: events of %s partition %d were jumped over (handled up to position %d,"
            " the next message follows %d): reading the partition again from its start",
            self.name,
            key[0],
            key[1],
            self._taken[key],
            prev,
        )
        self._awaited[key] = prev
        await self._seek_to_start(key)

    async def _seek_to_start(self, key: tuple[str, int]) -> None:
        tp = TopicPartition(*key)
        self.read_again([tp])
        consumer = self._kafka_consumer()
        if consumer is None:
            return
        try:
            await consumer.seek_to_beginning(tp)
        except Exception as exc:  # revoked meanwhile: its next owner reads it
            log.info("%s: could not seek %s back (%r)", self.name, tp, exc)

    def _overdue(self, key: tuple[str, int]) -> bool:
        """Whether the partition waited `GAP_WAIT_S` for the event a jump followed."""
        since = self._rewound_at.get(key)
        return (
            key in self._awaited
            and since is not None
            and asyncio.get_running_loop().time() - since >= GAP_WAIT_S
        )

    async def _give_up(self, key: tuple[str, int]) -> None:
        """The events a jump went over never came again (the partition was read from
        its start, and `GAP_WAIT_S` passed): say so, count them as passed, and read
        the partition from its start once more, so that what was left out of order
        meanwhile is handled now (what was handled is skipped by the inbox). Once,
        never in a loop: the next jump over what is taken now is a new one."""
        awaited = self._awaited.pop(key, None)
        if awaited is None:
            return  # the awaited event came meanwhile
        log.error(
            "%s: events of %s partition %d between positions %d and %d never came"
            " again; going on without them (the event store has them)",
            self.name,
            key[0],
            key[1],
            self._taken[key],
            awaited,
        )
        self.stats.given_up += 1
        self._taken[key] = max(self._taken[key], awaited)
        await self._seek_to_start(key)

    async def flush_positions(self) -> bool:
        """Save the positions that batches of skipped events owe; called before offsets
        are committed, so a committed offset never runs ahead of the saved positions.
        False when the database cannot take them now: the commit waits (and the next
        try waits `FLUSH_RETRY_S`)."""
        owed = dict(self._positions_owed)
        if not owed:
            return True
        loop = asyncio.get_running_loop()
        if loop.time() < self._commits_paused_until:
            return False
        try:
            async with asyncio.timeout(FLUSH_TIMEOUT_S):
                await self._save_positions(owed)
        except Exception as exc:
            self._commits_paused_until = loop.time() + FLUSH_RETRY_S
            log.debug("%s: owed positions not saved (%r); offsets wait", self.name, exc)
            return False
        self._paid(owed)
        return True

    def _paid(self, saved: Positions) -> None:
        """`saved` is written: what it covers is owed no more."""
        for key, position in saved.items():
            if self._positions_owed.get(key, -1) <= position:
                self._positions_owed.pop(key, None)

    async def _save_positions(self, positions: Positions) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await self._write_positions(conn, positions)
        self._registered()

    async def _write_positions(self, conn: asyncpg.Connection, positions: Positions) -> None:
        """Raise the group's positions; the first time, also register every subscribed
        topic (partition -1), so a topic it has not received anything from yet counts."""
        rows = dict(positions)
        for topic in self._unregistered:
            rows.setdefault((topic, -1), 0)
        await save_positions(conn, self.name, rows)

    def _registered(self) -> None:
        self._unregistered.clear()

    def _wants(self, record: ConsumerRecord[Any, Any]) -> bool:
        if self.event_types is None:
            return True
        for key, value in record.headers or ():
            if key == "event_type":
                return bytes(value).decode() in self.event_types
        return True  # no header: decode it and let the handler (or dead letter) decide

    async def _record(
        self, conn: asyncpg.Connection, events: list[RecordedEvent[Event]]
    ) -> set[UUID]:
        """Insert the inbox rows of `events`; the ids of those not seen before."""
        rows = await conn.fetch(
            """INSERT INTO inbox (consumer, event_id, global_position)
               SELECT $1, * FROM unnest($2::uuid[], $3::bigint[])
               ON CONFLICT DO NOTHING RETURNING event_id""",
            self.name,
            [e.event_id for e in events],
            [e.global_position for e in events],
        )
        return {row["event_id"] for row in rows}

    async def _handle(
        self,
        conn: asyncpg.Connection,
        record: ConsumerRecord[Any, Any],
        event: RecordedEvent[Event],
        fresh: set[UUID],
    ) -> bool:
        """Handle one event if it is in `fresh` (taken from there: a second copy in
        the batch is a duplicate); True when it was new and handled.

        It runs in a consumer span whose parent is the event's own trace context,
        so whatever the handler writes stays in the trace of its cause (the batch
        span FastStream opens cannot have one parent per message)."""
        with _tracer.start_as_current_span(
            f"{self.name} {event.type}",
            context=extract(event.metadata.trace_context),
            kind=trace.SpanKind.CONSUMER,
            links=_link_to_current(),
        ):
            if event.event_id not in fresh:
                self.stats.duplicates += 1
                self.metrics.handled(event.type, "duplicate")
                return False
            fresh.discard(event.event_id)
            return await self._handle_traced(conn, record, event)

    async def _handle_traced(
        self,
        conn: asyncpg.Connection,
        record: ConsumerRecord[Any, Any],
        event: RecordedEvent[Event],
    ) -> bool:
        for attempt in range(1, self.max_attempts + 1):
            try:
                if self.isolated:
                    async with conn.transaction():  # a savepoint: this event alone
                        await self._handle_once(conn, event)
                else:
                    await self._handle_once(conn, event)
                return True
            except Exception as exc:
                if is_transient(exc):
                    raise  # the database is away: the whole batch waits, nothing is parked
                if getattr(exc, "retryable", False) and attempt < self.max_attempts:
                    self.stats.retries += 1
                    await asyncio.sleep(0.05 * 2**attempt)
                    continue
                log.exception("%s: handler failed on %s", self.name, event.event_id)
                self.metrics.handled(event.type, "failed")
                # Not handled: a retry of the dead letter must find no inbox row.
                await conn.execute(
                    "DELETE FROM inbox WHERE consumer = $1 AND event_id = $2",
                    self.name,
                    event.event_id,
                )
                await self.dead_letter(record, f"handler failed: {type(exc).__name__}: {exc}")
                return False
        return False

    async def _handle_once(self, conn: asyncpg.Connection, event: RecordedEvent[Event]) -> None:
        started = perf_counter()
        await self.handler(event, conn)
        self.metrics.latency(perf_counter() - started)
        self.metrics.handled(event.type)

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
        broker = self._broker
        publish = partial(
            broker.publish,
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
        await retrying(publish, component=f"consumer {self.name}")


def kafka_lag(consumer: AIOKafkaConsumer | None) -> dict[str, int]:
    """topic -> messages not taken yet by `consumer`, over its assigned partitions:
    the last known log end offset (from its fetches) minus its position. Reads only
    what the consumer already holds, so a scrape costs no broker call; a partition
    not fetched yet counts for nothing."""
    if consumer is None:
        return {}
    # aiokafka keeps highwater and position on each partition's state (what its
    # `highwater()` reads) and has no synchronous way to read the position.
    subscription = consumer._subscription.subscription
    assignment = subscription.assignment if subscription is not None else None
    if assignment is None:
        return {}
    lag: dict[str, int] = {}
    for tp in assignment.tps:
        state = assignment.state_value(tp)
        if state is None or state.highwater is None or not state.has_valid_position:
            continue
        lag[tp.topic] = lag.get(tp.topic, 0) + max(0, state.highwater - state.position)
    return lag


async def read_again_if_lost(
    reader: str, consumer: AIOKafkaConsumer, partitions: Iterable[TopicPartition]
) -> set[TopicPartition]:
    """The partitions of `partitions` whose position is past their end, each sought
    back to its start: the broker lost what it had while the client kept its offset
    (a Kafka broker would answer such a fetch OFFSET_OUT_OF_RANGE; the embedded one
    answers nothing). The end is the last one a fetch answered (none before one)."""
    lost: set[TopicPartition] = set()
    for tp in partitions:
        if tp not in consumer.assignment():
            continue  # given up in a rebalance meanwhile: its next owner reads it
        end = consumer.highwater(tp)
        if end is None:
            continue
        try:
            position = await consumer.position(tp)
            if position <= end:
                continue
            log.warning(
                "%s: %s partition %d ends at offset %d, before this reader's position %d:"
                " the broker lost what it had; reading the partition again from its start",
                reader,
                tp.topic,
                tp.partition,
                end,
                position,
            )
            await consumer.seek_to_beginning(tp)
        except IllegalStateError:
            continue  # given up while this waited
        lost.add(tp)
    return lost


class _WatchEnds(ConsumerRebalanceListener):  # type: ignore[misc]
    """Starts the consumer's check of positions past their end once its client has
    partitions (the client exists only while the broker runs)."""

    def __init__(self, owner: IdempotentConsumer) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.owner.forget(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.owner.watch_ends()


def _highest(a: Positions, b: Positions) -> Positions:
    """The higher position of each partition in either."""
    return {key: max(a.get(key, 0), b.get(key, 0)) for key in a.keys() | b.keys()}


def _link_to_current() -> list[trace.Link]:
    current = trace.get_current_span().get_span_context()
    return [trace.Link(current)] if current.is_valid else []


async def _the_message(message: Any) -> Any:
    """The whole message as the handler's one argument: its records, offsets and
    commit. (Asked for as `KafkaMessage`, FastStream's context, it would be looked
    up by a function FastStream runs on a worker thread, once per batch: 0.6 ms
    of CPU a batch.)"""
    return message


class _CancelledIsNoError(logging.Filter):
    """FastStream logs a handler that ends by cancellation as an ERROR with its
    traceback; a handler is cancelled when its subscriber stops (a service asked to
    stop, a scheduler's term ending while an outage is waited out): the stop doing
    its work. Such a line is kept at DEBUG, without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, asyncio.CancelledError):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            record.exc_info, record.exc_text = None, None
        return True


_broker_log = logging.getLogger("runyard.messaging.broker")
_broker_log.addFilter(_CancelledIsNoError())


def make_broker(kafka: KafkaSettings, **options: Any) -> KafkaBroker:
    """A FastStream broker on `kafka.bootstrap`, with tracing middleware.

    It logs through `runyard.messaging.broker`, so its lines take the process's
    format and level (`RUNYARD_LOG_LEVEL`, WARNING by default) instead of
    FastStream's own colored INFO lines (a partition assignment, each stopped
    subscriber task); a handler cancelled by its subscriber's stop is not an error
    there (`_CancelledIsNoError`)."""
    from faststream.kafka.opentelemetry import KafkaTelemetryMiddleware

    return KafkaBroker(
        kafka.bootstrap,
        security=kafka.security.faststream(),  # SASL/TLS when the environment asks
        logger=_broker_log,
        log_level=logging.DEBUG,  # per-message access logs only when asked for
        enable_idempotence=False,
        request_timeout_ms=kafka.request_timeout_ms,
        middlewares=[KafkaTelemetryMiddleware()],
        **options,
    )
