"""A task decision of `decide_and_append`, without a store: what one try decides."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent
from runyard.contracts.task_events import TaskFailed, TaskStopped, TaskStopRequested
from runyard.domain import (
    Fail,
    RequestStop,
    Submit,
    TaskAlreadyFinished,
    TaskNotFound,
    TaskState,
    decide,
    fold,
)
from runyard.eventstore import AppendRequest, Decision, TaskCommands

from tests.unit.test_task_domain import make_spec

T0 = datetime(2025, 3, 1, 8, 0, tzinfo=UTC)
TASK = "t-1"
META = Metadata(actor="service:test", causation_id="cause-1", correlation_id="corr-1")


def recorded(*events: Event, start: int = 1, at: datetime = T0) -> list[RecordedEvent[Event]]:
    return [
        RecordedEvent(uuid4(), f"task-{TASK}", v, v, at, e, META)
        for v, e in enumerate(events, start=start)
    ]


def submitted() -> list[RecordedEvent[Event]]:
    submit = Submit(TASK, "ml", "ml/alice", make_spec())
    return recorded(*decide(None, submit, now=T0, ids=lambda: "unused"))


def stopped() -> list[RecordedEvent[Event]]:
    stream = submitted()
    stop = RequestStop(TASK, by="alice", role="member")
    events = decide(fold(stream, task_id=TASK), stop, now=T0, ids=no_ids)
    assert [type(e) for e in events] == [TaskStopRequested, TaskStopped]
    return stream + recorded(*events, start=len(stream) + 1)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def no_ids() -> str:
    raise AssertionError("no id is needed")


def test_commands_are_decided_on_the_stream_with_its_metadata_and_time() -> None:
    fail = TaskCommands(TASK, [Fail(TASK, "oom")], META, lambda: at(5), ids=no_ids)
    decision = fail(submitted())
    [failed] = decision.events
    assert isinstance(failed.event, TaskFailed) and failed.event.reason == "oom"
    assert failed.metadata == META and failed.occurred_at == at(5)
    assert decision.answer == list(decision.events)
    assert decision.appends(f"task-{TASK}", 1) == [
        AppendRequest(f"task-{TASK}", decision.events, 1)
    ]


def test_several_commands_each_see_the_events_before_it() -> None:
    stop = RequestStop(TASK, by="alice", role="member")
    with pytest.raises(TaskAlreadyFinished):  # the stop ended the task: the fail is refused
        TaskCommands(TASK, [stop, Fail(TASK, "oom")], META, lambda: T0, ids=no_ids)(submitted())


def test_a_refusal_raises_unless_it_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    fail = [Fail(TASK, "oom")]
    with pytest.raises(TaskAlreadyFinished):
        TaskCommands(TASK, fail, META, lambda: T0, ids=no_ids)(stopped())
    quiet = logging.getLogger("runyard.test.decisions")
    with caplog.at_level(logging.INFO, logger=quiet.name):
        decision = TaskCommands(TASK, fail, META, lambda: T0, ids=no_ids, log_refusals=quiet)(
            stopped()
        )
    assert decision.answer == [] and decision.appends(f"task-{TASK}", 3) == []
    [line] = [r for r in caplog.records if r.name == quiet.name]
    assert line.levelno == logging.INFO
    assert line.getMessage().startswith(f"{TASK}: cannot fail task")


def test_no_stream_is_a_task_not_found() -> None:
    with pytest.raises(TaskNotFound):
        TaskCommands(TASK, [Fail(TASK, "oom")], META, lambda: T0, ids=no_ids)([])


def test_only_if_decides_nothing_when_the_task_moved_on() -> None:
    seen: list[TaskState | None] = []

    def still_new(state: TaskState | None) -> bool:
        seen.append(state)
        return state is not None and state.status == "new"

    fail = [Fail(TASK, "oom")]
    moved_on = TaskCommands(TASK, fail, META, lambda: T0, ids=no_ids, only_if=still_new)
    assert not moved_on(stopped()).events  # not refused: never decided
    assert len(moved_on(submitted()).events) == 1
    assert [s.status if s else None for s in seen] == ["stopped", "new"]


@pytest.mark.parametrize(
    ("fact_s", "now_s", "expected_s"),
    [
        (3, 10, 3),  # a fact's own time
        (12, 10, 10),  # never later than now
        (-5, 10, 0),  # never before the stream's last event (at T0)
    ],
)
def test_at_is_the_events_time_within_the_stream_and_now(
    fact_s: float, now_s: float, expected_s: float
) -> None:
    decide_at = TaskCommands(
        TASK, [Fail(TASK, "oom")], META, lambda: at(now_s), ids=no_ids, at=at(fact_s)
    )
    [failed] = decide_at(submitted()).events
    assert failed.occurred_at == at(expected_s)


def test_metadata_may_name_a_cause_found_in_the_stream() -> None:
    def caused_by_first(stream: Sequence[RecordedEvent[Event]]) -> Metadata:
        return Metadata(actor="service:test").caused_by(stream[0], "service:test")

    stream = submitted()
    [failed] = TaskCommands(TASK, [Fail(TASK, "oom")], caused_by_first, lambda: T0, ids=no_ids)(
        stream
    ).events
    assert failed.metadata.causation_id == str(stream[0].event_id)
    assert failed.metadata.correlation_id == "corr-1"


def test_appends_leave_out_streams_without_events() -> None:
    one = [NewEvent(TaskFailed(run=1, attempt=0, reason="oom"), META, T0)]
    decision = Decision(
        "answer",
        events=[],
        others=[AppendRequest("task-a", one, 4), AppendRequest("task-b", [], 7)],
    )
    assert decision.appends("pool-p", 9) == [AppendRequest("task-a", one, 4)]
    assert Decision("answer", one).appends("pool-p", 0) == [AppendRequest("pool-p", one, 0)]
