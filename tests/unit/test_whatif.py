"""What-if scheduling: the pure simulator (runyard.scheduler.domain.whatif), how a window
of the log becomes its input (runyard.scheduler.domain.history), and the bounds of the
route's input (runyard.scheduler.whatif)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from runyard.api.auth import Principal
from runyard.api.errors import BadRequest, PermissionDenied
from runyard.contracts import Event, Metadata, RecordedEvent
from runyard.contracts.pool_events import (
    AllocatedWorker,
    NodeAdded,
    NodeMarkedFaulty,
    NodeRemoved,
    PoolRegistered,
    WorkersAllocated,
    WorkerSpec,
    WorkersReleased,
)
from runyard.contracts.spec import TaskSpec
from runyard.contracts.task_events import (
    TaskPlaced,
    TaskRerunRequested,
    TaskStopped,
    TaskSubmitted,
    TaskSucceeded,
    WorkerPlacement,
)
from runyard.scheduler.domain import PlacementRequest, fold_pool
from runyard.scheduler.domain.history import runs_of, setup_events, sim_runs
from runyard.scheduler.domain.whatif import (
    NodeChange,
    SimRun,
    Wait,
    percentile,
    real_usage,
    simulate,
    wait_stats,
)
from runyard.scheduler.whatif import (
    MAX_NODES,
    MAX_WINDOW,
    nodes_of_pools,
    require_sre,
    window_of,
)

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
SPECS = (WorkerSpec(name="8gpu", gpus=8, cpus=96, memory_gib=960),)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def pool(nodes: int) -> list[Event]:
    registered = PoolRegistered(
        pool_id="p",
        zone="z",
        resource_type="subscription",
        gpu_model="A100",
        network="roce",
        specs=SPECS,
    )
    return [registered, *(NodeAdded(node=f"n{i}") for i in range(nodes))]


def run(key: str, arrived: float, hold: float | None, **kw: Any) -> SimRun:
    gpus = kw.pop("gpus", (8,))
    return SimRun(
        key=key,
        spec="8gpu",
        request=PlacementRequest(key, tuple(gpus)),
        submitted_at=at(arrived),
        arrived_at=at(arrived),
        hold_s=hold,
        **kw,
    )


def placed(result: object, key: str) -> float | None:
    outcome = result.outcomes[key]  # type: ignore[attr-defined]
    return None if outcome.placed_at is None else (outcome.placed_at - T0).total_seconds()


# -- the simulator ----------------------------------------------------------------------


def test_tasks_queue_behind_a_small_pool_and_start_as_gpus_free() -> None:
    runs = [run("a", 0, 10), run("b", 0, 10), run("c", 1, 5)]
    result = simulate(pool(1), runs, [], start=T0, end=at(60))
    assert [placed(result, k) for k in "abc"] == [0, 10, 20]
    assert result.usage.held_s == pytest.approx(25 * 8)
    assert result.usage.capacity_s == pytest.approx(60 * 8)


def test_twice_the_nodes_waits_less() -> None:
    runs = [run(k, 0, 10) for k in "abcd"]
    small = simulate(pool(2), runs, [], start=T0, end=at(60))
    big = simulate(pool(4), runs, [], start=T0, end=at(60))
    assert [placed(small, k) for k in "abcd"] == [0, 0, 10, 10]
    assert [placed(big, k) for k in "abcd"] == [0, 0, 0, 0]


def test_same_input_same_result() -> None:
    runs = [run(f"t{i}", i % 3, 5 + i % 4) for i in range(30)]
    one = simulate(pool(3), runs, [], start=T0, end=at(200))
    two = simulate(pool(3), runs, [], start=T0, end=at(200))
    assert one == two


def test_backfill_starts_a_small_task_behind_a_blocked_head_and_fifo_does_not() -> None:
    # a (4 GPUs) goes to n1 and b (6 GPUs) to n0 (best fit); the 8-GPU head waits for
    # n1's 4 free GPUs, held back for it; the 2 free GPUs of n0 are free for backfill.
    runs = [
        run("a", 0, 10, gpus=(4,)),
        run("b", 0, 20, gpus=(6,)),
        run("head", 1, 5, gpus=(8,)),
        run("small", 2, 3, gpus=(2,)),
    ]
    backfill = simulate(pool(2), runs, [], start=T0, end=at(60))
    fifo = simulate(pool(2), runs, [], start=T0, end=at(60), policy="fifo")
    assert (placed(backfill, "head"), placed(backfill, "small")) == (10, 2)
    assert (placed(fifo, "head"), placed(fifo, "small")) == (10, 10)


def test_a_run_with_no_known_end_holds_until_the_window_ends() -> None:
    result = simulate(pool(1), [run("a", 0, None), run("b", 1, 5)], [], start=T0, end=at(30))
    assert placed(result, "b") is None
    assert result.usage.held_s == pytest.approx(30 * 8)


def test_a_stop_while_waiting_leaves_at_the_same_wall_time() -> None:
    runs = [run("a", 0, 20), run("b", 1, None, stop_at=at(5))]
    small = simulate(pool(1), runs, [], start=T0, end=at(60))
    assert small.outcomes["b"].left_at == at(5)
    # With room it starts at once and runs until the moment it was stopped.
    big = simulate(pool(2), runs, [], start=T0, end=at(60))
    assert placed(big, "b") == 1 and big.outcomes["b"].left_at is None
    assert big.usage.held_s == pytest.approx((20 + 4) * 8)


def test_runs_held_at_the_start_keep_their_nodes_or_wait_again() -> None:
    held = (AllocatedWorker(index=0, node="n1", gpus=tuple(range(8))),)
    runs = [run("old", -5, 10, held=held), run("new", 0, 10)]
    result = simulate(pool(2), runs, [], start=T0, end=at(60))
    assert result.outcomes["old"].placed_at is None  # placed before the window: not a wait
    assert placed(result, "new") == 0
    smaller = simulate(
        pool(1), [run("old", -5, 10, held=held), run("x", 0, 10)], [], start=T0, end=at(60)
    )
    # n1 is gone: best fit on n0; x waits for it.
    assert placed(smaller, "x") == 10
    none = simulate(
        pool(0),
        [run("old", -5, 10, held=held)],
        [NodeChange(at(3), NodeAdded(node="m"))],
        start=T0,
        end=at(60),
    )
    assert none.outcomes["old"].displaced and placed(none, "old") == 3


def test_node_changes_apply_by_name_and_the_rest_are_skipped() -> None:
    changes = [
        NodeChange(at(5), NodeAdded(node="n9")),
        NodeChange(at(6), NodeRemoved(node="nope")),
    ]
    result = simulate(pool(1), [run("a", 0, 10), run("b", 0, 10)], changes, start=T0, end=at(60))
    assert placed(result, "b") == 5
    assert result.skipped_changes == 1


def test_a_removed_node_requeues_its_run_with_the_hold_it_has_left() -> None:
    changes = [NodeChange(at(4), NodeRemoved(node="n0"))]
    result = simulate(pool(2), [run("a", 0, 10)], changes, start=T0, end=at(60))
    # moved to n1 at 4 s with 6 s left: 10 s of holding in all
    assert result.usage.held_s == pytest.approx(10 * 8)
    assert result.usage.capacity_s == pytest.approx(4 * 16 + 56 * 8)


def test_a_faulty_node_moves_its_run_first_in_the_queue() -> None:
    changes = [NodeChange(at(4), NodeMarkedFaulty(node="n1", reason="xid"))]
    runs = [run("a", 0, 10), run("b", 0, 10), run("c", 1, 10)]
    result = simulate(pool(2), runs, changes, start=T0, end=at(60))
    # the run on n1 waits again, ahead of c, with 6 s left: placed at 10, c at 16
    assert placed(result, "c") == 16
    assert result.usage.held_s == pytest.approx(30 * 8)


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 90) == 90
    assert percentile(values, 99) == 99
    assert percentile([], 50) is None
    stats = wait_stats(
        [Wait(at(0), at(4)), Wait(at(0), None), Wait(at(0), None, left=True)], at(10)
    )
    assert (stats.runs, stats.placed, stats.waiting_at_end, stats.left_queue) == (3, 1, 1, 1)
    assert (stats.p50_s, stats.max_s) == (4.0, 10.0)


def test_real_usage_integrates_the_pool_stream() -> None:
    worker = (AllocatedWorker(index=0, node="n0", gpus=(0, 1)),)
    changes = [
        (at(10), WorkersAllocated(task_id="t", run=1, attempt=1, workers=worker)),
        (at(20), WorkersReleased(task_id="t", run=1, attempt=1, reason="done")),
    ]
    usage = real_usage(fold_pool(pool(1)), changes, start=T0, end=at(40), labels={"t": "2gpu"})
    assert usage.held_s == pytest.approx(20)
    assert usage.by_spec == {"2gpu": pytest.approx(20)}
    assert usage.utilisation == pytest.approx(20 / 320)


# -- the log as input -------------------------------------------------------------------


def recorded(stream: str, events: list[tuple[float, Event]]) -> list[RecordedEvent[Event]]:
    return [
        RecordedEvent(
            event_id=uuid.uuid4(),
            stream_id=stream,
            stream_version=n,
            global_position=n,
            occurred_at=at(t),
            event=e,
            metadata=Metadata(actor="test"),
        )
        for n, (t, e) in enumerate(events, start=1)
    ]


SPEC = TaskSpec(name="x", pool="p", worker_spec="8gpu", image="bash-only", command="true")
WORKERS = (WorkerPlacement(index=0, node="n0", gpus=tuple(range(8))),)


def test_runs_of_a_stream_count_the_hold_inside_the_window() -> None:
    stream = recorded(
        "task-t",
        [
            (-10, TaskSubmitted(task_id="t", tenant="e", creator="u", spec=SPEC)),
            (-5, TaskPlaced(run=1, attempt=1, pool="p", workers=WORKERS)),
            (5, TaskSucceeded(run=1, attempt=1)),
            (8, TaskRerunRequested(run=2, spec=SPEC)),
            (9, TaskStopped(run=2)),
        ],
    )
    first, second = runs_of(stream, T0)
    assert (first.placed_at, first.ended_at, first.hold_s) == (at(-5), at(5), 5.0)
    assert (second.run, second.arrived_at, second.submitted_at, second.placed_at) == (
        2,
        at(8),
        at(-10),
        None,
    )
    state = fold_pool(pool(1))
    kept, played, skipped = sim_runs(state, [first, second], T0)
    assert kept == [first, second]
    assert skipped == 0 and [p.key for p in played] == ["t/1", "t/2"]
    assert played[0].hold_s == 5.0 and played[0].stop_at is None
    assert played[1].hold_s is None and played[1].stop_at == at(9)


def test_setup_keeps_the_log_registration_and_the_health_of_named_nodes() -> None:
    state = fold_pool([*pool(2), NodeMarkedFaulty(node="n1", reason="xid")])
    events = setup_events(state, [("n1", 8), ("extra", 4)])
    simulated = fold_pool(events)
    assert simulated.specs == state.specs
    assert simulated.nodes["n1"].health == "faulty"
    assert simulated.nodes["extra"].gpus == 4
    assert len(fold_pool(setup_events(state, None)).nodes) == 2


def test_inputs_are_bounded_with_errors_that_name_the_fix() -> None:
    with pytest.raises(BadRequest) as caught:
        window_of("2026-12-01T00:00:00Z", "2026-12-20T00:00:00Z")
    assert caught.value.code == "whatif.window_too_long" and caught.value.field == "to"
    assert str(MAX_WINDOW.days) in caught.value.hint
    with pytest.raises(BadRequest) as caught:
        window_of("12", "2026-12-20T00:00:00Z")
    assert caught.value.code == "whatif.bad_time"
    with pytest.raises(BadRequest) as caught:
        window_of("2026-12-02T00:00:00Z", "2026-12-01T00:00:00Z")
    assert caught.value.code == "whatif.bad_window"
    with pytest.raises(BadRequest) as caught:
        nodes_of_pools([{"id": "p", "nodes": {"count": MAX_NODES + 1}}])
    assert caught.value.code == "whatif.too_many_nodes"
    with pytest.raises(BadRequest):
        nodes_of_pools([])
    with pytest.raises(BadRequest):
        nodes_of_pools([{"nodes": ["a"]}])
    for nodes in ([""], {"count": 1, "gpus": 9}, {"count": "x"}, None, [{"gpus": 8}]):
        with pytest.raises(BadRequest):
            nodes_of_pools([{"id": "p", "nodes": nodes}])
    assert nodes_of_pools(
        [{"id": "p", "zone": "z", "nodes": {"prefix": "x-", "count": 2, "gpus": 4}}]
    ) == {"p": [("x-0", 4), ("x-1", 4)]}
    with pytest.raises(PermissionDenied):
        require_sre(Principal("t", "u", "member"))
    require_sre(Principal("t", "u", "sre"))
