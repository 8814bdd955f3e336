"""SRE replay's pure parts: points, stream prefixes and their folds, diffs, pool views."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest
from runyard.contracts.base import Event
from runyard.contracts.envelope import Metadata, RecordedEvent
from runyard.contracts.pool_events import AllocatedWorker, WorkersAllocated, WorkersReleased
from runyard.domain import TaskState, fold
from runyard.domain.replay import (
    ReplayRefused,
    changes,
    check_in_log,
    check_order,
    flatten,
    parse_point,
    prefix,
    stream_prefix,
)
from runyard.gateway.replay import placement_view
from runyard.scheduler.domain import evolve_pool, fold_pool
from runyard.scheduler.replay import HIDDEN, hide_tasks, pool_at

from tests.unit.test_scheduler_domain import make_pool
from tests.unit.test_task_domain import TASK, Story, make_spec


def recorded(
    events: list[tuple[Event, datetime]], *, stream: str = f"task-{TASK}", first: int = 100
) -> list[RecordedEvent[Event]]:
    """A stream as the store gives it: positions `first`, `first + 2`, ... (other
    streams' events fall in between)."""
    return [
        RecordedEvent(
            event_id=uuid4(),
            stream_id=stream,
            stream_version=version,
            global_position=first + 2 * (version - 1),
            occurred_at=at,
            event=event,
            metadata=Metadata(actor="service:test"),
        )
        for version, (event, at) in enumerate(events, start=1)
    ]


def crash_and_restart() -> tuple[Story, list[TaskState]]:
    """Queued, placed, running attempt 1, crash, restart: the state after each event."""
    story = Story(make_spec(workers=1, auto_restart=True, max_restarts=1)).running()
    story.exit(0, 1)
    states = []
    for n in range(1, len(story.events) + 1):
        states.append(fold(story.events[:n]))
    return story, states


# --- points -------------------------------------------------------------------------


def test_a_point_is_a_position_or_a_time_with_a_zone() -> None:
    assert parse_point("1234") == 1234
    assert parse_point(" 7 ") == 7
    assert parse_point("2026-12-01T10:00:00Z") == datetime(2026, 12, 1, 10, tzinfo=UTC)
    at = parse_point("2026-12-01T18:00:00+08:00")
    assert at == datetime(2026, 12, 1, 10, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("yesterday", "neither a position nor an ISO 8601 time"),
        ("-5", "neither a position nor an ISO 8601 time"),
        ("²", "neither a position nor an ISO 8601 time"),
        ("0", "out of range"),
        (str(2**63), "out of range"),
        ("2026-12-01T10:00:00", "has no time zone"),
        ("0001-01-01T00:00:00Z", "outside 1970-01-01 to 3000-01-01"),
    ],
)
def test_a_bad_point_is_refused_naming_the_field_and_the_fix(text: str, says: str) -> None:
    with pytest.raises(ReplayRefused) as refused:
        parse_point(text, "from")
    error = refused.value
    assert (error.code, error.field, error.http_status) == ("replay.bad_point", "from", 400)
    assert says in error.message and error.message.startswith("from: ")
    assert error.hint


def test_a_position_past_the_end_of_the_log_is_refused_with_the_last_one() -> None:
    check_in_log(50, head=50)
    check_in_log(datetime(2999, 1, 1, tzinfo=UTC), head=50)  # a future time is "now"
    with pytest.raises(ReplayRefused) as refused:
        check_in_log(51, head=50)
    assert refused.value.code == "replay.past_end"
    assert "last position 50" in refused.value.message
    assert "up to 50" in refused.value.hint


def test_from_after_to_is_refused_but_mixed_kinds_are_not_compared() -> None:
    check_order(3, 3)
    check_order(5, datetime(2020, 1, 1, tzinfo=UTC))
    with pytest.raises(ReplayRefused) as refused:
        check_order(9, 3)
    assert (refused.value.code, refused.value.field) == ("replay.bad_range", "from")


# --- prefixes -----------------------------------------------------------------------


def test_the_prefix_at_each_position_folds_to_the_state_after_that_event() -> None:
    story, states = crash_and_restart()
    stream = recorded(story.events)
    for n, event in enumerate(stream, start=1):
        cut, as_of = stream_prefix(stream, event.global_position, what="task")
        assert len(cut) == n and as_of.version == n and as_of.position == event.global_position
        assert fold(cut) == states[n - 1]
        # a position between two of this stream's events (another stream's) cuts the same
        assert prefix(stream, event.global_position + 1) == cut


def test_the_prefix_at_a_time_holds_the_events_that_had_occurred() -> None:
    story, states = crash_and_restart()
    stream = recorded(story.events)
    statuses = []
    for event in stream:
        cut, _ = stream_prefix(stream, event.occurred_at + timedelta(milliseconds=1), what="t")
        statuses.append(fold(cut).status)
    assert statuses[0] == "new" and "queued" in statuses and "deploying" in statuses
    assert statuses[-1] == "restarting" and fold(stream) == states[-1]
    restarted = fold(stream)
    assert (restarted.attempt, restarted.restarts) == (2, 1)


