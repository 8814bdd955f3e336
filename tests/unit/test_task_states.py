"""`TaskStates` keeps folded tasks and brings them up to date from the events appended
since: after any growth of a stream, in any steps, it answers what a fold of the whole
stream answers; it keeps only the tasks asked for last, and checks the caller's tenant."""

from __future__ import annotations

import asyncio
import random
from datetime import datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runyard.api.auth import Principal
from runyard.api.errors import NotFound, PermissionDenied
from runyard.api.tasks import TaskStates, task_stream
from runyard.contracts import Metadata, NewEvent, default_mapper
from runyard.contracts.base import Event
from runyard.contracts.spec import TaskSpec
from runyard.domain import fold
from runyard.eventstore import InMemoryEventStore

from tests.unit.test_task_domain import Story, specs, step, walk

META = Metadata(actor="user:t/u", causation_id="c", correlation_id="c")


async def append(
    store: InMemoryEventStore, task_id: str, events: list[tuple[Event, datetime]]
) -> None:
    if events:
        await store.append(task_stream(task_id), [NewEvent(e, META, at) for e, at in events])


def walk_of_three() -> dict[str, list[tuple[Event, datetime]]]:
    """Three tasks' histories of a few events each."""
    histories = {}
    for n in (1, 2, 3):
        story, rnd = Story(), random.Random(n)
        while len(story.events) < 4:
            step(story, rnd)
        histories[f"t-{n}"] = story.events
    return histories


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs, data=st.data())
def test_a_kept_task_brought_up_to_date_is_the_fold_of_its_whole_stream(
    spec: TaskSpec, data: st.DataObject
) -> None:
    events = walk(spec, data)
    cuts = sorted(data.draw(st.lists(st.integers(1, len(events)), max_size=6)))

    async def check() -> None:
        store = InMemoryEventStore(default_mapper())
        states = TaskStates(store)
        done = 0
        for cut in [*cuts, len(events)]:
            await append(store, "t-1", events[done:cut])
            done = max(done, cut)
            assert await states.get("t-1") == fold(await store.read_stream(task_stream("t-1")))

    asyncio.run(check())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs, data=st.data())
def test_the_task_as_of_an_event_is_the_fold_up_to_it_whatever_is_kept(
    spec: TaskSpec, data: st.DataObject
) -> None:
    """Events handled in stream order, with some skipped (another instance had them)
    and some handled again (a redelivery after later ones): each answer is the fold
    of the stream up to that event, never a later event's state."""
    events = walk(spec, data)
    order = data.draw(
        st.lists(st.integers(1, len(events)), min_size=1, max_size=12).map(
            lambda picks: (
                sorted(picks) if data.draw(st.booleans()) else picks
            )  # any order: handled again, or out of order
        )
    )

    async def check() -> None:
        store = InMemoryEventStore(default_mapper())
        await append(store, "t-1", events)
        stream = await store.read_stream(task_stream("t-1"))
        states = TaskStates(store, kept=data.draw(st.integers(1, 2)))
        for version in order:
            assert await states.at(stream[version - 1]) == fold(stream[:version])

    asyncio.run(check())


async def test_it_keeps_the_tasks_asked_for_last_and_reads_only_what_is_new() -> None:
    store = InMemoryEventStore(default_mapper())
    story = walk_of_three()
    for task_id, events in story.items():
        await append(store, task_id, events[:1])
    states = TaskStates(store, kept=2)
    for task_id in story:
        await states.get(task_id)
    assert list(states.states) == ["t-2", "t-3"]
    one_spec = states.states.size("t-3")
    small = TaskStates(store, kept_bytes=one_spec + one_spec // 2)
    for task_id in story:
        await small.get(task_id)
    assert list(small.states) == ["t-3"]  # the specs' bytes bound it first

    reads: list[int] = []
    read_stream = store.read_stream

    async def counted(stream_id: str, from_version: int = 1, limit: int | None = None):  # type: ignore[no-untyped-def]
        found = await read_stream(stream_id, from_version, limit)
        reads.append(len(found))
        return found

    store.read_stream = counted  # type: ignore[method-assign]
    await append(store, "t-3", story["t-3"][1:])
    assert (await states.get("t-3")).version == len(story["t-3"])
    assert (await states.get("t-1")).version == 1  # no longer kept: read whole
    assert reads == [len(story["t-3"]) - 1, 1]


async def test_a_task_of_another_tenant_is_no_task_and_a_reader_may_not_change_it() -> None:
    store = InMemoryEventStore(default_mapper())
    events = walk_of_three()["t-1"]
    await append(store, "t-1", events)
    states = TaskStates(store)
    tenant = (await states.get("t-1")).tenant
    assert (
        await states.visible(Principal(tenant, "u", "member"), "t-1", write=True)
    ).tenant == tenant
    with pytest.raises(NotFound):
        await states.visible(Principal("other", "u", "member"), "t-1")
    with pytest.raises(NotFound):
        await states.visible(Principal(tenant, "u", "member"), "t-404")
    with pytest.raises(PermissionDenied):
        await states.visible(Principal("other", "u", "sre"), "t-1", write=True)
    assert (await states.visible(Principal("other", "u", "sre"), "t-1")).tenant == tenant
