"""Read, decide, append; on a conflict, all again: how a decision on a stream is written.

A writer reads a stream, folds it, decides with a pure domain, and appends what
it decided with the version it read. When another writer appended meanwhile
the append raises `ConcurrencyError` and writes nothing; the decision is then
made again on what the stream holds now. `decide_and_append` is that loop, for
any stream and any domain; `TaskCommands` is the decision of commands on a
task's stream with the task domain (`runyard.domain`), the usual one:

    stop = TaskCommands(task_id, [RequestStop(task_id)], metadata, clock, ids=new_id)
    await decide_and_append(store, f"task-{task_id}", stop)

What differs between writers is a parameter:

- how many tries (`attempts`), and what is raised when the last one conflicts
  too: the conflict itself (an API answers 409), or the writer's own error
  (`give_up`); each conflict can be logged (`on_conflict`);
- whether a store outage is waited out, with backoff and shown in `HEALTH`
  under a component name (`wait_out_outages`), or raised at once;
- a stream the caller has just read (`recorded`, e.g. to check access): the
  first try decides on it instead of reading it again;
- how the appends are written (`write`): by default `append` (one stream) or
  `append_many` (several, in one transaction); a writer with more to store in
  the same transaction (the answer to a call, a new task) writes them there.
  Only a conflict on a stream whose version a decision read is decided again;
  one on a stream the writer appends to on its own raises at once;
- for task commands: the events' time (`at`, a fact's own time), a guard
  (`only_if`, decide only while the task is where the writer saw it), the
  metadata (fixed, or drawn from the stream: the cause it names), and a
  refusal of the domain (a `DomainError`): raised, or logged and taken as
  nothing to do (`log_refusals`).

A decision with no event appends nothing and is not tried again.

A writer that decides on one stream from several coroutines at once (a service's
handlers and timers) takes the stream's lock first (`StreamLocks`), so its own
decisions do not conflict; a lock is dropped once nobody holds or waits for it,
so a long-running service keeps none per stream it ever wrote.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Generic, TypeAlias, TypeVar

from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent
from runyard.domain import Command, DomainError, IdFactory, TaskState, decide_all, fold
from runyard.eventstore.errors import ConcurrencyError
from runyard.eventstore.store import AppendRequest, EventStore
from runyard.eventstore.transient import retrying

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

#: Tries of a decision unless the writer says otherwise.
ATTEMPTS = 8


@dataclass(frozen=True, slots=True)
class Decision(Generic[T]):
    """What one try decided, and what the writer answers once it is stored.

    `events` go to the stream that was read, with the version that was read;
    `others` to other streams in the same append, each with the version its own
    decision read (a spot shrink preempts tasks with the pool's change)."""

    answer: T
    events: Sequence[NewEvent[Event]] = ()
    others: Sequence[AppendRequest] = ()

    def appends(self, stream_id: str, version: int) -> list[AppendRequest]:
        """The appends of this decision on `stream_id` read at `version` (none: nothing)."""
        own = [AppendRequest(stream_id, self.events, version)] if self.events else []
        return own + [r for r in self.others if r.events]


#: One try: the stream as read, in order, to what to append.
Decide: TypeAlias = Callable[[list[RecordedEvent[Event]]], Decision[T] | Awaitable[Decision[T]]]
#: Writes a decision's appends, all or nothing.
Write: TypeAlias = Callable[[list[AppendRequest]], Awaitable[object]]
#: The metadata of a task decision's events, fixed or drawn from the stream read.
MetadataOf: TypeAlias = Metadata | Callable[[Sequence[RecordedEvent[Event]]], Metadata]


async def decide_and_append(
    store: EventStore,
    stream_id: str,
    decide: Decide[T],
    *,
    attempts: int = ATTEMPTS,
    recorded: Sequence[RecordedEvent[Event]] | None = None,
    write: Write | None = None,
    wait_out_outages: str | None = None,
    on_conflict: Callable[[ConcurrencyError], object] | None = None,
    give_up: Callable[[ConcurrencyError], Exception] | None = None,
) -> T:
    """Read `stream_id`, `decide`, append with the version read; on a conflict, again.

    At most `attempts` tries. `recorded`: the stream as the caller just read it,
    decided on by the first try. `write`: how the appends are stored (default:
    `store.append`, or `store.append_many` for several streams). With
    `wait_out_outages` (a component name) reads and appends wait out transient
    store errors (`retrying`); without, they raise. `on_conflict` sees every
    conflict; after the last try's, `give_up`'s error is raised, or else the
    conflict. Errors of `decide` (a domain's refusal) raise at once.
    """
    if attempts < 1:
        raise ValueError(f"a decision needs at least one try, not {attempts}")
    write = write or partial(_append, store)
    for attempt in range(1, attempts + 1):
        if recorded is None or attempt > 1:
            recorded = await _store_call(partial(store.read_stream, stream_id), wait_out_outages)
        events = list(recorded or ())
        decided = decide(events)
        decision = await decided if inspect.isawaitable(decided) else decided
        version = events[-1].stream_version if events else 0
        requests = decision.appends(stream_id, version)
        if not requests:
            return decision.answer
        try:
            await _store_call(partial(write, requests), wait_out_outages)
        except ConcurrencyError as exc:
            if exc.stream_id not in {r.stream_id for r in requests if isinstance(r.expected, int)}:
                raise  # not a stream this decision read: reading again changes nothing
            if on_conflict is not None:
                on_conflict(exc)
            if attempt < attempts:
                continue
            if give_up is not None:
                raise give_up(exc) from exc
            raise
        return decision.answer
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True, slots=True)
class TaskCommands:
    """Commands for one task, decided in order on its stream with the task domain.

    A `Decide` of `decide_and_append`; its answer is the events appended. Pure
    but for `clock` and the log line of an ignored refusal.

    `ids`: where new ids come from. `at`: when the fact happened, when it is
    known (a worker's exit, from its status file): the events carry that time,
    never later than now nor earlier than the stream's last event. `only_if`:
    decide only while the task (None: no stream) passes it, else nothing to do.
    `log_refusals`: a logger where a refusal (a `DomainError`: the task
    finished, an attempt no longer current) is logged at info and taken as
    nothing to do; without, the refusal raises.
    """

    task_id: str
    commands: Sequence[Command]
    metadata: MetadataOf
    clock: Callable[[], datetime]
    ids: IdFactory
    at: datetime | None = None
    only_if: Callable[[TaskState | None], bool] | None = None
    log_refusals: logging.Logger | None = None

    def __call__(self, recorded: list[RecordedEvent[Event]]) -> Decision[list[NewEvent[Event]]]:
        try:
            state = fold(recorded, task_id=self.task_id) if recorded else None
            if self.only_if is not None and not self.only_if(state):
                return Decision([])
            now = self._now(recorded)
            decided = decide_all(state, self.commands, now=now, ids=self.ids)
        except DomainError as exc:
            if self.log_refusals is None:
                raise
            self.log_refusals.info("%s: %s", self.task_id, exc)
            return Decision([])
        if not decided:
            return Decision([])
        meta = self.metadata if isinstance(self.metadata, Metadata) else self.metadata(recorded)
        events = [NewEvent(e, meta, now) for e in decided]
        return Decision(events, events)

    def _now(self, recorded: Sequence[RecordedEvent[Event]]) -> datetime:
        now = self.clock()
        if self.at is None:
            return now
        floor = recorded[-1].occurred_at if recorded else self.at
        return max(floor, min(self.at, now))


