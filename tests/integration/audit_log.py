"""A log of several tenants, pools, nodes and actors, built with the pure task domain
and appended to a real Postgres event store, with what each audit filter must find.

The expected answers are computed here in Python from what was appended
(`Appended`), independently of the SQL that derives facets at append.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from runyard.contracts import Event, Metadata, NewEvent, default_mapper
from runyard.contracts.pool_events import AllocatedWorker, NodeCordoned, WorkersAllocated
from runyard.contracts.spec import (
    AlertSubscription,
    EnvVar,
    FaultToleranceOptions,
    SpotOptions,
    TaskSpec,
)
from runyard.contracts.task_events import WorkerPlacement
from runyard.domain import (
    Command,
    ExitWorker,
    Place,
    Preempt,
    Queue,
    ReleaseResources,
    RequestReschedule,
    RequestStop,
    ScheduleRestart,
    StartWorker,
    Submit,
    TaskState,
    decide,
    evolve,
)
from runyard.eventstore import PostgresEventStore
from runyard.eventstore.audit import AuditFilter

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
#: Values that must never leave the store in an audit answer or an export.
SECRET_REF = "sec-0123456789abcdef"
WEBHOOK = "https://open.feishu.cn/open-apis/bot/v2/hook/hook-credential-5f1e"
WEBHOOK_PATH = "/open-apis/bot/v2/hook/hook-credential-5f1e"
SCHEDULER = "service:scheduler"


@dataclass(frozen=True)
class Appended:
    """One appended event and the facts an SRE filters on."""

    position: int
    stream_id: str
    type: str
    actor: str
    at: datetime
    tenant: str | None
    pool: str | None
    task: str | None
    nodes: frozenset[str]


@dataclass
class AuditLog:
    store: PostgresEventStore
    now: datetime = T0
    events: list[Appended] = field(default_factory=list)
    states: dict[str, TaskState] = field(default_factory=dict)
    tasks: dict[str, tuple[str, str]] = field(default_factory=dict)  # task -> (tenant, pool)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def do(self, task: str, command: Command, actor: str) -> list[Event]:
        """Decide `command` on the task's state and append what comes out."""
        self.now += timedelta(minutes=1)
        new = decide(
            self.states.get(task), command, now=self.now, ids=lambda: f"x{next(self._ids)}"
        )
        for event in new:
            self.states[task] = evolve(self.states.get(task), (event, self.now))
        await self._append(f"task-{task}", new, actor, task)
        return new

    async def pool_event(self, pool: str, event: Event, actor: str) -> None:
        self.now += timedelta(minutes=1)
        await self._append(f"pool-{pool}", [event], actor, None)

    async def _append(self, stream: str, new: list[Event], actor: str, task: str | None) -> None:
        meta = Metadata(actor=actor, correlation_id=f"corr-{stream}")
        result = await self.store.append(stream, [NewEvent(e, meta, self.now) for e in new])
        for event, position in zip(new, result.positions, strict=True):
            data = event.model_dump(mode="json")
            about = task or data.get("task_id")
            tenant, pool = self.tasks.get(about or "", (None, None))
            if stream.startswith("pool-"):
                pool = stream.removeprefix("pool-")
            self.events.append(
                Appended(
                    position,
                    stream,
                    event.type_name(),
                    actor,
                    self.now,
                    tenant,
                    pool,
                    about,
                    frozenset(_nodes(data)),
                )
            )

    async def submit(self, task: str, tenant: str, user: str, spec: TaskSpec) -> None:
        self.tasks[task] = (tenant, spec.pool)
        await self.do(task, Submit(task, tenant, f"{tenant}/{user}", spec), f"user:{tenant}/{user}")

    async def place(self, task: str, pool: str, nodes: list[str]) -> None:
        workers = tuple(WorkerPlacement(index=i, node=n, gpus=(0, 1)) for i, n in enumerate(nodes))
        await self.do(task, Place(task, pool, workers), SCHEDULER)
        state = self.states[task]
        allocated = tuple(AllocatedWorker(index=w.index, node=w.node, gpus=w.gpus) for w in workers)
        await self.pool_event(
            pool,
            WorkersAllocated(task_id=task, run=state.run, attempt=state.attempt, workers=allocated),
            SCHEDULER,
        )
        for w in workers:
            await self.do(
                task, StartWorker(task, state.run, state.attempt, w.index), "service:deployer"
            )

    async def release(self, task: str, reason: str) -> None:
        """The workers of the attempt that ended exit, then its GPUs are free."""
        held = self.states[task].held
        assert held is not None
        for w in held.workers:
            await self.do(
                task, ExitWorker(task, held.run, held.attempt, w.index, 137), "service:deployer"
            )
        await self.do(task, ReleaseResources(task, reason), SCHEDULER)

    def expected(self, f: AuditFilter) -> list[int]:
        """Positions an audit query with `f` must answer, computed from `events`."""
        return [e.position for e in self.events if _matches(e, f)]


