"""The task list projector keeps the tasks it folded last and brings each up from its
kept version; whatever it keeps, evicts or applies again, every row is what a fold of
the task's whole stream up to the projected position gives."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest
from runyard.api.tasks import KeptTasks
from runyard.contracts import Event, Metadata, NewEvent, default_mapper
from runyard.domain import fold
from runyard.eventstore import PostgresEventStore, apply_migrations, eventstore_migrations
from runyard.gateway.app import gateway_migrations
from runyard.gateway.projection import TaskListProjector, _row, _spec_of

from tests.unit.test_task_domain import Story, make_spec, step

pytestmark = pytest.mark.integration

META = Metadata(actor="user:ml/alice")
COLUMNS = (
    "task_id, tenant, creator, name, status, stage, pool, tags, group_id, cloned_from,"
    " run, version, created_at, updated_at, workers, restarts"
)


@pytest.fixture
async def store(dsn: str) -> AsyncIterator[PostgresEventStore]:
    store = await PostgresEventStore.connect(dsn, default_mapper())
    async with store.pool.acquire() as conn:
        await apply_migrations(conn, eventstore_migrations())
        await apply_migrations(conn, gateway_migrations())
    try:
        yield store
    finally:
        await store.close()


def histories(count: int, seed: int) -> dict[str, list[tuple[Event, datetime]]]:
    """`count` random task histories (t0, t1, ...), each grown by `decide` alone."""
    rnd = random.Random(seed)
    found = {}
    for n in range(count):
        story = Story(make_spec(workers=rnd.randint(1, 2), auto_restart=rnd.random() < 0.5))
        for _ in range(rnd.randint(3, 30)):
            step(story, rnd)
        found[f"t{n}"] = [
            (
                event.model_copy(update={"task_id": f"t{n}"})
                if "task_id" in type(event).model_fields
                else event,
                at,
            )
            for event, at in story.events
        ]
    return found


async def rows(store: PostgresEventStore) -> dict[str, tuple[Any, ...]]:
    found = await store.pool.fetch(f"SELECT {COLUMNS} FROM task_list")
    return {row["task_id"]: tuple(row) for row in found}


async def folded_rows(store: PostgresEventStore, upto: int) -> dict[str, tuple[Any, ...]]:
    """Each task's row from a fold of its whole stream, up to log position `upto`."""
    expected = {}
    for stream_id in await store.pool.fetch("SELECT DISTINCT stream_id FROM events"):
        events = [
            e for e in await store.read_stream(stream_id["stream_id"]) if e.global_position <= upto
        ]
        if events:
            state = fold(events)
            expected[state.task_id] = _row(state, events[-1].occurred_at)
    return expected


@pytest.mark.parametrize("kept", [1, 3, 1024], ids=["kept-1", "kept-3", "kept-1024"])
async def test_rows_are_the_fold_of_each_whole_stream_whatever_is_kept(
    store: PostgresEventStore, kept: int
) -> None:
    """Ten tasks' events appended interleaved, the projector catching up after random
    steps, in batches of 4 (a task's events span batches); with room for 1, 3 or all
    tasks, so a task is brought up from what is kept, from the batch's own events, or
    read again after it was evicted."""
    rnd = random.Random(kept)
    pending = {task: list(events) for task, events in histories(10, seed=kept).items()}
    projector = TaskListProjector(store, batch_size=4)
    projector._kept = KeptTasks(_spec_of, kept=kept)
    while pending:
        task = rnd.choice(sorted(pending))
        event, at = pending[task].pop(0)
        await store.append(f"task-{task}", [NewEvent(event, META, at)])
        if not pending[task]:
            del pending[task]
        if rnd.random() < 0.3:
            await projector.catch_up()
    await projector.catch_up()
    head = await store.head_position()
    assert await rows(store) == await folded_rows(store, head)


async def test_a_batch_applied_again_writes_the_rows_of_its_own_position(
    store: PostgresEventStore,
) -> None:
    """A batch read again (its transaction failed after the projector had folded it)
    while later events are already kept: each row is folded up to that batch alone."""
    for task, events in histories(3, seed=7).items():
        for event, at in events:
            await store.append(f"task-{task}", [NewEvent(event, META, at)])
    early = await store.all_reader(0).read(12)
    projector = TaskListProjector(store, batch_size=5)
    await projector.catch_up()  # everything kept at its last version
    await projector._apply(early)
    expected = await folded_rows(store, early[-1].global_position)
    found = await rows(store)
    for task in {e.stream_id.removeprefix("task-") for e in early}:
        assert found[task] == expected[task]
