"""`decide_and_append` on the Postgres event store: conflicts decided again, refusals and
outages, appends to several streams, the writer's own transaction.

Races are made certain: another writer appends to a stream right after the helper
read it (`Racer`), so the helper's append finds the stream moved on.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent, default_mapper
from runyard.contracts.task_events import AlertDelivered
from runyard.domain import Fail, Record, RequestStop, Submit, TaskAlreadyFinished
from runyard.eventstore import (
    HEALTH,
    NO_STREAM,
    AppendRequest,
    ConcurrencyError,
    Decision,
    PostgresEventStore,
    StoreUnavailable,
    TaskCommands,
    decide_and_append,
)

from tests.unit.test_task_domain import make_spec

pytestmark = pytest.mark.integration

TASK = "t-1"
STREAM = f"task-{TASK}"
META = Metadata(actor="service:test", causation_id="req-1", correlation_id="req-1")
OTHER = Metadata(actor="service:other")


@pytest.fixture
async def store(dsn: str) -> AsyncIterator[PostgresEventStore]:
    store = await PostgresEventStore.connect(dsn, default_mapper())
    try:
        await decide_and_append(
            store, STREAM, commands(Submit(TASK, "ml", "ml/alice", make_spec()))
        )
        yield store
    finally:
        await store.close()


def clock() -> datetime:
    return datetime.now(UTC)


def commands(*command: Any, **options: Any) -> TaskCommands:
    return TaskCommands(TASK, list(command), META, clock, ids=lambda: "unused", **options)


def delivered(n: int = 1) -> NewEvent[AlertDelivered]:
    """An event that changes no decision on the task."""
    alert = AlertDelivered(alert="failed", channel="feishu:sub-1", attempt=n)
    return NewEvent(alert, OTHER, clock())


class Racer:
    """After the reads of `stream` that `after` picks (by number, 1 the first), another
    writer appends to it what `other` makes of the events read. Counts the reads."""

    def __init__(
        self,
        store: PostgresEventStore,
        stream: str,
        after: Callable[[int], bool],
        other: Callable[[list[RecordedEvent[Event]]], Sequence[NewEvent[Event]]] = (
            lambda read: [delivered()]
        ),
    ) -> None:
        self.reads = 0
        real = store.read_stream

        async def read_stream(stream_id: str, *args: Any, **kwargs: Any) -> Any:
            events = await real(stream_id, *args, **kwargs)
            if stream_id == stream:
                self.reads += 1
                if after(self.reads):
                    await store.append(stream_id, other(events))
            return events

        store.read_stream = read_stream  # type: ignore[method-assign]


async def types(store: PostgresEventStore, stream: str = STREAM) -> list[str]:
    return [e.type for e in await store.read_stream(stream)]


async def test_a_conflict_is_decided_again_on_what_the_other_writer_appended(
    store: PostgresEventStore,
) -> None:
    racer = Racer(store, STREAM, after=lambda n: n == 1)
    appended = await decide_and_append(store, STREAM, commands(Fail(TASK, "oom")))
    assert racer.reads == 2  # the raced read, then the read after the conflict
    stream = await store.read_stream(STREAM)
    assert [e.type for e in stream] == ["TaskSubmitted", "AlertDelivered", "TaskFailed"]
    assert [a.event_id for a in appended] == [stream[2].event_id]
    assert stream[2].metadata == META  # the caller's causation and correlation ids


async def test_a_command_the_other_writer_made_invalid_is_not_appended(
    store: PostgresEventStore, caplog: pytest.LogCaptureFixture
) -> None:
    def stop(read: list[RecordedEvent[Event]]) -> Sequence[NewEvent[Event]]:
        # another writer stops the task between the helper's read and its append
        return commands(RequestStop(TASK, by="bob", role="member"))(read).events

    racer = Racer(store, STREAM, after=lambda n: n == 1, other=stop)
    with pytest.raises(TaskAlreadyFinished):
        await decide_and_append(store, STREAM, commands(Fail(TASK, "oom")))
    assert racer.reads == 2  # decided again after the conflict, and refused then
    assert await types(store) == ["TaskSubmitted", "TaskStopRequested", "TaskStopped"]

    quiet = logging.getLogger("runyard.test.decisions")
    with caplog.at_level(logging.INFO, logger=quiet.name):
        appended = await decide_and_append(
            store, STREAM, commands(Fail(TASK, "oom"), log_refusals=quiet)
        )
    assert appended == []
    assert await types(store) == ["TaskSubmitted", "TaskStopRequested", "TaskStopped"]
    assert any("cannot fail task" in r.getMessage() for r in caplog.records)


async def test_after_the_last_try_the_conflict_or_the_writers_own_error_raises(
    store: PostgresEventStore,
) -> None:
    racer = Racer(store, STREAM, after=lambda n: True)
    seen: list[ConcurrencyError] = []
    with pytest.raises(ConcurrencyError) as raised:
        await decide_and_append(
            store, STREAM, commands(Fail(TASK, "oom")), attempts=3, on_conflict=seen.append
        )
    assert racer.reads == 3 and len(seen) == 3
    assert raised.value is seen[-1] and raised.value.stream_id == STREAM

    class KeptChanging(Exception):
        pass

    with pytest.raises(KeptChanging) as gave_up:
        await decide_and_append(
            store,
            STREAM,
            commands(Fail(TASK, "oom")),
            attempts=2,
            give_up=lambda exc: KeptChanging(exc.stream_id),
        )
    assert isinstance(gave_up.value.__cause__, ConcurrencyError)
    assert racer.reads == 5
    assert "TaskFailed" not in await types(store)


async def test_a_stream_the_caller_read_is_decided_on_and_read_again_only_on_a_conflict(
    store: PostgresEventStore,
) -> None:
    racer = Racer(store, STREAM, after=lambda n: False)
    read = await store.read_stream(STREAM)
    record = commands(Record(TASK, delivered().event))
    await decide_and_append(store, STREAM, record, recorded=read)
    assert racer.reads == 1  # the caller's read only

    # `read` is stale now: the append conflicts, the stream is read, the fail decided again
    await decide_and_append(store, STREAM, commands(Fail(TASK, "oom")), recorded=read)
    assert racer.reads == 2
    assert await types(store) == ["TaskSubmitted", "AlertDelivered", "TaskFailed"]


async def test_appends_to_several_streams_are_one_and_a_conflict_on_any_is_decided_again(
    store: PostgresEventStore,
) -> None:
    racer = Racer(store, "task-b", after=lambda n: n == 1)
    tries: list[int] = []

    async def decide(recorded: list[RecordedEvent[Event]]) -> Decision[int]:
        version = len(await store.read_stream("task-b"))
        tries.append(version)
        return Decision(
            version,
            events=[delivered(len(recorded) + 1)],
            others=[AppendRequest("task-b", [delivered(version)], version)],
        )

    await store.append("task-b", [delivered()])
    answer = await decide_and_append(store, "task-a", decide)
    assert tries == [1, 2] and answer == 2 and racer.reads == 2
    assert await types(store, "task-a") == ["AlertDelivered"]  # the first try wrote nothing
    assert await types(store, "task-b") == ["AlertDelivered"] * 3


async def test_a_conflict_on_a_stream_the_decision_did_not_read_raises_at_once(
    store: PostgresEventStore,
) -> None:
    await store.append("task-new", [delivered()])  # the id a new task would take
    racer = Racer(store, STREAM, after=lambda n: False)

    async def write(requests: list[AppendRequest]) -> None:
        async with store.transaction() as conn:
            for r in requests:
                await store.append_in(conn, r.stream_id, r.events, r.expected)
            await store.append_in(conn, "task-new", [delivered()], NO_STREAM)

    with pytest.raises(ConcurrencyError) as raised:
        await decide_and_append(store, STREAM, commands(Fail(TASK, "oom")), write=write)
    assert raised.value.stream_id == "task-new" and racer.reads == 1
    assert await types(store) == ["TaskSubmitted"]  # one transaction: nothing written


async def test_an_empty_decision_appends_nothing(store: PostgresEventStore) -> None:
    async def write(requests: list[AppendRequest]) -> None:
        raise AssertionError("nothing to write")

    answer = await decide_and_append(
        store, STREAM, lambda recorded: Decision(len(recorded)), write=write
    )
    assert answer == 1
    assert await types(store) == ["TaskSubmitted"]


async def test_a_store_outage_is_waited_out_only_when_asked(
    store: PostgresEventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_read, real_append = store.read_stream, store.append
    down = {"read": 0, "append": 0}

    def outage(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            if down[name]:
                down[name] -= 1
                raise StoreUnavailable("connection refused")
            return await real(*args, **kwargs)

        return call

    monkeypatch.setattr(store, "read_stream", outage("read", real_read))
    monkeypatch.setattr(store, "append", outage("append", real_append))

    down.update(read=1)
    with pytest.raises(StoreUnavailable):
        await decide_and_append(store, STREAM, commands(Fail(TASK, "oom")))
    down.update(read=0, append=1)
    with pytest.raises(StoreUnavailable):
        await decide_and_append(store, STREAM, commands(Fail(TASK, "oom")))
    assert await types(store) == ["TaskSubmitted"]

    down.update(read=2, append=2)
    await decide_and_append(
        store, STREAM, commands(Fail(TASK, "oom")), wait_out_outages="test (event store)"
    )
    assert down == {"read": 0, "append": 0}
    assert await types(store) == ["TaskSubmitted", "TaskFailed"]
    assert "test (event store)" not in HEALTH.down  # up again once it worked
