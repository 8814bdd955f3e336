"""The scheduler's pure core (R-01 to R-09, R-23, R-31): scenarios from the SPEC and properties."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runyard.contracts.base import Event
from runyard.contracts.mapper import EventMapper
from runyard.contracts.pool_events import (
    POOL_EVENTS,
    AllocatedWorker,
    Network,
    NodeAdded,
    NodeCordoned,
    NodeMarkedFaulty,
    NodeMarkedHealthy,
    NodeRemoved,
    NodeUncordoned,
    PoolRegistered,
    ResourceType,
    SpotCapacityChanged,
    WorkersAllocated,
    WorkerSpec,
    WorkersReleased,
)
from runyard.contracts.spec import SpotOptions, TaskSpec, split_custom_gpus
from runyard.scheduler.domain import (
    Abnormal,
    InvalidCapacityChange,
    NoCapacity,
    NoHealthyNode,
    NotASpotPool,
    PlacementRequest,
    PoolEventRejected,
    PoolState,
    QueuedTask,
    RdmaNotAllowed,
    Requeue,
    UnknownAllocation,
    UnknownWorkerSpec,
    WaitingQueue,
    capacity,
    custom_gpus_max,
    decide_after_preemption,
    decide_queue_timeout,
    evolve_pool,
    explain,
    fold_pool,
    launchable,
    launchable_by_spec,
    occupancy,
    place,
    plan_queue,
    plan_reschedule,
    plan_spot_reclaim,
    plan_spot_shrink,
    queue_load,
    queue_status,
    release,
    request_for,
    startable_workers,
    timed_out,
    with_place,
    worker_resources,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)
SPECS = (
    WorkerSpec(name="1gpu", gpus=1, cpus=8, memory_gib=64),
    WorkerSpec(name="2gpu", gpus=2, cpus=16, memory_gib=128),
    WorkerSpec(name="4gpu", gpus=4, cpus=32, memory_gib=256),
    WorkerSpec(name="8gpu", gpus=8, cpus=64, memory_gib=512),
)


# --- helpers -----------------------------------------------------------------


def make_pool(
    nodes: int, *, resource_type: ResourceType = "subscription", network: Network = "roce"
) -> PoolState:
    events: list[Event] = [
        PoolRegistered(
            pool_id="pool-a",
            zone="cn-east-1",
            resource_type=resource_type,
            gpu_model="H100",
            network=network,
            specs=SPECS,
        )
    ]
    events += [NodeAdded(node=f"n{i}") for i in range(nodes)]
    return fold_pool(events)


def occupy(
    pool: PoolState,
    task_id: str,
    node: str,
    gpus: int,
    *,
    priority: int = 0,
    resource_type: ResourceType = "subscription",
) -> None:
    """Let a task hold the lowest free `gpus` GPUs of one node."""
    free = pool.nodes[node].free_indexes()[:gpus]
    worker = AllocatedWorker(index=0, node=node, gpus=tuple(free))
    event = WorkersAllocated(
        task_id=task_id,
        run=1,
        attempt=1,
        workers=(worker,),
        priority=priority,
        resource_type=resource_type,
    )
    evolve_pool(pool, event)


def apply(pool: PoolState, events: Iterable[Event]) -> None:
    for event in events:
        evolve_pool(pool, event)


def req(task_id: str, *gpus: int, priority: int = 0, rdma: bool = False) -> PlacementRequest:
    return PlacementRequest(task_id=task_id, worker_gpus=gpus, priority=priority, rdma=rdma)


def queued(
    task_id: str,
    *gpus: int,
    priority: int = 0,
    minute: int = 0,
    spot: SpotOptions | None = None,
    reschedule: bool = False,
) -> QueuedTask:
    at = T0 + timedelta(minutes=minute)
    request = req(task_id, *gpus, priority=priority)
    return QueuedTask(request, at, at, spot=spot, reschedule=reschedule)


def six_free_each(nodes: int = 4) -> PoolState:
    """The SPEC's example: every node has 2 GPUs in use and 6 free."""
    pool = make_pool(nodes)
    for i in range(nodes):
        occupy(pool, f"busy{i}", f"n{i}", 2)
    return pool


