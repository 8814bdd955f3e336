"""Which task events the notification service reads: exactly those its rules react to.

The consumer is given `EVENT_TYPES` as its filter and skips every other event
before any database work. These tests show the set cannot drift from the
rules (it is derived from the rules' table, and the handler itself returns on
the same set), that the running service's consumer gets it, and that the
skipped types really are irrelevant: over random valid task histories grown
by the task domain's own `decide`, the queue waits the service keeps from the
events it reads are those a service reading every event would keep, and no
skipped event raises an alert.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from aiokafka import ConsumerRecord
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runyard.contracts import Event, Metadata, RecordedEvent
from runyard.contracts.registry import all_event_models
from runyard.contracts.spec import ALERT_KINDS, TaskSpec
from runyard.domain import fold
from runyard.messaging import KafkaSettings
from runyard.notification.app import EVENT_TYPES, QUEUE_EVENTS, NotificationApp
from runyard.notification.main import make_consumer
from runyard.notification.rules import ALERT_EVENTS, alert_kind
from runyard.notification.store import Cause
from runyard.stack.context import ServiceContext

from tests.unit.test_task_domain import Story, make_spec, specs, step

TASK_TYPES = [m for m in all_event_models() if m.category == "task"]
SKIPPED = [m for m in all_event_models() if m.type_name() not in EVENT_TYPES]


class Untouchable:
    """A database (or event store) that fails the test if anything is asked of it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"database work for an event the rules do not react to: {name}")


class Touched(Exception):
    """What the stand-in store raises to show the handler went to work."""


class Recording:
    async def read_stream(self, stream: str, *args: Any) -> Any:
        raise Touched(stream)

    async def holds(self, event: RecordedEvent[Event]) -> Any:
        raise Touched(event.stream_id)


def recorded(event: Event, stream: str = "task-t-1") -> RecordedEvent[Event]:
    return RecordedEvent(
        uuid.uuid4(), stream, 2, 7, datetime.now(UTC), event, Metadata(actor="service:test")
    )


# --- the set, derived from the rules ------------------------------------------------------------


def test_the_filter_is_the_rules_alert_events_and_the_queue_events() -> None:
    handled: tuple[type[Event], ...] = (*ALERT_EVENTS, *QUEUE_EVENTS)
    derived = frozenset(t.type_name() for t in handled)
    assert derived == EVENT_TYPES
    # every alert kind but the timer's has its event in the rules' table, and only task events
    raised = {alert_kind(t.model_construct()) for t in ALERT_EVENTS}
    assert raised == set(ALERT_KINDS) - {"queued"}
    registered = {m.type_name() for m in TASK_TYPES}
    assert registered >= EVENT_TYPES, "every name in the filter is a task event that exists"
    # no event outside the filter raises an alert
    assert [m.type_name() for m in SKIPPED if alert_kind(m.model_construct())] == []


async def test_the_handler_reacts_to_exactly_the_filter_and_skips_the_rest_without_io() -> None:
    app = NotificationApp(cast(Any, Recording()))
    for model in TASK_TYPES:
        event = recorded(model.model_construct())
        if model.type_name() in EVENT_TYPES:
            with pytest.raises(Touched):  # it reads the task's stream to react
                await app.handle(event, cast(Any, Untouchable()))
        else:
            app.store = cast(Any, Untouchable())
            await app.handle(event, cast(Any, Untouchable()))
            app.store = cast(Any, Recording())


async def test_the_services_consumer_skips_the_other_types_before_any_database_work(
    tmp_path: Path,
) -> None:
    ctx = ServiceContext("postgresql://unused", KafkaSettings(), tmp_path, tmp_path)
    app = NotificationApp(cast(Any, Untouchable()))
    consumer = make_consumer(ctx, cast(Any, Untouchable()), app)
    assert consumer.event_types == EVENT_TYPES
    await consumer.process_batch([_record(i, m.type_name()) for i, m in enumerate(SKIPPED)])
    assert consumer.stats.skipped == len(SKIPPED) and consumer.stats.processed == 0


def _record(offset: int, event_type: str) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        topic="runyard.task-events",
        partition=0,
        offset=offset,
        timestamp=0,
        timestamp_type=0,
        key=b"task-t-1",
        value=b"{}",  # never decoded: the header says it is not wanted
        checksum=None,
        serialized_key_size=8,
        serialized_value_size=2,
        headers=[("event_type", event_type.encode())],
    )


# --- the skipped types are irrelevant to the rules ----------------------------------------------


def _waits(app: NotificationApp, events: list[tuple[Event, datetime]]) -> Any:
    state = fold(events) if events else None
    return None if state is None else app.queue_wait(state, Cause(None, None))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs, data=st.data())
def test_skipping_the_other_types_never_leaves_a_queue_wait_behind(
    spec: TaskSpec, data: st.DataObject
) -> None:
    """After every decision (the events one command appends together), the queue wait the
    service holds, from the state as of the last event it read, is the true one."""
    app = NotificationApp(cast(Any, None))
    rnd: random.Random = data.draw(st.randoms(use_true_random=False))
    story = Story(spec)
    read = 0  # the events up to the last one the service reads
    for _ in range(data.draw(st.integers(1, 80))):
        before = len(story.events)
        step(story, rnd)
        for i, (event, _) in enumerate(story.events[before:], start=before):
            if event.type_name() in EVENT_TYPES:
                read = i + 1
            else:
                assert alert_kind(event) is None
        held = _waits(app, story.events[:read]) if read else None
        truth = _waits(app, story.events)
        assert held == truth, [type(e).__name__ for e, _ in story.events]


def test_the_walks_reach_the_events_that_matter() -> None:
    """The random histories do queue, preempt, requeue and place tasks (so the property
    above is not vacuous about the skipped `TaskPreempted` that starts a wait)."""
    seen: set[str] = set()
    for seed in range(200):
        rnd = random.Random(seed)
        story = Story(make_spec(spot=seed % 2 == 0, auto_restart=seed % 3 == 0, max_requeues=2))
        for _ in range(80):
            step(story, rnd)
        seen |= {e.type_name() for e, _ in story.events}
    assert {"TaskQueued", "TaskPlaced", "TaskPreempted", "TaskRequeued"} <= seen


def test_the_event_catalogue_names_what_notification_reacts_to() -> None:
    """docs/events.md is generated from `reacted_by`: it must match the rules."""
    from runyard.contracts.task_events import TASK_EVENTS
    from runyard.notification.app import EVENT_TYPES

    listed = {m.type_name() for m in TASK_EVENTS if "notification" in m.reacted_by}
    assert listed == set(EVENT_TYPES)
