"""The `detail` column of `runyard events`, `watch` and `audit`."""

from __future__ import annotations

from runyard.cli.detail import detail, has_restarts
from runyard.contracts.task_events import (
    DeployStageFailed,
    ResumeObserved,
    StacksCaptured,
    TaskPlaced,
    TaskRestartScheduled,
    WorkerExited,
    WorkerPlacement,
    WorkerStarted,
)


def data(event: object) -> dict[str, object]:
    """An event's payload as the API's JSON gives it."""
    dumped: dict[str, object] = event.model_dump(mode="json")  # type: ignore[attr-defined]
    return dumped


def test_what_where_and_why_come_first() -> None:
    failed = DeployStageFailed(
        run=1, attempt=1, stage="image_pull", reason="no such image", duration_ms=3
    )
    assert detail(data(failed)) == "stage=image_pull reason=no such image"
    exited = WorkerExited(run=1, attempt=1, worker=3, exit_code=137)
    assert detail(data(exited)) == "worker=3 exit_code=137"  # 0 would show too


def test_a_start_names_the_gpus_the_worker_got_where_they_are_not_the_placements() -> None:
    started = WorkerStarted(run=1, attempt=1, worker=1, node="n1", gpus=(2, 5))
    assert detail(data(started)) == "worker=1 node=n1 gpus=2,5"
    started = WorkerStarted(run=1, attempt=1, worker=1, node="n1")
    assert detail(data(started)) == "worker=1 node=n1"


def test_attempts_after_the_first_are_named_first() -> None:
    restart = TaskRestartScheduled(run=1, attempt=2, reason="failure", delay_s=10)
    assert detail(data(restart)) == "attempt=2 reason=failure delay_s=10.0"
    exited = WorkerExited(run=1, attempt=2, worker=3, exit_code=0)
    assert detail(data(exited)) == "attempt=2 worker=3 exit_code=0"
    resumed = ResumeObserved(run=1, attempt=2, step=40, path="/mnt/ckpt/ckpt-40.pt", line="x")
    assert detail(data(resumed)) == "attempt=2 step=40 path=/mnt/ckpt/ckpt-40.pt"


def test_placements_show_their_nodes_once_each() -> None:
    workers = tuple(WorkerPlacement(index=i, node=f"n{i % 2}", gpus=(i,)) for i in range(3))
    placed = TaskPlaced(run=1, attempt=1, pool="p", workers=workers)
    assert detail(data(placed)) == "nodes=n0,n1"


def test_workers_given_as_indexes_are_no_nodes() -> None:
    # StacksCaptured names its workers by index: no node to show, and no error.
    captured = StacksCaptured(run=1, attempt=1, workers=(0, 1), report_id="r", summary="s")
    assert detail(data(captured)) == ""


def test_in_a_restarted_history_the_first_attempt_is_named_too() -> None:
    """After a restart the old attempt's workers' exits come after the new attempt's
    events: in such a history every event names its attempt."""
    first = WorkerExited(run=1, attempt=1, worker=1, exit_code=143)
    restart = TaskRestartScheduled(run=1, attempt=2, reason="failure", delay_s=10)
    history: list[dict[str, object]] = [{"data": data(first)}, {"data": data(restart)}, {}]
    assert has_restarts(history) and not has_restarts(history[:1] + history[2:])
    assert detail(data(first), restarted=True) == "attempt=1 worker=1 exit_code=143"
    assert detail(data(first)) == "worker=1 exit_code=143"