def owners_consistent(pool: PoolState) -> None:
    """Every GPU held by exactly the task the allocations say; buckets match the nodes."""
    held: dict[tuple[str, int], str] = {}
    for allocation in pool.allocations.values():
        for worker in allocation.workers:
            for gpu in worker.gpus:
                assert (worker.node, gpu) not in held, "GPU allocated twice"
                held[(worker.node, gpu)] = allocation.task_id
    for node in pool.nodes.values():
        for gpu, owner in enumerate(node.owners):
            assert held.get((node.name, gpu)) == owner
        assert node.free == node.owners.count(None)
        in_bucket = node.name in pool.bucket(node.free)
        assert in_bucket == node.schedulable
    schedulable = [n for n in pool.nodes.values() if n.schedulable]
    allocated = sum(n.gpus - n.free for n in schedulable)
    assert pool.free_gpus + allocated == pool.schedulable_gpus == sum(n.gpus for n in schedulable)


# --- pool events and fold ----------------------------------------------------


def test_pool_events_are_pool_category_and_round_trip_through_the_mapper() -> None:
    mapper = EventMapper(POOL_EVENTS)
    event = WorkersAllocated(
        task_id="t1",
        run=1,
        attempt=2,
        workers=(AllocatedWorker(index=0, node="n0", gpus=(0, 1)),),
        priority=3,
        resource_type="spot",
    )
    assert all(e.category == "pool" and e.__doc__ for e in POOL_EVENTS)
    assert mapper.decode(*mapper.encode(event)) == event


def test_fold_tracks_health_and_keeps_faulty_or_cordoned_nodes_out_of_capacity() -> None:
    pool = make_pool(3)
    apply(pool, [NodeMarkedFaulty(node="n0", reason="GPU 3 dropped"), NodeCordoned(node="n1")])
    assert [pool.nodes[n].health for n in ("n0", "n1", "n2")] == ["faulty", "cordoned", "healthy"]
    assert (launchable(pool, 8), pool.free_gpus) == (1, 8)
    apply(pool, [NodeMarkedHealthy(node="n0"), NodeUncordoned(node="n1"), NodeRemoved(node="n2")])
    assert (launchable(pool, 8), pool.schedulable_nodes) == (2, 2)
    owners_consistent(pool)


def test_fold_rejects_a_gpu_taken_twice_and_unknown_nodes() -> None:
    pool = make_pool(1)
    occupy(pool, "t1", "n0", 2)
    taken = AllocatedWorker(index=0, node="n0", gpus=(1, 2))
    with pytest.raises(PoolEventRejected, match="already held by task t1"):
        evolve_pool(pool, WorkersAllocated(task_id="t2", run=1, attempt=1, workers=(taken,)))
    with pytest.raises(PoolEventRejected, match="no node"):
        evolve_pool(pool, NodeCordoned(node="n9"))
    owners_consistent(pool)


def test_release_of_an_older_attempt_or_twice_is_a_no_op() -> None:
    pool = make_pool(1)
    occupy(pool, "t1", "n0", 8)
    evolve_pool(pool, WorkersReleased(task_id="t1", run=1, attempt=0 + 2, reason="old"))
    assert "t1" in pool.allocations
    apply(pool, [release(pool, "t1", "stopped")] * 2)
    assert pool.free_gpus == 8
    with pytest.raises(UnknownAllocation):
        release(pool, "t1", "stopped")


# --- capacity (R-03, R-04, R-05) --------------------------------------------


def test_launchable_counts_come_from_each_node_not_the_total() -> None:
    pool = six_free_each()
    assert pool.free_gpus == 24
    assert launchable(pool, 8) == 0
    assert launchable(pool, 2) == 12
    assert launchable(pool, 4) == 4
    assert launchable_by_spec(pool) == {"1gpu": 24, "2gpu": 12, "4gpu": 4, "8gpu": 0}
    assert custom_gpus_max(pool) == 6


def test_custom_count_20_is_two_8_gpu_workers_and_one_4_gpu_worker() -> None:
    assert split_custom_gpus(20) == (8, 8, 4)
    pool = make_pool(3)
    spec = TaskSpec(name="c", pool="pool-a", image="img", command="python t.py", custom_gpus=20)
    placement = place(pool, request_for(pool, "t1", spec))
    assert [len(w.gpus) for w in placement.workers] == [8, 8, 4]
    assert len(placement.nodes) == 3


