"""The chaos checks themselves: each broken promise is counted (pure code, no platform)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from runyard.contracts import Metadata, RecordedEvent, new_event_id
from runyard.contracts.task_events import TaskRestartScheduled, WorkerExited, WorkerStarted

from tests.chaos.harness import (
    START,
    ChaosReport,
    _differences,
    check_doubled,
    check_output,
    expected_lines,
)

META = Metadata(actor="service:deployer", causation_id="c", correlation_id="k")
EXITED_AT = 1_800_000_000.0


def recorded(event: Any, version: int, at: float = EXITED_AT) -> RecordedEvent[Any]:
    when = datetime.fromtimestamp(at, UTC)
    return RecordedEvent(new_event_id(), "task-t", version, version, when, event, META)


def started(attempt: int) -> RecordedEvent[Any]:
    return recorded(WorkerStarted(run=1, attempt=attempt, worker=0, node="n"), attempt)


def complete(last: float = EXITED_AT) -> Counter[str]:
    return Counter([f"{START}{last - 1.2}", *expected_lines(3), f"{last:.6f}"])


def doubled(events: list[RecordedEvent[Any]], output: Counter[str]) -> dict[str, str]:
    report = ChaosReport("unit", 1)
    starts = Counter(
        (e.event.run, e.event.attempt, e.event.worker)
        for e in events
        if isinstance(e.event, WorkerStarted)
    )
    check_doubled(report, "t", events, starts, {(1, 1, 0): output})
    return report.doubled


def test_one_clean_attempt_is_not_doubled() -> None:
    assert doubled([started(1)], complete()) == {}


def test_an_attempt_started_twice_or_run_twice_or_stored_twice_is_doubled() -> None:
    assert "WorkerStarted twice" in doubled([started(1), started(1)], complete())["t"]
    twice = complete() + Counter([f"{START}{EXITED_AT - 0.5}"])
    assert "ran 2 times" in doubled([started(1)], twice)["t"]
    assert "stored twice" in doubled([started(1)], complete() + Counter(["chaos line 2"]))["t"]


def test_a_second_attempt_needs_a_restart() -> None:
    assert "allow 1" in doubled([started(1), started(2)], complete())["t"]
    restart = recorded(TaskRestartScheduled(run=1, attempt=1, delay_s=1, reason="failure"), 3)
    assert doubled([started(1), restart, started(2)], complete()) == {}


def checked(output: Counter[str], exited_at: float) -> ChaosReport:
    report = ChaosReport("unit", 1)
    exit_event = recorded(WorkerExited(run=1, attempt=1, worker=0, exit_code=0), 2, exited_at)
    check_output(report, "t", [(1, 1, 0)], {(1, 1, 0): output}, {(1, 1, 0): exit_event}, 3)
    return report


def test_missing_lines_are_lost_and_a_late_exit_is_counted() -> None:
    assert checked(complete(), EXITED_AT + 0.3).problems() == []
    gone = complete() - Counter(["chaos line 2"])
    assert "['chaos line 2']" in checked(gone, EXITED_AT).lost["t"]
    no_exit_time = complete() - Counter([f"{EXITED_AT:.6f}"])
    assert "the exit time" in checked(no_exit_time, EXITED_AT).lost["t"]
    assert "+33.0 s" in checked(complete(), EXITED_AT + 33).late_exits["t"]


def test_a_read_model_row_unlike_its_rebuild_is_named_with_its_fields() -> None:
    assert _differences("task_list", {"t": {"status": "done"}}, {"t": {"status": "done"}}) == []
    found = _differences("task_list", {"t": {"status": "running", "run": 1}}, {"t": {"run": 1}})
    assert found == [
        "task_list: 1 of 1 rows differ; e.g. 't': (live, rebuilt) by field:"
        " {'status': ('running', None)}"
    ]
    assert "rebuilt None" in _differences("scheduler_queue", {"t": ("t", "pool")}, {})[0]
