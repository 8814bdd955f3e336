"""Fault tolerance keeps each unfinished task's state: events delivered in order
are folded on with no read of the store, a gap reads only what it missed, and a
finished task's state is let go."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent, default_mapper
from runyard.contracts.spec import TaskSpec
from runyard.contracts.task_events import TaskPlaced, WorkerPlacement
from runyard.domain.task import ConfirmStop, RequestStop, Submit, decide, fold
from runyard.eventstore import InMemoryEventStore
from runyard.faulttolerance.app import FaultToleranceApp

STREAM = "task-t1"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


class CountingStore(InMemoryEventStore):
    """The in-memory store, counting the events each `read_stream` hands out."""

    def __init__(self) -> None:
        super().__init__(default_mapper())
        self.read: list[int] = []

    async def read_stream(
        self, stream_id: str, from_version: int = 1, limit: int | None = None
    ) -> list[RecordedEvent[Event]]:
        events = await super().read_stream(stream_id, from_version, limit)
        self.read.append(len(events))
        return events


async def _append(store: CountingStore, events: list[Event]) -> list[RecordedEvent[Event]]:
    version = await store.stream_version(STREAM)
    meta = Metadata(actor="service:test")
    await store.append(STREAM, [NewEvent(e, meta, NOW) for e in events], version)
    return (await InMemoryEventStore.read_stream(store, STREAM))[version:]


def _spec() -> TaskSpec:
    return TaskSpec(
        name="t", pool="dev", worker_spec="1gpu", worker_count=1, image="i", command="true"
    )


async def test_events_in_order_are_folded_without_reading_the_store() -> None:
    store = CountingStore()
    app = FaultToleranceApp(store)
    submit = Submit("t1", "acme", "al", _spec())
    submitted = await _append(store, decide(None, submit, now=NOW, ids=lambda: "x"))
    for event in submitted:
        await app.handle(event)
    assert store.read == [], "the first event starts the kept state"

    # Two events, the first never delivered here: the second reads only those two.
    workers = (WorkerPlacement(index=0, node="n-0", gpus=(0,)),)
    placed = await _append(store, [TaskPlaced(run=1, attempt=1, pool="dev", workers=workers)])
    state: Any = fold(await InMemoryEventStore.read_stream(store, STREAM))
    stop = await _append(store, decide(state, RequestStop("t1"), now=NOW, ids=lambda: "x"))
    await app.handle(stop[-1])
    assert store.read == [len(placed) + len(stop)], "only what the kept state lacked"
    assert app._states["t1"].version == stop[-1].stream_version

    # A redelivery of an event already folded reads nothing.
    await app.handle(placed[0])
    assert store.read == [len(placed) + len(stop)]

    # The stop confirmed: the task is finished, and its state is let go.
    state = fold(await InMemoryEventStore.read_stream(store, STREAM))
    stopped = await _append(store, decide(state, ConfirmStop("t1"), now=NOW, ids=lambda: "x"))
    for event in stopped:
        await app.handle(event)
    assert "t1" not in app._states


async def test_only_the_last_finished_tasks_are_remembered(monkeypatch: Any) -> None:
    """A long-running instance must not hold something for every task that ever
    finished: it remembers the last FINISHED_KEPT finished tasks. A task it forgot
    reads its stream again and is found finished again."""
    monkeypatch.setattr("runyard.faulttolerance.app.FINISHED_KEPT", 3)
    store = CountingStore()
    app = FaultToleranceApp(store)
    meta = Metadata(actor="service:test")
    for n in range(5):
        stream, state = f"task-t{n}", None
        for command in (Submit(f"t{n}", "acme", "al", _spec()), RequestStop(f"t{n}")):
            version = await store.stream_version(stream)
            events = decide(state, command, now=NOW, ids=lambda: "x")
            await store.append(stream, [NewEvent(e, meta, NOW) for e in events], version)
            state = fold(await InMemoryEventStore.read_stream(store, stream))
        assert state is not None and state.finished
        for event in await InMemoryEventStore.read_stream(store, stream):
            await app.handle(event)
    assert list(app._finished) == ["t2", "t3", "t4"]
    assert await app._watch_for("t0") is None  # forgotten: read again, finished again
    assert list(app._finished) == ["t3", "t4", "t0"]