def test_a_worker_gets_the_cpus_and_memory_of_its_spec() -> None:
    """R-02: a named spec's; a custom count's worker those of the spec with its GPUs, else
    the largest spec's per GPU (rounded up); none where the pool defines no spec."""
    pool = make_pool(1)
    named = TaskSpec(name="n", pool="pool-a", image="img", command="x", worker_spec="2gpu")
    assert worker_resources(pool, named, 2) == (16, 128)
    custom = TaskSpec(name="c", pool="pool-a", image="img", command="x", custom_gpus=11)
    assert worker_resources(pool, custom, 8) == (64, 512)
    assert worker_resources(pool, custom, 3) == (24, 192)
    pool.specs = {"8gpu": WorkerSpec(name="8gpu", gpus=8, cpus=30, memory_gib=100)}
    assert worker_resources(pool, custom, 3) == (12, 38)  # 11.25 and 37.5, rounded up
    pool.specs = {}
    assert worker_resources(pool, custom, 3) is None


def test_custom_count_maximum_is_the_largest_count_that_starts_now() -> None:
    pool = make_pool(4)
    occupy(pool, "a", "n2", 3)
    occupy(pool, "b", "n3", 6)
    assert custom_gpus_max(pool) == 8 * 2 + 5
    assert startable_workers(pool, split_custom_gpus(21)) == 3
    assert startable_workers(pool, split_custom_gpus(22)) == 2


def test_capacity_occupancy_and_queue_load() -> None:
    pool = six_free_each(2)
    cap = capacity(pool)
    assert (cap.free_gpus, cap.schedulable_gpus, cap.launchable[8], cap.launchable[2]) == (
        12,
        16,
        0,
        6,
    )
    occ = occupancy(pool)
    assert occ.allocated_gpus == 4
    assert occ.nodes[0].owners[:3] == ("busy0", "busy0", None)
    queue = WaitingQueue()
    queue.add(queued("q1", 8, 8, minute=0))
    queue.add(queued("q2", 4, minute=5))
    load = queue_load(queue, now=T0 + timedelta(minutes=30))
    assert (load.waiting, load.gpus, load.oldest_wait_s) == (2, 20, 1800.0)
    assert [(t.task_id, t.position, t.waited_s) for t in load.tasks] == [
        ("q1", 1, 1800.0),
        ("q2", 2, 1500.0),
    ]


# --- placement (R-06, R-09) ---------------------------------------------------


def test_a_gang_of_4_waits_while_3_could_fit_and_holds_nothing() -> None:
    pool = make_pool(4)
    occupy(pool, "running", "n3", 1)
    before = (pool.bucket_sizes(), pool.free_gpus)
    with pytest.raises(NoCapacity) as caught:
        place(pool, req("gang", 8, 8, 8, 8))
    assert caught.value.can_start == 3
    assert caught.value.retryable
    assert "needs 4 x 8-GPU workers, pool can start 3" in caught.value.message
    assert (pool.bucket_sizes(), pool.free_gpus, set(pool.allocations)) == (*before, {"running"})
    queue = WaitingQueue()
    queue.add(queued("gang", 8, 8, 8, 8))
    plan = plan_queue(pool, queue)
    assert plan.placements == ()
    assert explain(pool, queue, "gang", plan).reason == (
        "needs 4 x 8-GPU workers, pool can start 3; first in queue"
    )


def test_small_workers_fill_partly_used_nodes_and_keep_whole_nodes_whole() -> None:
    pool = make_pool(3)
    occupy(pool, "a", "n1", 5)  # 3 free
    occupy(pool, "b", "n2", 7)  # 1 free
    one = place(pool, req("one", 1))
    assert one.nodes == ("n2",)
    evolve_pool(pool, one.event())
    two = place(pool, req("two", 2))
    assert two.nodes == ("n1",)
    evolve_pool(pool, two.event())
    assert place(pool, req("eight", 8)).nodes == ("n0",)


