"""The event store interface and its shared vocabulary.

A stream (`task-<id>`, `pool-<id>`) is an ordered list of events; its version
is the number of events in it. Every event also has a global position, one
order over the whole store. Appends are optimistic: the writer says which
version it decided on (`expected`), and a stream that moved on raises
`ConcurrencyError`.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from runyard.contracts import Event, NewEvent, RecordedEvent

#: Append whatever the stream's version is.
ANY: Final = "any"
#: Append only if the stream has no events yet.
NO_STREAM: Final = "no_stream"

ExpectedVersion = int | Literal["any", "no_stream"]

#: Largest event, payload and metadata JSON together (docs/limits.md). The relay
#: publishes each event as one Kafka message, and brokers refuse messages over
#: 1 MiB by default (Kafka's `message.max.bytes`, the producer's `max.request.size`):
#: half of that leaves room for the envelope and headers. Checked at append.
MAX_EVENT_BYTES: Final = 512 * 1024


@dataclass(frozen=True, slots=True)
class AppendResult:
    stream_id: str
    #: The stream's version after the append (= stream version of its last event).
    version: int
    positions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """One stream's part of a multi-stream append."""

    stream_id: str
    events: Sequence[NewEvent[Event]]
    expected: ExpectedVersion = ANY


class EventStore(abc.ABC):
    """What every event store implementation offers (see tests/contract)."""

    @abc.abstractmethod
    async def append(
        self,
        stream_id: str,
        events: Sequence[NewEvent[Event]],
        expected: ExpectedVersion = ANY,
    ) -> AppendResult:
        """Append `events` to one stream atomically."""

    @abc.abstractmethod
    async def append_many(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        """Append to several streams in one transaction: all or nothing."""

    @abc.abstractmethod
    async def read_stream(
        self, stream_id: str, from_version: int = 1, limit: int | None = None
    ) -> list[RecordedEvent[Event]]:
        """Events of one stream with version >= `from_version`, in order; at most
        `limit` of them when given (a page of a long stream)."""

    @abc.abstractmethod
    async def stream_version(self, stream_id: str) -> int:
        """Current version of a stream; 0 when it has no events."""

    @abc.abstractmethod
    def all_reader(self, after: int = 0) -> AllReader:
        """A reader of the whole log in global order, starting after `after`."""

    @abc.abstractmethod
    async def head_position(self) -> int:
        """The highest global position stored so far (0 when empty)."""

    async def holds(self, event: RecordedEvent[Event]) -> bool:
        """Whether the log holds `event` as given: its id and payload at its stream and
        version. For a reaction that must not act on a message's word alone (one read)."""
        found = await self.read_stream(event.stream_id, event.stream_version, 1)
        return bool(found) and found[0].event_id == event.event_id and found[0].event == event.event

    async def holds_or_says(self, event: RecordedEvent[Event], log: logging.Logger) -> bool:
        """`holds`; when the log does not hold `event`, `log` says the message (a forged
        or corrupted one) is ignored."""
        if await self.holds(event):
            return True
        log.warning(
            "%s: a %s message (version %d) that the log does not hold was ignored",
            event.stream_id,
            event.type,
            event.stream_version,
        )
        return False

    async def subscribe_all(
        self, after: int = 0, *, batch_size: int = 500, poll_interval: float = 0.005
    ) -> AsyncIterator[RecordedEvent[Event]]:
        """Catch up from `after`, then keep following new events (polling)."""
        reader = self.all_reader(after)
        async for batch in reader.follow(batch_size=batch_size, poll_interval=poll_interval):
            for event in batch:
                yield event


class AllReader(abc.ABC):
    """Reads the whole log in global-position order without ever skipping an event.

    A reader is stateful: it remembers its position and, in the Postgres store,
    the gap it is waiting on (a position taken by a transaction that has not
    committed yet).
    """

    position: int

    @abc.abstractmethod
    async def read(self, limit: int = 500) -> list[RecordedEvent[Event]]:
        """The next events that are safe to hand out, possibly none."""

    async def follow(
        self, *, batch_size: int = 500, poll_interval: float = 0.005
    ) -> AsyncIterator[list[RecordedEvent[Event]]]:
        """Yield non-empty batches forever, sleeping `poll_interval` when idle."""
        while True:
            batch = await self.read(batch_size)
            if batch:
                yield batch
            else:
                await asyncio.sleep(self.idle_delay(poll_interval))

    def idle_delay(self, poll_interval: float) -> float:
        return poll_interval
