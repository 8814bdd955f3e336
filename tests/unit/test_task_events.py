"""Task event contracts: events round-trip, the upcaster lifts v1, the catalogue is current."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import pytest
from pydantic import ValidationError
from runyard.contracts.base import Event
from runyard.contracts.catalogue import check, main, render, type_label
from runyard.contracts.registry import all_event_models, all_upcasters, default_mapper
from runyard.contracts.spec import TaskSpec
from runyard.contracts.task_events import (
    SERVICES,
    TASK_EVENTS,
    AlertDelivered,
    AlertFailed,
    DeployStageCompleted,
    DeployStageFailed,
    DeployStageStarted,
    EnvCheckFinished,
    EnvCheckItemReported,
    EnvCheckStarted,
    HangDetected,
    ResourcesReleased,
    ResumeNotObserved,
    ResumeObserved,
    SlowdownDetected,
    StacksCaptured,
    SubmissionWarning,
    TaskCloned,
    TaskFailed,
    TaskMarkedAbnormal,
    TaskPlaced,
    TaskPreempted,
    TaskQueued,
    TaskRequeued,
    TaskRerunRequested,
    TaskRescheduleFailed,
    TaskRescheduleRequested,
    TaskRestartScheduled,
    TaskRunning,
    TaskStopped,
    TaskStopRequested,
    TaskSubmitted,
    TaskSucceeded,
    WorkerExited,
    WorkerPlacement,
    WorkerStarted,
)

CATALOGUE = Path(__file__).resolve().parents[2] / "docs" / "events.md"
SPEC = TaskSpec(name="llama-sft", pool="pool-a", worker_spec="8gpu", image="train:1", command="x")
RUN = {"run": 1, "attempt": 1}

SAMPLES: dict[type[Event], Event] = {
    type(e): e
    for e in (
        TaskSubmitted(
            task_id="t1",
            tenant="ml",
            creator="ml/alice",
            spec=SPEC,
            warnings=(
                SubmissionWarning(code="storage.local_output", field="output_dirs[0]", message="m"),
            ),
            group_id="g1",
            cloned_from="t0",
        ),
        TaskCloned(new_task_id="t2"),
        TaskRerunRequested(
            run=2, spec=SPEC.model_copy(update={"command": "y"}), changes=("command",)
        ),
        TaskQueued(
            run=1,
            reason="needs 4 x 8-GPU workers, pool can start 2",
            position=3,
            gpus_needed=32,
            launchable=2,
        ),
        TaskPlaced(
            **RUN, pool="pool-a", workers=(WorkerPlacement(index=0, node="n1", gpus=(0, 1)),)
        ),
        DeployStageStarted(**RUN, stage="image_pull"),
        DeployStageCompleted(**RUN, stage="image_pull", duration_ms=1200),
        DeployStageFailed(**RUN, stage="storage_mount", reason="volume missing", duration_ms=5),
        EnvCheckStarted(**RUN),
        EnvCheckItemReported(
            **RUN, worker=0, item="gpu", result="fail", detail="GPU 3 dropped", blocking=True
        ),
        EnvCheckFinished(**RUN, result="fail", blocking_failures=1, warnings=2),
        WorkerStarted(**RUN, worker=0, node="n1"),
        WorkerExited(**RUN, worker=0, exit_code=137),
        TaskRunning(**RUN),
        TaskSucceeded(**RUN),
        TaskFailed(**RUN, reason="worker 0 exited with code 1", worker=0, exit_code=1),
        TaskStopRequested(reason="not needed"),
        TaskStopped(run=1),
        TaskRestartScheduled(run=1, attempt=2, reason="hang", delay_s=10.0),
        TaskRescheduleRequested(**RUN, reason="GPU dropped", faulty_nodes=("n1",)),
        TaskRescheduleFailed(run=1, reason="no healthy node"),
        TaskPreempted(run=1, reason="spot capacity shrank"),
        TaskRequeued(run=1, requeue_count=1),
        TaskMarkedAbnormal(run=1, reason="queued too long", next_steps=("resubmit it",)),
        ResourcesReleased(**RUN, reason="task finished"),
        HangDetected(**RUN, idle_s=601.5, last_log_at=datetime(2025, 1, 1, 12, tzinfo=UTC)),
        StacksCaptured(**RUN, workers=(0, 1), report_id="r1", summary="all ranks in allreduce"),
        SlowdownDetected(
            run=1,
            first_iter=83,
            last_iter=87,
            mean_ms=9465.0,
            baseline_ms=3101.0,
            ratio=2.05,
            message=(
                "Smoothed mean (iters 83-87: 9465.00 ms, baseline: 3101.00 ms), "
                "threshold ratio:2.05. Warning"
            ),
        ),
        ResumeObserved(**RUN, step=1200, path="/data/ckpt/iter_1200", line="loaded checkpoint"),
        ResumeNotObserved(**RUN, waited_s=600.0),
        AlertDelivered(alert="failed", channel="feishu:sub-1", attempt=1),
        AlertFailed(
            alert="failed", channel="feishu:sub-1", reason="rate limited", code=429, retryable=True
        ),
    )
}


def test_samples_cover_every_task_event() -> None:
    assert set(SAMPLES) == set(TASK_EVENTS)
    assert len(TASK_EVENTS) == len(set(TASK_EVENTS))


@pytest.mark.parametrize("event", list(SAMPLES.values()), ids=lambda e: e.type_name())
def test_every_event_round_trips_through_the_mapper(event: Event) -> None:
    mapper = default_mapper()
    type_name, version, data = mapper.encode(event)
    assert (type_name, version) == (event.type_name(), type(event).schema_version)
    assert mapper.decode(type_name, version, data) == event
    assert mapper.decode(type_name, version, data.encode()) == event


@pytest.mark.parametrize("model", TASK_EVENTS, ids=lambda m: m.type_name())
def test_every_event_is_documented_for_the_catalogue(model: type[Event]) -> None:
    assert model.category == "task"
    assert model.emitted_by in SERVICES
    assert set(model.reacted_by) <= set(SERVICES)
    assert model.__doc__ and len(model.__doc__.strip()) > 20
    assert model.type_name()[0].isupper()


def test_events_are_frozen_and_strict() -> None:
    event = TaskStopped(run=1)
    with pytest.raises(ValidationError):
        event.run = 2  # type: ignore[misc]
    with pytest.raises(ValidationError):
        TaskStopped.model_validate({"run": 1, "surprise": True})


@pytest.mark.parametrize(
    ("model", "payload"),
    [
        (TaskPlaced, {"run": 1, "attempt": 1, "pool": "p", "workers": []}),
        (TaskStopped, {"run": 0}),
        (WorkerStarted, {"run": 1, "attempt": 1, "worker": -1, "node": "n"}),
        (
            EnvCheckItemReported,
            {"run": 1, "attempt": 1, "worker": 0, "item": "disk", "result": "pass", "detail": ""},
        ),
        (DeployStageStarted, {"run": 1, "attempt": 1, "stage": "warmup"}),
        (TaskQueued, {"run": 1, "reason": "", "position": 0, "gpus_needed": 8, "launchable": 0}),
    ],
)
def test_impossible_payloads_are_refused(model: type[Event], payload: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        model.model_validate(payload)


def test_default_mapper_knows_every_event() -> None:
    from runyard.contracts.admin_events import ACCESS_EVENTS, CATALOGUE_EVENTS
    from runyard.contracts.pool_events import POOL_EVENTS

    every = TASK_EVENTS + POOL_EVENTS + ACCESS_EVENTS + CATALOGUE_EVENTS
    assert all_event_models() == every
    assert set(default_mapper().models) == {m.type_name() for m in every}


def _v1_submitted(**extra: object) -> str:
    payload = {
        "task_id": "t1",
        "tenant": "ml",
        "creator": "ml/alice",
        "spec": SPEC.model_dump(mode="json"),
    }
    return json.dumps(payload | extra)


def test_task_submitted_v1_is_upcast_to_structured_warnings_and_no_group() -> None:
    decoded = default_mapper().decode(
        "TaskSubmitted", 1, _v1_submitted(warnings=["outputs under /tmp are lost"])
    )
    assert isinstance(decoded, TaskSubmitted)
    assert decoded.warnings == (
        SubmissionWarning(
            code="legacy.unstructured", field="spec", message="outputs under /tmp are lost"
        ),
    )
    assert decoded.group_id is None
    assert decoded.spec == SPEC


def test_task_submitted_v1_without_warnings_loads() -> None:
    decoded = default_mapper().decode("TaskSubmitted", 1, _v1_submitted(cloned_from="t0"))
    assert isinstance(decoded, TaskSubmitted)
    assert (decoded.warnings, decoded.group_id, decoded.cloned_from) == ((), None, "t0")


def test_upcaster_is_registered_for_every_older_version() -> None:
    assert [(name, version) for name, version, _ in all_upcasters()] == [
        ("TaskSubmitted", 1),
        ("TaskQueued", 1),
        ("TaskStopRequested", 1),
    ]
    assert TaskSubmitted.schema_version == TaskQueued.schema_version == 2
    assert TaskStopRequested.schema_version == 2


def test_task_queued_v1_is_upcast_with_its_kind_read_from_the_reason() -> None:
    mapper = default_mapper()
    v1 = {"run": 1, "position": 3, "gpus_needed": 32, "launchable": 1}
    waiting = mapper.decode(
        "TaskQueued", 1, json.dumps(v1 | {"reason": "needs 4 x 8-GPU workers; 3 tasks ahead"})
    )
    assert isinstance(waiting, TaskQueued) and not waiting.blocked and waiting.position == 3
    blocked_reason = (
        "needs 4 x 8-GPU workers, but the pool's 3 schedulable nodes could start only 3 even "
        "if idle; reduce the worker count, add nodes or choose another pool; first in queue"
    )
    blocked = mapper.decode("TaskQueued", 1, json.dumps(v1 | {"reason": blocked_reason}))
    assert isinstance(blocked, TaskQueued) and blocked.blocked


def test_task_stop_requested_v1_names_nobody() -> None:
    decoded = default_mapper().decode(
        "TaskStopRequested", 1, json.dumps({"reason": "stopped by its owner"})
    )
    assert isinstance(decoded, TaskStopRequested)
    assert (decoded.stopped_by, decoded.role, decoded.group_id) == (None, None, None)


def test_a_version_newer_than_the_code_is_refused() -> None:
    with pytest.raises(ValueError, match="newer than this code"):
        default_mapper().decode("TaskSubmitted", 3, _v1_submitted())


def test_catalogue_file_is_current() -> None:
    assert check(CATALOGUE), (
        "docs/events.md is stale: python -m runyard.contracts.catalogue > docs/events.md"
    )


def test_catalogue_lists_every_event_with_its_fields() -> None:
    text = render()
    for model in TASK_EVENTS:
        assert f"### {model.type_name()}\n" in text
        for name in model.model_fields:
            assert f"| `{name}` |" in text
    assert "- schema version: 2" in text
    assert "### WorkerPlacement" in text and "### TaskSpec" in text


def test_catalogue_check_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "events.md"
    stale.write_text("# old\n", encoding="utf-8")
    assert main(["--check", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert main(["--check", str(tmp_path / "missing.md")]) == 1
    assert main([]) == 0
    stale.write_text(capsys.readouterr().out, encoding="utf-8")
    assert main(["--check", str(stale)]) == 0


@pytest.mark.parametrize(
    ("annotation", "label"),
    [
        (int, "int"),
        (str | None, "str | None"),
        (tuple[int, ...], "tuple[int, ...]"),
        (Literal["a", "b"], "'a' | 'b'"),
        (tuple[WorkerPlacement, ...], "tuple[WorkerPlacement, ...]"),
    ],
)
def test_type_labels(annotation: object, label: str) -> None:
    assert type_label(annotation) == label