def test_big_workers_are_placed_first_and_gpus_are_distinct() -> None:
    pool = make_pool(3)
    occupy(pool, "a", "n1", 4)
    placement = place(pool, req("t", 4, 8, 2, 2))
    node = {w.index: w.node for w in placement.workers}
    assert node[1] in ("n0", "n2") and node[0] == "n1"
    assert node[2] == node[3] and node[2] not in (node[0], node[1])
    evolve_pool(pool, placement.event())
    owners_consistent(pool)


def test_rdma_is_refused_on_a_4_gpu_spec() -> None:
    pool = make_pool(2, network="roce")
    with pytest.raises(RdmaNotAllowed) as caught:
        place(pool, req("t", 4, 4, rdma=True))
    assert caught.value.code == "rdma.not_allowed"
    assert "RDMA needs 8-GPU workers on a RoCE/IB pool" in caught.value.hint
    assert "4 GPUs are not 8-GPU workers" in caught.value.message


def test_rdma_is_refused_on_an_ethernet_pool_and_allowed_on_ib_with_8_gpu_workers() -> None:
    with pytest.raises(RdmaNotAllowed, match="network is ethernet"):
        place(make_pool(2, network="ethernet"), req("t", 8, 8, rdma=True))
    assert len(place(make_pool(2, network="ib"), req("t", 8, 8, rdma=True)).workers) == 2


def test_unknown_worker_spec_is_refused_with_the_known_ones() -> None:
    pool = make_pool(1)
    spec = TaskSpec(name="c", pool="pool-a", image="img", command="x", worker_spec="16gpu")
    with pytest.raises(UnknownWorkerSpec, match="16gpu") as caught:
        request_for(pool, "t", spec)
    assert "8gpu" in caught.value.hint


# --- queue and backfill (R-07) -----------------------------------------------


def test_queue_order_is_priority_then_submission_with_reasons_and_positions() -> None:
    pool = make_pool(4)
    for i in (2, 3):
        occupy(pool, f"run{i}", f"n{i}", 1)
    queue = WaitingQueue()
    queue.add(queued("late-urgent", 8, priority=5, minute=9))
    queue.add(queued("early", 8, minute=1))
    queue.add(queued("later", 8, minute=2))
    queue.add(queued("big", 8, 8, 8, 8, minute=3))
    queue.add(queued("latest", 8, minute=4))
    assert [t.task_id for t in queue] == ["late-urgent", "early", "later", "big", "latest"]
    head = queue.head()
    assert head is not None and head.task_id == "late-urgent"
    assert [queue.position(t) for t in ("late-urgent", "big", "latest")] == [1, 4, 5]
    status = {s.task_id: s for s in queue_status(pool, queue)}
    assert status["big"].reason == "needs 4 x 8-GPU workers, pool can start 2; 3 tasks ahead"
    assert (status["big"].position, status["big"].ahead) == (4, 3)


def test_reschedules_go_ahead_of_new_work() -> None:
    queue = WaitingQueue()
    queue.add(queued("new", 8, priority=9))
    queue.add(queued("moved", 8, minute=30, reschedule=True))
    assert [t.task_id for t in queue] == ["moved", "new"]


def test_plan_places_in_order_and_backfill_never_delays_the_head() -> None:
    pool = make_pool(3)
    occupy(pool, "x", "n1", 2)  # n1: 6 free; the head waits for it
    occupy(pool, "y", "n2", 4)  # n2: 4 free
    queue = WaitingQueue()
    queue.add(queued("head", 8, 8, minute=0))
    queue.add(queued("greedy", 6, minute=1))  # fits n1 now, but n1 is what the head waits for
    queue.add(queued("small", 4, minute=2))  # fits n2: backfill
    plan = plan_queue(pool, queue)
    assert [p.task_id for p in plan.placements] == ["small"]
    assert plan.head == "head"
    assert plan.reservation is not None
    assert dict(plan.reservation.nodes) == {"n0": 8, "n1": 6}
    reason = explain(pool, queue, "greedy", plan).reason
    assert "held for the task at the head of the queue" in reason and "1 task ahead" in reason
    assert "task head " not in reason  # the head may be another tenant's: never named
    apply(pool, [p.event() for p in plan.placements])
    queue.remove("small")
    evolve_pool(pool, release(pool, "x", "succeeded"))
    plan = plan_queue(pool, queue)
    assert [p.task_id for p in plan.placements] == ["head"]
    assert set(plan.placements[0].nodes) == {"n0", "n1"}