def test_a_prefix_stops_at_the_first_event_past_the_point() -> None:
    story, _ = crash_and_restart()
    stream = recorded(story.events)
    # a later event stamped earlier (another service's clock) does not slip in
    early = stream[0].occurred_at - timedelta(hours=1)
    skewed = [*stream[:4], stream[4].replace(occurred_at=early), *stream[5:]]
    assert prefix(skewed, stream[2].occurred_at) == stream[:3]


def test_a_point_before_the_stream_began_names_its_first_event() -> None:
    story, _ = crash_and_restart()
    stream = recorded(story.events)
    with pytest.raises(ReplayRefused) as refused:
        stream_prefix(stream, 99, what=f"task {TASK}", field="to")
    error = refused.value
    assert (error.code, error.field) == ("replay.before_start", "to")
    assert f"task {TASK} did not exist yet then" in error.message
    assert "position 100" in error.message and stream[0].occurred_at.isoformat() in error.hint


# --- diffs --------------------------------------------------------------------------


def test_flatten_names_every_leaf_by_its_path() -> None:
    view = {"status": "running", "counters": {"restarts": 1}, "stages": [{"r": "ok"}], "x": []}
    assert dict(flatten(view)) == {
        "status": "running",
        "counters.restarts": 1,
        "stages.0.r": "ok",
        "x": [],
    }


def test_changes_are_the_leaves_that_differ_and_those_that_came_or_went() -> None:
    before = {"status": "running", "attempt": 1, "counters": {"restarts": 0}, "gone": "a"}
    after = {"status": "restarting", "attempt": 2, "counters": {"restarts": 1}, "new": [1]}
    found = {c.field: (c.before, c.after) for c in changes(before, after)}
    assert found == {
        "status": ("running", "restarting"),
        "attempt": (1, 2),
        "counters.restarts": (0, 1),
        "new.0": (None, 1),
        "gone": ("a", None),
    }
    assert changes(after, after) == []


def test_changes_name_only_what_differs_when_a_field_opens_or_closes() -> None:
    """A field null (or empty) on one side and with leaves on the other is told by those
    leaves; null on one side and absent on the other is no change at all."""
    before: dict[str, Any] = {"placement": None, "stages": [], "stage": None, "queue": None}
    after = {"placement": {"pool": "p", "workers": [{"node": "n1"}]}, "stages": [{"r": "ok"}]}
    found = {c.field: (c.before, c.after) for c in changes(before, after)}
    assert found == {
        "placement.pool": (None, "p"),
        "placement.workers.0.node": (None, "n1"),
        "stages.0.r": (None, "ok"),
    }
    back = {c.field: (c.before, c.after) for c in changes(after, before)}
    assert back == {
        "placement.pool": ("p", None),
        "placement.workers.0.node": ("n1", None),
        "stages.0.r": ("ok", None),
    }
    assert all(c.before != c.after for c in changes(before, after) + changes(after, before))


# --- views --------------------------------------------------------------------------


def test_placement_view_shows_each_worker_node_start_and_exit() -> None:
    story, _ = crash_and_restart()
    assert placement_view(fold(story.events[:2])) is None  # queued: no placement yet
    failed_attempt = fold(story.events[: len(story.events) - 1])
    view = placement_view(failed_attempt)
    assert view is not None
    assert view["pool"] == "pool-a" and view["attempt"] == 1
    assert view["workers"] == [
        {"worker": 0, "node": "node-0", "gpus": list(range(8)), "started": True, "exit_code": 1}
    ]


def test_a_pool_view_is_the_fold_and_hides_other_tenants_task_ids() -> None:
    pool = make_pool(2)
    worker = AllocatedWorker(index=0, node="n0", gpus=(0, 1))
    mine = WorkersAllocated(task_id="mine", run=1, attempt=1, workers=(worker,), priority=0)
    theirs = WorkersAllocated(
        task_id="theirs",
        run=1,
        attempt=1,
        workers=(AllocatedWorker(index=0, node="n1", gpus=(0,)),),
        priority=0,
    )
    evolve_pool(pool, mine)
    evolve_pool(pool, theirs)
    view = pool_at(pool)
    assert view["capacity"]["free_gpus"] == 16 - 3
    assert [a["task_id"] for a in view["occupancy"]["items"]] == ["mine", "theirs"]
    hidden = hide_tasks(view, {"mine"})
    assert [a["task_id"] for a in hidden["occupancy"]["items"]] == ["mine", HIDDEN]
    owners = {n["node"]: n["owners"] for n in hidden["nodes"]["items"]}
    assert owners["n0"][:3] == ["mine", "mine", None] and owners["n1"][0] == HIDDEN
    # a release folds the GPUs back
    released = fold_pool([WorkersReleased(task_id="mine", run=1, attempt=1, reason="ended")], pool)
    assert pool_at(released)["occupancy"]["tasks"] == 1
