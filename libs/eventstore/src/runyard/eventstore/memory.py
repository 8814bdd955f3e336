"""An in-memory event store for unit tests of services: same contract, no I/O.

It passes the same contract suite as the Postgres store (tests/contract), so a
test that uses it exercises the real semantics: versions, conflicts,
idempotent re-append, global order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from runyard.contracts import Event, EventMapper, NewEvent, RecordedEvent
from runyard.eventstore.errors import ConcurrencyError, DuplicateEventError, EventTooLarge
from runyard.eventstore.store import (
    ANY,
    MAX_EVENT_BYTES,
    NO_STREAM,
    AllReader,
    AppendRequest,
    AppendResult,
    EventStore,
    ExpectedVersion,
)


class InMemoryEventStore(EventStore):
    def __init__(
        self, mapper: EventMapper | None = None, *, max_event_bytes: int = MAX_EVENT_BYTES
    ) -> None:
        self.mapper = mapper
        self.max_event_bytes = max_event_bytes
        self._log: list[RecordedEvent[Event]] = []
        self._streams: dict[str, list[RecordedEvent[Event]]] = {}
        self._by_id: dict[str, RecordedEvent[Event]] = {}
        self._lock = asyncio.Lock()

    async def append(
        self,
        stream_id: str,
        events: Sequence[NewEvent[Event]],
        expected: ExpectedVersion = ANY,
    ) -> AppendResult:
        return (await self.append_many([AppendRequest(stream_id, events, expected)]))[0]

    async def append_many(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        async with self._lock:
            results: list[AppendResult | None] = []
            for request in requests:
                replayed = self._replayed(request)
                if replayed is None:
                    self._check(request)
                results.append(replayed)
            replays = [r is not None for r in results]
            if any(replays) and not all(replays):
                # One atomic append: repeated only as a whole, like in Postgres.
                clash = requests[replays.index(True)]
                raise DuplicateEventError(clash.stream_id, [str(e.event_id) for e in clash.events])
            return [
                r if r is not None else self._write(q)
                for r, q in zip(results, requests, strict=True)
            ]

    def _replayed(self, request: AppendRequest) -> AppendResult | None:
        """The same events appended before: answer as then (idempotent append)."""
        ids = [str(e.event_id) for e in request.events]
        if not ids or any(i not in self._by_id for i in ids):
            if any(i in self._by_id for i in ids):
                raise DuplicateEventError(request.stream_id, ids)
            return None
        stored = [self._by_id[i] for i in ids]
        if any(s.stream_id != request.stream_id for s in stored):
            raise DuplicateEventError(request.stream_id, ids)
        return AppendResult(
            request.stream_id,
            max(s.stream_version for s in stored),
            tuple(s.global_position for s in stored),
        )

    def _check(self, request: AppendRequest) -> None:
        if not request.events:
            raise ValueError("append needs at least one event")
        for new in request.events:
            data, meta = new.event.model_dump_json(), new.metadata.model_dump_json()
            size = len(data.encode()) + len(meta.encode())
            if size > self.max_event_bytes:
                name = new.event.type_name()
                raise EventTooLarge(request.stream_id, name, size, self.max_event_bytes)
        actual = len(self._streams.get(request.stream_id, ()))
        expected = request.expected
        if expected == ANY:
            return
        wanted = 0 if expected == NO_STREAM else expected
        if not isinstance(wanted, int) or wanted < 0:
            raise ValueError(
                f"expected version must be 'any', 'no_stream' or an int >= 0, not {expected!r}"
            )
        if wanted != actual:
            raise ConcurrencyError(request.stream_id, expected, actual or None)

    def _write(self, request: AppendRequest) -> AppendResult:
        stream = self._streams.setdefault(request.stream_id, [])
        positions = []
        for new in request.events:
            recorded = self._record(request.stream_id, len(stream) + 1, new)
            stream.append(recorded)
            self._log.append(recorded)
            self._by_id[str(new.event_id)] = recorded
            positions.append(recorded.global_position)
        return AppendResult(request.stream_id, len(stream), tuple(positions))

    def _record(self, stream_id: str, version: int, new: NewEvent[Event]) -> RecordedEvent[Event]:
        if self.mapper is not None:  # round trip, so tests see what Postgres would give
            new = replace(new, event=self.mapper.decode(*self.mapper.encode(new.event)))
        return new.recorded(stream_id, version, len(self._log) + 1)

    async def read_stream(
        self, stream_id: str, from_version: int = 1, limit: int | None = None
    ) -> list[RecordedEvent[Event]]:
        start = max(from_version, 1) - 1
        end = None if limit is None else start + max(limit, 0)
        return list(self._streams.get(stream_id, [])[start:end])

    async def stream_version(self, stream_id: str) -> int:
        return len(self._streams.get(stream_id, ()))

    async def head_position(self) -> int:
        return len(self._log)

    def all_reader(self, after: int = 0) -> AllReader:
        return _MemoryAllReader(self, after)


class _MemoryAllReader(AllReader):
    def __init__(self, store: InMemoryEventStore, after: int) -> None:
        self.store = store
        self.position = after

    async def read(self, limit: int = 500) -> list[RecordedEvent[Event]]:
        batch = self.store._log[self.position : self.position + limit]
        if batch:
            self.position = batch[-1].global_position
        return batch