def test_a_head_that_can_never_start_does_not_block_the_queue() -> None:
    pool = make_pool(2)
    queue = WaitingQueue()
    queue.add(queued("huge", 8, 8, 8))
    queue.add(queued("fits", 8, minute=1))
    plan = plan_queue(pool, queue)
    assert [p.task_id for p in plan.placements] == ["fits"]
    assert plan.reservation is None
    reason = explain(pool, queue, "huge", plan).reason
    assert "could start only 2 even if idle" in reason


def test_a_status_says_why_apart_from_where_and_whether_only_a_person_can_help() -> None:
    """The why (kept in the queue read model) does not move with the place (derived when
    read); `blocked` is the kind of wait that a TaskQueued records when it changes."""
    pool = make_pool(2)
    occupy(pool, "x", "n0", 8)
    queue = WaitingQueue()
    queue.add(queued("huge", 8, 8, 8))
    queue.add(queued("waits", 8, 8, minute=1))
    plan = plan_queue(pool, queue)
    huge, waits = (explain(pool, queue, t, plan) for t in ("huge", "waits"))
    assert huge.blocked and not waits.blocked
    assert waits.why == "needs 2 x 8-GPU workers, pool can start 1"
    assert waits.reason == with_place(waits.why, 1) == f"{waits.why}; 1 task ahead"
    assert huge.reason == with_place(huge.why, 0)
    assert huge.reason.endswith("or choose another pool; first in queue")
    queue.remove("huge")  # the place moves, the why does not
    moved = explain(pool, queue, "waits", plan_queue(pool, queue))
    assert (moved.why, moved.ahead) == (waits.why, 0)
    assert moved.reason.endswith("; first in queue")


def test_plan_does_not_change_pool_or_queue_and_reads_one_task_per_blocked_shape() -> None:
    pool = make_pool(2)
    queue = WaitingQueue()
    for i in range(50):
        queue.add(queued(f"t{i}", 1, minute=i))
    plan = plan_queue(pool, queue)
    assert len(plan.placements) == 16
    assert len(queue) == 50 and pool.free_gpus == 16
    apply(pool, [p.event() for p in plan.placements])
    owners_consistent(pool)


def test_queue_remove_and_re_add_keep_the_index_consistent() -> None:
    queue = WaitingQueue()
    for i in range(200):
        queue.add(queued(f"t{i}", 1 + i % 2, priority=i % 3, minute=i))
    for i in range(0, 200, 3):
        queue.remove(f"t{i}")
    queue.add(queued("t3", 2, priority=9, minute=500))
    order = [t.task_id for t in queue]
    assert order[0] == "t3"
    assert [queue.position(t) for t in order] == list(range(1, len(order) + 1))
    assert queue.gpus == sum(t.request.gpus for t in queue)


# --- spot (R-08) ---------------------------------------------------------------


def spot_pool() -> PoolState:
    """Four spot nodes, all busy: a low-priority pair, a newer low one, a high one."""
    pool = make_pool(4, resource_type="spot")
    occupy(pool, "low-old", "n0", 8, priority=0, resource_type="spot")
    occupy(pool, "high", "n1", 8, priority=5, resource_type="spot")
    occupy(pool, "low-new", "n2", 8, priority=0, resource_type="spot")
    occupy(pool, "mid", "n3", 8, priority=2, resource_type="spot")
    return pool


def test_spot_shrink_preempts_lowest_priority_then_newest_first() -> None:
    pool = spot_pool()
    one = plan_spot_shrink(pool, remove=1)
    assert [p.task_id for p in one.preempted] == ["low-new"]
    assert one.removed_nodes == ("n2",)
    three = plan_spot_shrink(pool, remove=3)
    assert [p.task_id for p in three.preempted] == ["low-new", "low-old", "mid"]
    apply(pool, three.events())
    assert set(pool.nodes) == {"n1"} and set(pool.allocations) == {"high"}
    owners_consistent(pool)