def _matches(e: Appended, f: AuditFilter) -> bool:
    actor_ok = (
        f.actor is None
        or (f.actor.endswith("*") and e.actor.startswith(f.actor[:-1]))
        or e.actor == f.actor
    )
    return (
        actor_ok
        and (not f.types or e.type in f.types)
        and (f.since is None or e.at >= f.since)
        and (f.until is None or e.at < f.until)
        and (f.tenant is None or e.tenant == f.tenant)
        and (f.pool is None or e.pool == f.pool)
        and (f.node is None or f.node in e.nodes)
        and (f.task is None or e.task == f.task)
    )


def _nodes(data: dict[str, object]) -> set[str]:
    found: set[str] = set()
    if isinstance(data.get("node"), str):
        found.add(str(data["node"]))
    for w in data.get("workers") or []:  # type: ignore[attr-defined]
        found.add(w["node"])
    for key in ("faulty_nodes", "removed", "added"):
        found |= set(data.get(key) or [])  # type: ignore[call-overload]
    return found


def spec(name: str, pool: str, *, spot: bool = False, secret: bool = False) -> TaskSpec:
    return TaskSpec(
        name=name,
        pool=pool,
        worker_spec="8gpu",
        worker_count=2,
        image="registry/train:1",
        command="torchrun train.py",
        resource_type="spot" if spot else "subscription",
        env=(
            EnvVar(name="RUN_ID", value="exp-001"),
            EnvVar(name="HF_TOKEN", creator_only=True, secret_ref=SECRET_REF),
        )
        if secret
        else (),
        alerts=(AlertSubscription(webhook_url=WEBHOOK),) if secret else (),
        fault_tolerance=FaultToleranceOptions(auto_restart=True, max_restarts=3),
        spot=SpotOptions(max_requeues=3) if spot else None,
    )


async def build_log(store: PostgresEventStore) -> AuditLog:
    """Three tasks of two tenants on two pools, with a requeue, a restart, a
    reschedule, two stops by different people, and an admin's cordon."""
    log = AuditLog(store)
    # ta's spot task on a100: placed, preempted and requeued, placed again
    await log.submit("ta-1", "ta", "alice", spec("sweep", "a100", spot=True, secret=True))
    await log.do(
        "ta-1", Queue("ta-1", "needs 2 x 8-GPU workers, pool can start 0", 0, 16, 0), SCHEDULER
    )
    await log.place("ta-1", "a100", ["n1", "n2"])
    await log.do("ta-1", Preempt("ta-1", "spot capacity shrank: n2 left"), SCHEDULER)
    await log.release("ta-1", "preempted")
    await log.place("ta-1", "a100", ["n3", "n1"])
    # tb's task on h100: rescheduled off a faulty node, then stopped by bob
    await log.submit("tb-1", "tb", "bob", spec("pretrain", "h100"))
    await log.do(
        "tb-1", Queue("tb-1", "needs 2 x 8-GPU workers, pool can start 0", 0, 16, 0), SCHEDULER
    )
    await log.place("tb-1", "h100", ["h1", "h2"])
    await log.do(
        "tb-1", RequestReschedule("tb-1", "node h2 is faulty", ("h2",)), "service:faulttolerance"
    )
    await log.release("tb-1", "rescheduled")
    await log.place("tb-1", "h100", ["h1", "h3"])
    await log.pool_event("h100", NodeCordoned(node="h2"), "user:ops/root")
    await log.do("tb-1", RequestStop("tb-1", by="bob", role="member"), "user:tb/bob")
    # ta's task on h100: restarted after a hang, then stopped by a platform admin
    await log.submit("ta-2", "ta", "carol", spec("eval", "h100"))
    await log.do(
        "ta-2", Queue("ta-2", "needs 2 x 8-GPU workers, pool can start 0", 0, 16, 0), SCHEDULER
    )
    await log.place("ta-2", "h100", ["h3", "h4"])
    await log.do("ta-2", ScheduleRestart("ta-2", "hang", 0), "service:faulttolerance")
    await log.do("ta-2", RequestStop("ta-2", by="root", role="platform_admin"), "user:ops/root")
    return log


async def connect(dsn: str) -> PostgresEventStore:
    return await PostgresEventStore.connect(dsn, default_mapper())


@asynccontextmanager
async def built_log(dsn: str) -> AsyncIterator[AuditLog]:
    """The log of `build_log` in the database `dsn`, its store closed afterwards."""
    store = await connect(dsn)
    try:
        yield await build_log(store)
    finally:
        await store.close()