async def _append(store: EventStore, requests: list[AppendRequest]) -> None:
    if len(requests) == 1:
        await store.append(requests[0].stream_id, requests[0].events, requests[0].expected)
    else:
        await store.append_many(requests)


async def _store_call(call: Callable[[], Awaitable[T]], component: str | None) -> T:
    if component is None:
        return await call()
    return await retrying(call, component=component)


class StreamLocks:
    """One lock per stream, for writers that decide on a stream from several
    coroutines; an entry lives only while some coroutine holds or waits for it."""

    def __init__(self) -> None:
        #: stream -> its lock and how many hold or wait for it.
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        """How many streams have a holder or a waiter now."""
        return len(self._locks)

    @asynccontextmanager
    async def hold(self, stream_id: str) -> AsyncIterator[None]:
        """Hold the stream's lock (waiting for it) for the block."""
        lock, users = self._locks.get(stream_id, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[stream_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[stream_id]
            if users == 1:
                del self._locks[stream_id]
            else:
                self._locks[stream_id] = (lock, users - 1)


def remember_last(recent: dict[K, V], key: K, value: V, limit: int) -> list[K]:
    """Put `key` last in `recent` (oldest first) with `value`, and forget the oldest
    past `limit`: what a service remembers of every stream it ever saw, bounded. The
    keys forgotten."""
    recent.pop(key, None)
    recent[key] = value
    forgotten = []
    while len(recent) > limit:
        oldest = next(iter(recent))
        del recent[oldest]
        forgotten.append(oldest)
    return forgotten