def test_spot_shrink_gives_back_idle_nodes_first_and_spares_needless_victims() -> None:
    pool = make_pool(3, resource_type="spot")
    occupy(pool, "a", "n0", 4, priority=0, resource_type="spot")  # shares n0 with b
    occupy(pool, "b", "n0", 4, priority=3, resource_type="spot")
    occupy(pool, "c", "n1", 4, priority=1, resource_type="spot")
    evolve_pool(pool, NodeMarkedFaulty(node="n2", reason="xid 79"))
    assert plan_spot_shrink(pool, remove=1).preempted == ()
    two = plan_spot_shrink(pool, remove=2)
    # a (lowest) alone empties nothing, so c goes; a is spared again.
    assert [p.task_id for p in two.preempted] == ["c"]
    assert two.removed_nodes == ("n2", "n1")


def test_subscription_tasks_are_never_preempted() -> None:
    with pytest.raises(NotASpotPool):
        plan_spot_shrink(make_pool(2), remove=1)
    pool = make_pool(2, resource_type="spot")
    occupy(pool, "sub", "n0", 8, resource_type="subscription")
    occupy(pool, "spot", "n1", 8, priority=9, resource_type="spot")
    assert [p.task_id for p in plan_spot_shrink(pool, remove=1).preempted] == ["spot"]
    with pytest.raises(InvalidCapacityChange, match="subscription tasks are never preempted"):
        plan_spot_shrink(pool, remove=2)
    with pytest.raises(InvalidCapacityChange):
        plan_spot_shrink(pool, remove=3)


def test_spot_reclaim_of_named_nodes_preempts_the_tasks_on_them() -> None:
    pool = spot_pool()
    shrink = plan_spot_reclaim(pool, ["n1", "n0"])
    assert [p.task_id for p in shrink.preempted] == ["low-old", "high"]
    events = shrink.events("provider reclaimed")
    assert isinstance(events[-1], SpotCapacityChanged)
    assert events[-1].removed == ("n1", "n0")
    apply(pool, events)
    owners_consistent(pool)


def test_preempted_spot_task_is_requeued_until_the_count_limit_then_abnormal() -> None:
    limits = SpotOptions(max_requeues=2, max_queue_duration_s=3600)
    pool = make_pool(1, resource_type="spot")
    requeues, outcome = 0, None
    for _ in range(5):
        occupy(pool, "t", "n0", 8, resource_type="spot")
        shrink = plan_spot_reclaim(pool, ["n0"])
        apply(pool, shrink.events())
        evolve_pool(pool, NodeAdded(node="n0"))  # capacity comes back
        outcome = decide_after_preemption("t", requeues=requeues, limits=limits)
        if isinstance(outcome, Abnormal):
            break
        assert outcome == Requeue("t", requeues + 1)
        requeues = outcome.requeues
    assert requeues == 2
    assert isinstance(outcome, Abnormal)
    assert "max requeue count (2)" in outcome.reason
    assert any("subscription" in step for step in outcome.next_steps)
    assert any(step.startswith("retry") for step in outcome.next_steps)


def test_spot_task_past_its_max_queue_duration_goes_abnormal() -> None:
    limits = SpotOptions(max_requeues=3, max_queue_duration_s=3600)
    queue = WaitingQueue()
    queue.add(queued("spot", 8, spot=limits))
    queue.add(queued("sub", 8))
    queue.add(queued("spot-later", 8, minute=30, spot=limits))
    assert timed_out(queue, T0 + timedelta(minutes=59)) == []
    late = timed_out(queue, T0 + timedelta(minutes=61))
    assert [a.task_id for a in late] == ["spot"]
    assert "max single queue duration (1h00m)" in late[0].reason
    subscription = queue.get("sub")
    assert subscription is not None
    assert decide_queue_timeout(subscription, T0 + timedelta(days=9)) is None
    queue.remove("spot")
    assert [a.task_id for a in timed_out(queue, T0 + timedelta(hours=2))] == ["spot-later"]


# --- reschedule (R-31) -----------------------------------------------------------


def test_reschedule_moves_workers_off_the_faulty_node() -> None:
    pool = make_pool(3)
    gang = place(pool, req("t", 8, 8))
    evolve_pool(pool, gang.event())
    faulty = gang.workers[0].node
    evolve_pool(pool, NodeMarkedFaulty(node=faulty, reason="GPU 5 dropped"))
    moved = plan_reschedule(pool, "t")
    assert moved.placement.attempt == 2
    assert faulty not in moved.placement.nodes
    assert gang.workers[1].node in moved.placement.nodes  # its own healthy GPUs are reused
    apply(pool, moved.events())
    assert pool.allocations["t"].attempt == 2
    owners_consistent(pool)


