"""Node admin operations as decisions over a pool's stream (any process may make them).

Adding or removing a node, cordoning it, marking it faulty or healthy (also
how tests inject faults) and changing spot capacity are decisions like a
placement: read `pool-<id>`, fold it with the pure core (`fold_pool`), decide,
and append with the version that was read. A spot shrink also preempts running
spot tasks: their task streams are read and decided with the task domain
(`Preempt` + `ReleaseResources`), and every event goes in ONE `append_many`,
each stream with the version its decision read. A concurrent writer (the
scheduler placing a task, another admin) makes the append fail with
`ConcurrencyError`; the operation then reads again and decides again, so it is
safe from the gateway, the CLI's process or the scheduler itself, and needs no
call to the scheduler process. The scheduler reacts to the pool events it
consumes (it folds them and re-plans its queue) and to the preempted tasks'
events (requeued tasks go back to its queue).

    await cordon_node(store, "dev-a100", "a-1", actor="user:t1/root")

Each function returns an `AdminResult` (pool version after the append, the
events appended, the tasks preempted) and raises typed errors with a code and
a hint: `UnknownPool`, `UnknownNode`, `NodeExists`, `NodeBusy`,
`InvalidAdminRequest` (runyard.scheduler.errors and here), `NotASpotPool`,
`InvalidCapacityChange` (the pure core), `ConflictPersisted` after
`MAX_CONFLICT_RETRIES` conflicts in a row.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent
from runyard.contracts.pool_events import (
    GPUS_PER_NODE,
    NodeAdded,
    NodeCordoned,
    NodeMarkedFaulty,
    NodeMarkedHealthy,
    NodeRemoved,
    NodeUncordoned,
    SpotCapacityChanged,
)
from runyard.contracts.task_events import TaskMarkedAbnormal, TaskRequeued
from runyard.domain.errors import DomainError
from runyard.domain.task import Preempt, ReleaseResources, decide_all, evolve, fold
from runyard.eventstore import (
    AppendRequest,
    ConcurrencyError,
    Decision,
    EventStore,
    PostgresEventStore,
    decide_and_append,
)
from runyard.scheduler.config import pool_stream
from runyard.scheduler.domain import (
    NodeState,
    NotASpotPool,
    PoolState,
    SpotShrink,
    fold_pool,
    plan_spot_shrink,
)
from runyard.scheduler.errors import (
    ConflictPersisted,
    NodeBusy,
    NodeExists,
    SchedulerServiceError,
    UnknownNode,
    UnknownPool,
)

log = logging.getLogger("runyard.scheduler.admin")

#: The actor of admin changes made without a person named (e.g. in-process calls).
ADMIN_ACTOR = "service:scheduler-admin"
#: How often an operation reads and decides again after another writer moved on.
MAX_CONFLICT_RETRIES = 8


class InvalidAdminRequest(SchedulerServiceError, ValueError):
    """The admin request itself is malformed (a bad GPU count, nothing to change, ...)."""

    code = "scheduler.admin_invalid"

    def __init__(self, message: str, hint: str, field: str = "") -> None:
        super().__init__(message, hint, field)


@dataclass(frozen=True, slots=True)
class Preempted:
    """A spot task preempted by a capacity shrink, and what became of it."""

    task_id: str
    #: `requeued`, `abnormal` (past its max requeue count), or `released`
    #: (the task stream refused the preemption, e.g. it had just ended).
    outcome: str
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AdminResult:
    """What an admin operation appended."""

    pool_id: str
    #: The pool stream's version after the append.
    version: int
    #: Types of the pool events appended, in order.
    events: tuple[str, ...]
    node: str | None = None
    preempted: tuple[Preempted, ...] = ()
    removed_nodes: tuple[str, ...] = ()
    added_nodes: tuple[str, ...] = ()
    #: The plan of a spot shrink (None for other operations).
    shrink: SpotShrink | None = None

    def to_dict(self) -> dict[str, Any]:
        """The result as the API answers it."""
        return {
            "pool_id": self.pool_id,
            "version": self.version,
            "events": list(self.events),
            "node": self.node,
            "preempted": [
                {"task_id": p.task_id, "outcome": p.outcome, "nodes": list(p.nodes)}
                for p in self.preempted
            ],
            "removed_nodes": list(self.removed_nodes),
            "added_nodes": list(self.added_nodes),
        }


@dataclass
class _Decision:
    """The events of one admin decision, by stream."""

    pool_events: list[Event]
    #: task id -> (version read, events)
    tasks: dict[str, tuple[int, list[Event]]] = field(default_factory=dict)
    preempted: tuple[Preempted, ...] = ()
    shrink: SpotShrink | None = None


Decide = Callable[[PoolState], Awaitable[_Decision]]


# --- the operations -------------------------------------------------------------


async def add_node(
    store: EventStore,
    pool_id: str,
    node: str,
    gpus: int = GPUS_PER_NODE,
    *,
    actor: str = ADMIN_ACTOR,
    request_id: str | None = None,
    now: datetime | None = None,
) -> AdminResult:
    """Add a healthy node with every GPU free (`NodeExists` if the name is taken)."""
    _check_new_name(node)
    if not 1 <= gpus <= GPUS_PER_NODE:
        raise InvalidAdminRequest(
            f"a node has 1 to {GPUS_PER_NODE} GPUs, not {gpus}", "give the node's GPU count", "gpus"
        )

    async def decide_add(state: PoolState) -> _Decision:
        if node in state.nodes:
            raise NodeExists(f"pool {pool_id} already has node {node!r}", "pick another name")
        return _Decision([NodeAdded(node=node, gpus=gpus)])

    return await _run(store, pool_id, decide_add, _metadata(actor, request_id), now, node=node)


async def remove_node(
    store: EventStore,
    pool_id: str,
    node: str,
    *,
    actor: str = ADMIN_ACTOR,
    request_id: str | None = None,
    now: datetime | None = None,
) -> AdminResult:
    """Remove an idle node (`NodeBusy` while workers run on it)."""
    _check_name(node)

    async def decide_remove(state: PoolState) -> _Decision:
        found = _node(state, pool_id, node)
        busy = tuple(dict.fromkeys(o for o in found.owners if o is not None))
        if busy:
            raise NodeBusy(pool_id, node, busy)
        return _Decision([NodeRemoved(node=node)])

    return await _run(store, pool_id, decide_remove, _metadata(actor, request_id), now, node=node)


async def cordon_node(
    store: EventStore,
    pool_id: str,
    node: str,
    *,
    actor: str = ADMIN_ACTOR,
    request_id: str | None = None,
    now: datetime | None = None,
) -> AdminResult:
    """No new workers go to the node; running ones stay."""
    return await _node_event(
        store, pool_id, node, lambda: NodeCordoned(node=node), actor, request_id, now
    )


async def uncordon_node(
    store: EventStore,
    pool_id: str,
    node: str,
    *,
    actor: str = ADMIN_ACTOR,
    request_id: str | None = None,
    now: datetime | None = None,
) -> AdminResult:
    """The node takes new workers again."""
    return await _node_event(
        store, pool_id, node, lambda: NodeUncordoned(node=node), actor, request_id, now
    )


async def mark_node_faulty(
    store: EventStore,
    pool_id: str,
    node: str,
    reason: str,
    *,
    actor: str = ADMIN_ACTOR,
    request_id: str | None = None,
    now: datetime | None = None,
) -> AdminResult:
    """The node has a hardware fault: nothing new goes there (fault injection in tests).

    Running workers stay allocated; fault tolerance reacts to `NodeMarkedFaulty`
    by asking for their tasks' reschedule (R-31).
    """
    _check_reason(reason, "say what is wrong, e.g. 'GPU 3 fell off the bus'")
    return await _node_event(
        store,
        pool_id,
        node,
        lambda: NodeMarkedFaulty(node=node, reason=reason),
        actor,
        request_id,
        now,
    )


async def mark_node_healthy(
    store: EventStore,
    pool_id: str,
    node: str,
    *,
    actor: str = ADMIN_ACTOR,
    request_id: str | None = None,
    now: datetime | None = None,
) -> AdminResult:
    """The node was repaired."""
    return await _node_event(
        store, pool_id, node, lambda: NodeMarkedHealthy(node=node), actor, request_id, now
    )


async def change_spot_capacity(
    store: EventStore,
    pool_id: str,
    *,
    remove: int = 0,
    add: Sequence[str] = (),
    gpus_per_node: int = GPUS_PER_NODE,
    reason: str = "spot capacity changed",
    actor: str = ADMIN_ACTOR,
    request_id: str | None = None,
    now: datetime | None = None,
) -> AdminResult:
    """Grow a spot pool by the nodes named in `add`, or shrink it by `remove` nodes (R-08).

    A shrink asks `plan_spot_shrink` (idle nodes first, then running spot tasks
    lowest priority, newest first): one append holds, on the pool, a
    `WorkersReleased` per victim and the `SpotCapacityChanged`, and on each
    victim's stream `TaskPreempted` + (`TaskRequeued`, or `TaskMarkedAbnormal`
    past its max requeue count) + `ResourcesReleased`.
    """
    added = tuple(add)
    if bool(remove) == bool(added):
        raise InvalidAdminRequest(
            "give either a number of nodes to remove or names of nodes to add",
            "e.g. remove 2, or add ['s-9', 's-10']",
            "remove",
        )
    if remove < 0:
        raise InvalidAdminRequest(
            f"cannot remove {remove} nodes", "give a positive number of nodes", "remove"
        )
    if len(set(added)) != len(added):
        raise InvalidAdminRequest(
            "node names to add must be distinct", "name each node once", "add"
        )
    for name in added:
        _check_new_name(name, "add")
    if not 1 <= gpus_per_node <= GPUS_PER_NODE:
        raise InvalidAdminRequest(
            f"a node has 1 to {GPUS_PER_NODE} GPUs, not {gpus_per_node}",
            "give the nodes' GPU count",
            "gpus_per_node",
        )
    _check_reason(reason, "say why capacity changes, e.g. 'provider reclaimed nodes'")
    when = now or datetime.now(UTC)

    async def decide_grow(state: PoolState) -> _Decision:
        if state.resource_type != "spot":
            raise NotASpotPool(pool_id)
        taken = [n for n in added if n in state.nodes]
        if taken:
            raise NodeExists(
                f"pool {pool_id} already has nodes {', '.join(taken)}", "pick other names"
            )
        change = SpotCapacityChanged(added=added, gpus_per_node=gpus_per_node, reason=reason)
        return _Decision([change])

    async def decide_shrink(state: PoolState) -> _Decision:
        shrink = plan_spot_shrink(state, remove=remove)
        decision = _Decision(shrink.events(reason), shrink=shrink)
        preempted = []
        for victim in shrink.preempted:
            outcome = "released"
            stream = await store.read_stream(f"task-{victim.task_id}")
            if stream:
                task = fold(stream, task_id=victim.task_id)
                try:
                    preempt = Preempt(victim.task_id, f"spot capacity reclaimed: {reason}")
                    events = decide_all(task, [preempt], now=when, ids=_no_ids)
                    after = task
                    for event in events:
                        after = evolve(after, (event, when))
                    if not after.held_live:
                        release = ReleaseResources(victim.task_id, "preempted")
                        events += decide_all(after, [release], now=when, ids=_no_ids)
                    # else: workers of the attempt still run; the task's GPUs are released
                    # once the deployer has ended them and recorded their exits
                except DomainError as exc:  # it ended meanwhile: its GPUs go back anyway
                    log.info("not preempting %s: %s", victim.task_id, exc)
                else:
                    decision.tasks[victim.task_id] = (task.version, events)
                    if any(isinstance(e, TaskMarkedAbnormal) for e in events):
                        outcome = "abnormal"
                    elif any(isinstance(e, TaskRequeued) for e in events):
                        outcome = "requeued"
            preempted.append(Preempted(victim.task_id, outcome, victim.nodes))
        decision.preempted = tuple(preempted)
        return decision

    return await _run(
        store,
        pool_id,
        decide_shrink if remove else decide_grow,
        _metadata(actor, request_id),
        when,
    )


# --- reading, deciding, appending ------------------------------------------------


async def load_pool(store: EventStore, pool_id: str) -> tuple[PoolState, int]:
    """The pool's state folded from its stream, and the stream's version (`UnknownPool`)."""
    _check_name(pool_id, "pool_id")
    return await _pool_of(store, pool_id, await store.read_stream(pool_stream(pool_id)))


async def _pool_of(
    store: EventStore, pool_id: str, recorded: Sequence[RecordedEvent[Event]]
) -> tuple[PoolState, int]:
    if not recorded:
        raise UnknownPool(pool_id, await known_pools(store))
    return fold_pool(r.event for r in recorded), recorded[-1].stream_version


async def known_pools(store: EventStore, limit: int = 50) -> tuple[str, ...]:
    """Ids of pools that have a stream (first `limit`; () when the store cannot list)."""
    if not isinstance(store, PostgresEventStore):
        return ()
    rows = await store.pool.fetch(
        "SELECT stream_id FROM streams WHERE stream_id LIKE 'pool-%' ORDER BY 1 LIMIT $1", limit
    )
    return tuple(r["stream_id"].removeprefix("pool-") for r in rows)


async def _node_event(
    store: EventStore,
    pool_id: str,
    node: str,
    make: Callable[[], Event],
    actor: str,
    request_id: str | None,
    now: datetime | None,
) -> AdminResult:
    _check_name(node)

    async def decide_node(state: PoolState) -> _Decision:
        _node(state, pool_id, node)
        return _Decision([make()])

    return await _run(store, pool_id, decide_node, _metadata(actor, request_id), now, node=node)


async def _run(
    store: EventStore,
    pool_id: str,
    decide_pool: Decide,
    metadata: Metadata,
    now: datetime | None,
    *,
    node: str | None = None,
) -> AdminResult:
    """Read, decide, append with the versions read; on a conflict, all again."""
    _check_name(pool_id, "pool_id")

    async def decide(recorded: list[RecordedEvent[Event]]) -> Decision[AdminResult]:
        state, version = await _pool_of(store, pool_id, recorded)
        decision = await decide_pool(state)
        when = now or datetime.now(UTC)
        preempted = [
            AppendRequest(f"task-{task_id}", [NewEvent(e, metadata, when) for e in events], read)
            for task_id, (read, events) in decision.tasks.items()
        ]
        return Decision(
            _result(pool_id, version, decision, node),
            events=[NewEvent(e, metadata, when) for e in decision.pool_events],
            others=preempted,
        )

    def conflict(exc: ConcurrencyError) -> None:
        log.info("admin change of pool %s met a conflict on %s", pool_id, exc.stream_id)

    def give_up(exc: ConcurrencyError) -> ConflictPersisted:
        return ConflictPersisted(
            f"pool {pool_id} kept changing: gave up after {MAX_CONFLICT_RETRIES} conflicts",
            "try again",
        )

    return await decide_and_append(
        store,
        pool_stream(pool_id),
        decide,
        attempts=MAX_CONFLICT_RETRIES,
        on_conflict=conflict,
        give_up=give_up,
    )


def _result(pool_id: str, version: int, decision: _Decision, node: str | None) -> AdminResult:
    removed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    for event in decision.pool_events:
        if isinstance(event, SpotCapacityChanged):
            removed, added = event.removed, event.added
    return AdminResult(
        pool_id=pool_id,
        version=version + len(decision.pool_events),
        events=tuple(e.type_name() for e in decision.pool_events),
        node=node,
        preempted=decision.preempted,
        removed_nodes=removed,
        added_nodes=added,
        shrink=decision.shrink,
    )


def _no_ids() -> str:
    raise RuntimeError("admin decisions never create ids")


def _metadata(actor: str, request_id: str | None) -> Metadata:
    return Metadata(actor=actor, causation_id=request_id, correlation_id=request_id)


def _node(state: PoolState, pool_id: str, node: str) -> NodeState:
    found = state.nodes.get(node)
    if found is None:
        raise UnknownNode(pool_id, node)
    return found


def _check_name(node: str, field: str = "node") -> None:
    """A pool id or node name the store and the API can carry."""
    if not node.strip() or "/" in node or any(ord(c) < 32 for c in node):
        raise InvalidAdminRequest(
            f"invalid {field} {node!r}",
            "use a non-empty name without '/' or control characters",
            field,
        )


#: A new node's name: a host name. Slurm (a pool's NodeNames, `--nodelist`) reads ',',
#: '[...]' and spaces as several nodes, and the CLI's `--add a,b` splits at commas.
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _check_new_name(node: str, field: str = "node") -> None:
    """A name for a node to add: `_check_name`, and a host name."""
    _check_name(node, field)
    if not _HOST_NAME.fullmatch(node):
        raise InvalidAdminRequest(
            f"invalid {field} {node!r}: a node's name is its host name",
            "use letters, digits, '.', '_' and '-' (starting with a letter or digit, at most "
            "128); Slurm would read ',', '[', ']' or a space in a node list as several nodes",
            field,
        )


def _check_reason(reason: str, hint: str) -> None:
    if not reason.strip() or "\x00" in reason:
        raise InvalidAdminRequest(
            "a reason is needed (text without NUL characters)", hint, "reason"
        )