def test_reschedule_without_a_healthy_node_says_the_task_cannot_be_recovered() -> None:
    pool = make_pool(2)
    occupy(pool, "t", "n0", 8)
    occupy(pool, "other", "n1", 4)
    evolve_pool(pool, NodeMarkedFaulty(node="n0", reason="GPU 2 dropped"))
    with pytest.raises(NoHealthyNode) as caught:
        plan_reschedule(pool, "t")
    assert caught.value.message.startswith("no healthy node can take task t away from n0")
    assert "cannot be recovered" in caught.value.message
    assert caught.value.can_start == 0
    with pytest.raises(UnknownAllocation):
        plan_reschedule(pool, "nobody")


def test_reschedule_honours_extra_excluded_nodes() -> None:
    pool = make_pool(3)
    occupy(pool, "t", "n0", 8)
    moved = plan_reschedule(pool, "t", exclude=["n0", "n2"])
    assert moved.placement.nodes == ("n1",)


# --- properties --------------------------------------------------------------

_SHAPES = st.one_of(
    st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(1, 5)).map(lambda t: (t[0],) * t[1]),
    st.integers(1, 40).map(split_custom_gpus),
)
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("place"), _SHAPES),
        st.tuples(st.just("release"), st.integers(0, 50)),
        st.tuples(st.sampled_from(["fault", "heal", "cordon", "uncordon"]), st.integers(0, 5)),
        st.tuples(st.just("reschedule"), st.integers(0, 50)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_OPS)
def test_no_gpu_is_allocated_twice_and_free_plus_allocated_is_capacity(
    ops: list[tuple[str, tuple[int, ...] | int]],
) -> None:
    pool = make_pool(6)
    for n, (op, arg) in enumerate(ops):
        _run_op(pool, n, op, arg)
        owners_consistent(pool)


def _run_op(pool: PoolState, n: int, op: str, arg: tuple[int, ...] | int) -> None:
    if isinstance(arg, tuple):
        _place_op(pool, f"t{n}", arg)
    elif op in ("release", "reschedule"):
        _release_op(pool, op, arg)
    else:
        node = f"n{arg}"
        events = {
            "fault": NodeMarkedFaulty(node=node, reason="x"),
            "heal": NodeMarkedHealthy(node=node),
            "cordon": NodeCordoned(node=node),
            "uncordon": NodeUncordoned(node=node),
        }
        evolve_pool(pool, events[op])


def _place_op(pool: PoolState, task_id: str, shape: tuple[int, ...]) -> None:
    """Placement succeeds exactly when the count arithmetic says the gang fits."""
    fits = startable_workers(pool, shape) == len(shape)
    try:
        evolve_pool(pool, place(pool, req(task_id, *shape)).event())
        assert fits
    except NoCapacity:
        assert not fits


def _release_op(pool: PoolState, op: str, pick: int) -> None:
    held = sorted(pool.allocations)
    if not held:
        return
    task = held[pick % len(held)]
    if op == "release":
        evolve_pool(pool, release(pool, task, "ended"))
        return
    with contextlib.suppress(NoHealthyNode):
        apply(pool, plan_reschedule(pool, task).events())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(_SHAPES, st.integers(0, 3)), min_size=1, max_size=25))
def test_queue_plan_never_double_books_and_is_as_good_as_placing_the_head(
    tasks: list[tuple[tuple[int, ...], int]],
) -> None:
    pool = make_pool(5)
    occupy(pool, "bg", "n4", 3)
    queue = WaitingQueue()
    for i, (shape, priority) in enumerate(tasks):
        queue.add(queued(f"q{i}", *shape, priority=priority, minute=i))
    plan = plan_queue(pool, queue)
    head = queue.head()
    assert head is not None
    head_fits = startable_workers(pool, head.request.worker_gpus) == len(head.request.worker_gpus)
    assert head_fits == (bool(plan.placements) and plan.placements[0].task_id == head.task_id)
    apply(pool, [p.event() for p in plan.placements])
    owners_consistent(pool)
