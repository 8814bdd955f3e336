"""The scheduler's application layer: the pure core, driven by the event log.

State. For each pool it manages, the scheduler keeps in memory the pool's
state (a fold of `pool-<id>`, with its stream version), the pool's
`WaitingQueue`, and the last queue plan; and, for each open task of its pools,
the task's state (a fold of `task-<id>`, with its version). `start()` rebuilds
all of it from the log; afterwards every event it sees is folded only if its
stream version is the next one (older ones were already folded; a gap means
another writer moved on, and the stream is read again from the store).

Decisions. Every decision reads the memory, calls the pure core
(`runyard.scheduler.domain` for pools, `runyard.domain.task.decide` for task
streams, so the rules live in one place) and appends all the resulting events
in ONE `append_many`, each stream with the version the decision read. A
placement is `WorkersAllocated` on the pool and `TaskPlaced` on the task in
one transaction: two schedulers (or two decisions) can never take the same
GPU, because the second append finds the pool stream moved on
(`ConcurrencyError`); it then reads what changed and decides again. Memory is
folded only after the append committed. An append that fails otherwise (the
database went away mid-call) may have committed all the same: its streams are
read back before the next decision (`_settle`), so memory, and the views
written from it, never stay behind the log after an outage.

Reactions (by the task's state after the event, so a redelivered or replayed
event changes nothing):

- new or queued (submitted, rerun, requeued): into the pool's queue, then a
  placement pass;
- being rescheduled (placement withdrawn, GPUs still held): `plan_reschedule`
  on the pool, or `TaskRescheduleFailed` + `TaskFailed` when no healthy node
  can take the gang;
- a stop requested while it holds no workers: `TaskStopped`;
- finished (succeeded, failed, stopped, abnormal): `WorkersReleased` +
  `ResourcesReleased`, out of the queue, and a placement pass at once.

A placement pass places what `plan_queue` allows (backfill behind the head),
then explains the first `status_window` tasks of the queue and the new
arrivals (at most `max_reports` per pass; the rest are explained by later
passes). What changed goes to the queue read model (`scheduler_queue`, written
with the pool views, in the consumer's transaction); `TaskQueued` is appended
only when a wait starts or changes kind (blocked or not), never for a new
position or reason, which are derived data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

import asyncpg
from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent
from runyard.contracts.pool_events import GPUS_PER_NODE
from runyard.contracts.spec import SpotOptions, TaskSpec
from runyard.contracts.task_events import (
    TaskRerunRequested,
    TaskRescheduleRequested,
    WorkerPlacement,
)
from runyard.domain.errors import DomainError
from runyard.domain.task import (
    Command,
    ConfirmStop,
    Fail,
    FailReschedule,
    MarkAbnormal,
    Place,
    Queue,
    ReleaseResources,
    TaskState,
    decide,
    decide_all,
    evolve,
    next_attempt,
)
from runyard.eventstore import (
    EVENT_COLUMNS,
    NO_STREAM,
    AppendRequest,
    ConcurrencyError,
    PostgresAllReader,
    PostgresEventStore,
    remember_last,
)
from runyard.scheduler import admin
from runyard.scheduler.admin import AdminResult
from runyard.scheduler.config import PoolConfig, pool_stream
from runyard.scheduler.domain import (
    Abnormal,
    InvalidRequest,
    NoHealthyNode,
    Placement,
    PoolState,
    QueuedTask,
    QueuePlan,
    SpotShrink,
    WaitingQueue,
    check_request,
    evolve_pool,
    explain,
    plan_queue,
    plan_reschedule,
    queue_status,
    release,
    request_for,
    timed_out,
    worker_resources,
)
from runyard.scheduler.errors import AppendRefused, ConflictPersisted, UnknownPool
from runyard.scheduler.views import (
    QueueRow,
    build_view,
    ensure_schema,
    queue_row,
    read_queue_rows,
    replace_queue_rows,
    write_queue_rows,
    write_view,
)

log = logging.getLogger("runyard.scheduler")

ACTOR = "service:scheduler"
#: How often a decision is retried after another writer moved its streams on.
MAX_CONFLICT_RETRIES = 8
#: How many finished tasks of our pools, and how many tasks of other pools, memory
#: keeps (the most recently seen): a forgotten one is read from its stream again
#: at its next event, and found finished (or another pool's) again.
REMEMBERED = 10_000
#: Events the sweep reads from the log per query, and a start per cursor fetch.
SWEEP_BATCH = 2_000
LOAD_BATCH = 2_000

T = TypeVar("T")
Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _no_ids() -> str:
    raise RuntimeError("scheduler decisions never create ids")


def task_stream(task_id: str) -> str:
    """The stream id of a task."""
    return f"task-{task_id}"


@dataclass
class PoolRuntime:
    """One pool in memory: its folded state and version, its queue, its last plan."""

    state: PoolState
    version: int = 0
    queue: WaitingQueue = field(default_factory=WaitingQueue)
    plan: QueuePlan | None = None
    #: Queued tasks not explained yet in their current wait (no TaskQueued, no row).
    unreported: dict[str, None] = field(default_factory=dict)
    #: Queue read-model rows as last written, rows to write at the next flush, tasks
    #: that left the queue since (their rows go), and tasks whose rows were written
    #: in a transaction that may yet roll back (checked by the next tick).
    rows: dict[str, QueueRow] = field(default_factory=dict)
    pending: dict[str, QueueRow] = field(default_factory=dict)
    left: set[str] = field(default_factory=set)
    unconfirmed: set[str] = field(default_factory=set)
    #: Rescheduled tasks' nodes to avoid, from their TaskRescheduleRequested.
    exclude: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def pool_id(self) -> str:
        return self.state.pool_id

    def dequeue(self, task_id: str) -> None:
        """The task leaves the queue (placed, stopped, finished, gone elsewhere)."""
        self.queue.remove(task_id)
        self.unreported.pop(task_id, None)
        self.left.add(task_id)

    def queue_changes(self) -> tuple[list[QueueRow], list[str]]:
        """(rows to upsert, task ids whose rows go) since the last flush."""
        rows = [row for task_id, row in self.pending.items() if task_id in self.queue]
        fresh = {row.task_id for row in rows}
        return rows, sorted(t for t in self.left if t not in fresh)

    def queue_written(self, rows: list[QueueRow], gone: list[str]) -> None:
        """The changes were written (their transaction may still roll back: see
        `unconfirmed`); they are what the table holds from now on."""
        for task_id in gone:
            self.rows.pop(task_id, None)
        self.rows.update((row.task_id, row) for row in rows)
        self.unconfirmed.update(gone)
        self.unconfirmed.update(row.task_id for row in rows)
        self.pending.clear()
        self.left.clear()

    def queue_stored(self, stored: dict[str, QueueRow]) -> None:
        """Compare the unconfirmed rows with what the table holds (`stored`, read back
        for those tasks) and write again whatever a rolled-back transaction lost."""
        for task_id in self.unconfirmed:
            expected = self.rows.get(task_id)
            if stored.get(task_id) == expected:
                continue
            if expected is None:
                self.left.add(task_id)
            else:
                self.pending[task_id] = expected
        self.unconfirmed.clear()


@dataclass
class _Decision:
    """Events of one decision, by stream, to append in one transaction."""

    pool_id: str | None = None
    pool_events: list[Event] = field(default_factory=list)
    tasks: dict[str, list[Event]] = field(default_factory=dict)

    def add_task(self, task_id: str, events: Iterable[Event]) -> None:
        self.tasks.setdefault(task_id, []).extend(events)

    @property
    def empty(self) -> bool:
        return not self.pool_events and not any(self.tasks.values())


#: Task events that never change what the scheduler must do: deploy progress,
#: checks, detections, alerts, and what it appended itself (already folded when
#: it committed). The consumer skips them before any database work; a later
#: event the scheduler does need finds its state a few versions behind and
#: reloads the stream (`_sync_task`). `WorkerExited` is not among them: the exits
#: of the workers of an attempt that is over (preempted, rescheduled, restarted, or
#: its run failed) free its GPUs (`held_live`).
IGNORED = frozenset(
    {
        "DeployStageStarted",
        "DeployStageCompleted",
        "EnvCheckStarted",
        "EnvCheckItemReported",
        "EnvCheckFinished",
        "WorkerStarted",
        "TaskRunning",
        "HangDetected",
        "StacksCaptured",
        "SlowdownDetected",
        "ResumeObserved",
        "ResumeNotObserved",
        "AlertDelivered",
        "AlertFailed",
        "TaskQueued",
        "TaskPlaced",
        "ResourcesReleased",
    }
)


@dataclass(frozen=True)
class _Sighting:
    """An event of a task stream, as the sweep found it in the log (the task and
    the event's version in its stream name it)."""

    task_id: str
    version: int
    #: `<type> v<version> at <occurred at>`, for the log.
    what: str = field(compare=False)


class SchedulerApp:
    """The scheduler service's state and decisions; see the module docstring."""

    def __init__(
        self,
        store: PostgresEventStore,
        pools: Sequence[PoolConfig],
        *,
        clock: Clock = _utcnow,
        status_window: int = 1000,
        max_reports: int = 1000,
        batch_size: int = 500,
        write_views: bool = True,
        sweep_s: float = 15.0,
    ) -> None:
        self.store = store
        self.configs = {p.pool_id: p for p in pools}
        self.clock = clock
        self.status_window = status_window
        self.max_reports = max_reports
        self.batch_size = batch_size
        self.write_views = write_views
        self.pools: dict[str, PoolRuntime] = {}
        self.tasks: dict[str, TaskState] = {}
        #: The last REMEMBERED finished tasks of our pools (version seen), and tasks of
        #: other pools, oldest first.
        self._done: dict[str, int] = {}
        self._foreign: dict[str, None] = {}
        self._dirty: set[str] = set()
        #: Pools whose view rows were last written inside a consumer batch's transaction,
        #: which may yet roll back (an outage): the next tick writes them again.
        self._views_unconfirmed: set[str] = set()
        #: Streams of an append whose outcome is unknown (the store failed mid-call: it
        #: may have committed). Memory may be behind them; read before deciding again.
        self._unsure: set[str] = set()
        self._lock = asyncio.Lock()
        #: Per task, the metadata of the last event seen on its stream, so what the
        #: scheduler writes for a task names its cause and keeps its correlation (R-62).
        self._causes: dict[str, Metadata] = {}
        self._cause: Metadata | None = None
        #: When set, `handle` leaves planning to `after_batch` (see there).
        self.defer_planning = False
        self._replan: set[str] = set()
        #: Anti-entropy (`sweep`): how often, when last, the log read so far (from the
        #: start of the term), the events found not folded then, and those read by
        #: this sweep so far (kept when a sweep fails midway, an outage: the log is
        #: read on from where it stopped).
        self.sweep_s = sweep_s
        self._swept_at: datetime | None = None
        self._swept: PostgresAllReader | None = None
        self._unseen: set[_Sighting] = set()
        self._fresh: list[_Sighting] = []

    # -- start -------------------------------------------------------------------

    async def start(self) -> None:
        """Create the read model, register configured pools, rebuild memory, plan once."""
        await ensure_schema(self.store.pool)
        async with self._lock:
            for config in self.configs.values():
                await self._register(config)
                self.pools[config.pool_id] = await self._load_pool(config.pool_id)
        await self.rebuild()

    async def rebuild(self, *, plan: bool = True) -> None:
        """Fold the task streams of our pools again and act on them (a start after a crash).

        With `plan` false the queues are filled but nothing is placed yet.
        """
        async with self._lock:
            # The sweep reads the log from here: what comes before is folded below. It
            # starts SWEEP_BATCH positions back, so that an append still committing
            # behind the head (its position taken, not yet visible to the fold) is
            # swept too; what it reads again of those positions is folded already.
            head = await self.store.head_position()
            self._swept = self.store.all_reader(max(0, head - SWEEP_BATCH))
            self._fresh = []
            await self._load_tasks()
            now = self.clock()
            for task in list(self.tasks.values()):
                await self._retrying(partial(self._reconcile, task.task_id, now), [])
            for runtime in self.pools.values():
                if plan:
                    await self._pass(runtime, now)
                await self._rebuild_queue_rows(runtime)
            await self._flush_views(None)

    async def load_from_log(
        self, pool_ids: Iterable[str], task_streams: Sequence[str] | None = None
    ) -> int:
        """Memory as a start builds it from the log, deciding nothing: the pools' streams
        and every task stream folded, the queues filled, each pool's plan made. For a
        shadow rebuild of the read models (`runyard.scheduler.rebuild`), over a store
        that refuses appends; returns how many tasks a start would have acted on (an
        append refused), which the log does not show done yet. With `task_streams`, only
        those task streams are folded (a superset of the pools' tasks will do)."""
        for pool_id in pool_ids:
            self.pools[pool_id] = await self._load_pool(pool_id)
        await self._load_tasks(task_streams)
        now = self.clock()
        pending = 0
        for task_id in list(self.tasks):
            try:
                await self._reconcile(task_id, now)
            except AppendRefused:
                pending += 1
        for runtime in self.pools.values():
            runtime.plan = plan_queue(runtime.state, runtime.queue, max_placements=self.batch_size)
        return pending

    async def _rebuild_queue_rows(self, runtime: PoolRuntime) -> None:
        """Write the pool's queue read model afresh from memory (after a rebuild)."""
        runtime.pending.clear()
        runtime.left.clear()
        runtime.unconfirmed.clear()
        if not self.write_views:
            return
        rows = self.queue_rows(runtime.pool_id)
        async with self.store.pool.acquire() as conn, conn.transaction():
            await replace_queue_rows(conn, runtime.pool_id, rows)
        runtime.rows = {row.task_id: row for row in rows}

    async def place(self, pool_id: str, *, limit: int | None = None) -> int:
        """Run a placement pass on the pool now (at most `limit` placements); placements made."""
        async with self._turn():
            placed = await self._pass(self._runtime(pool_id), self.clock(), limit=limit)
            await self._flush_views(None)
            return placed

    async def _register(self, config: PoolConfig) -> None:
        stream = pool_stream(config.pool_id)
        if await self.store.stream_version(stream):
            return
        now = self.clock()
        # the operator's configuration is the cause: the root of the pool's chain
        root = f"config:pools/{config.pool_id}"
        meta = Metadata(actor=ACTOR, causation_id=root, correlation_id=root)
        events = [
            NewEvent(event, meta, now, event_id=event_id)
            for event_id, event in config.registration()
        ]
        try:
            await self.store.append(stream, events, NO_STREAM)
        except ConcurrencyError:
            log.info("pool %s was registered by another scheduler", config.pool_id)

    async def _load_pool(self, pool_id: str) -> PoolRuntime:
        runtime = PoolRuntime(PoolState())
        for recorded in await self.store.read_stream(pool_stream(pool_id)):
            evolve_pool(runtime.state, recorded.event)
            runtime.version = recorded.stream_version
        self._dirty.add(pool_id)
        return runtime

    async def _load_tasks(self, streams: Sequence[str] | None = None) -> None:
        """Fold every task stream (or `streams`); keep the open tasks of our pools.

        The rows come through a cursor, one stream after another, so what the fold
        holds at once is one task's state, whatever the length of the log."""
        columns = f"SELECT {EVENT_COLUMNS}"
        order = " ORDER BY stream_id, stream_version"
        if streams is None:
            query, args = columns + " FROM events WHERE stream_id LIKE 'task-%'" + order, []
        else:
            query = columns + " FROM events WHERE stream_id = ANY($1::text[])" + order
            args = [list(streams)]
        state: TaskState | None = None
        last: RecordedEvent[Event] | None = None
        async with self.store.pool.acquire() as conn, conn.transaction(readonly=True):
            async for row in conn.cursor(query, *args, prefetch=LOAD_BATCH):
                recorded = self.store.decode(row)
                if last is not None and recorded.stream_id != last.stream_id:
                    if state is not None:
                        self._keep_loaded(state, last)
                    state = None
                state, last = self._fold_task(state, recorded), recorded
        if state is not None and last is not None:
            self._keep_loaded(state, last)

    def _keep_loaded(self, state: TaskState, last: RecordedEvent[Event]) -> None:
        """Where a task folded from the log at the start belongs in memory (an open
        one with its last event as the cause of what the scheduler writes for it)."""
        if state.spec.pool not in self.pools:
            self._remember_foreign(state.task_id)
        elif state.finished and state.held is None:
            self._remember_done(state.task_id, state.version)
        else:
            self.tasks[state.task_id] = state
            self._note_cause(state.task_id, last)

    def _note_cause(self, task_id: str, recorded: RecordedEvent[Event]) -> None:
        """What the scheduler writes next for the task names `recorded` as its cause and
        keeps its correlation (R-62), whichever path read it: the consumer, a start's
        fold of the log, or a read of the stream (a sweep, an append's conflict)."""
        self._causes[task_id] = recorded.metadata.caused_by(recorded, ACTOR)

    def _remember_done(self, task_id: str, version: int) -> None:
        remember_last(self._done, task_id, version, REMEMBERED)

    def _remember_foreign(self, task_id: str) -> None:
        remember_last(self._foreign, task_id, None, REMEMBERED)

    # -- reacting to events --------------------------------------------------------

    async def handle(
        self, event: RecordedEvent[Event], conn: asyncpg.Connection | None = None
    ) -> None:
        """React to one task or pool event (the IdempotentConsumer's handler).

        The view rows of changed pools are written on `conn` when given, so they
        commit with the consumer's inbox row.
        """
        if event.type in IGNORED:
            return
        async with self._turn():
            now = self.clock()
            self._cause = event.metadata.caused_by(event, ACTOR)
            if event.stream_id.startswith("task-"):
                self._causes[event.stream_id.removeprefix("task-")] = self._cause
            if event.stream_id.startswith("pool-"):
                await self._on_pool_event(event, now)
            elif event.stream_id.startswith("task-"):
                await self._on_task_event(event, now)
            if not self.defer_planning:
                await self._flush_views(conn)

    async def after_batch(self, conn: asyncpg.Connection | None = None) -> None:
        """End of a consumer batch: plan every pool the batch touched, once, and
        write their views (with `defer_planning`, `handle` only records them).
        One pass places many tasks in one append instead of one append each."""
        async with self._turn():
            now = self.clock()
            while self._replan:
                await self._pass(self.pools[self._replan.pop()], now)
            await self._flush_views(conn)

    async def _plan(self, runtime: PoolRuntime, now: datetime) -> None:
        if self.defer_planning:
            self._replan.add(runtime.pool_id)
        else:
            await self._pass(runtime, now)

    async def _on_pool_event(self, event: RecordedEvent[Event], now: datetime) -> None:
        runtime = self.pools.get(event.stream_id.removeprefix("pool-"))
        if runtime is None or event.stream_version <= runtime.version:
            return
        await self._refresh_pool(runtime)
        await self._plan(runtime, now)

    async def _on_task_event(self, event: RecordedEvent[Event], now: datetime) -> None:
        task_id = event.stream_id.removeprefix("task-")
        if not await self._sync_task(task_id, event):
            return
        pool_id = await self._retrying(lambda: self._reconcile(task_id, now), [])
        if pool_id is not None:
            await self._plan(self.pools[pool_id], now)

    async def _sync_task(self, task_id: str, event: RecordedEvent[Event]) -> bool:
        """Fold the event into the task's state; False when there is nothing new for us."""
        if task_id in self._foreign:
            return False
        done = self._done.get(task_id)
        if done is not None:
            if not isinstance(event.event, TaskRerunRequested) or event.stream_version <= done:
                self._done[task_id] = max(done, event.stream_version)
                return False
            del self._done[task_id]
        known = self.tasks.get(task_id)
        if known is not None and event.stream_version <= known.version:
            return False
        if known is not None and event.stream_version == known.version + 1:
            self.tasks[task_id] = self._fold_task(known, event)
        else:
            await self._refresh_task(task_id)
        state = self.tasks.get(task_id)
        if state is not None and state.spec.pool not in self.pools:
            del self.tasks[task_id]
            self._causes.pop(task_id, None)
            self._remember_foreign(task_id)
            return False
        return state is not None

    def _fold_task(self, state: TaskState | None, recorded: RecordedEvent[Event]) -> TaskState:
        event = recorded.event
        if isinstance(event, TaskRescheduleRequested) and state is not None:
            runtime = self.pools.get(state.spec.pool)
            if runtime is not None:
                runtime.exclude[state.task_id] = event.faulty_nodes
        return evolve(state, recorded)

    async def _reconcile(self, task_id: str, now: datetime) -> str | None:
        """Do what the task's state asks of the scheduler; the pool to re-plan, if any."""
        state = self.tasks.get(task_id)
        if state is None:
            return None
        if state.held_live:
            # An attempt that is over (preempted, rescheduled, restarted, failed) still has
            # running workers: nothing of the task is released, moved or placed again
            # until the deployer has recorded their exits; the last WorkerExited brings
            # the task back here. (A restart in place keeps its placement and allocation.)
            return None
        runtime = self.pools[state.spec.pool]
        if state.finished:
            await self._finish(runtime, state, now)
        elif state.stop_requested and state.placement is None:
            runtime.dequeue(task_id)
            await self._decide_and_commit(runtime, state, [ConfirmStop(task_id)], now)
            await self._finish(runtime, self.tasks[task_id], now)
        elif state.status == "restarting" and state.placement is None:
            await self._reschedule(runtime, state, now)
        elif state.status in ("new", "queued") and task_id not in runtime.queue:
            await self._enqueue(runtime, state, now)
        else:
            return None
        return runtime.pool_id

    async def _finish(self, runtime: PoolRuntime, state: TaskState, now: datetime) -> None:
        """Give back what a finished task holds and forget it."""
        runtime.dequeue(state.task_id)
        runtime.exclude.pop(state.task_id, None)
        decision = _Decision(runtime.pool_id)
        reason = f"task {state.status}"
        if state.task_id in runtime.state.allocations:
            decision.pool_events.append(release(runtime.state, state.task_id, reason))
        if state.held is not None:
            decision.add_task(
                state.task_id, self._decide(state, [ReleaseResources(state.task_id, reason)], now)
            )
        await self._commit(decision, now)
        final = self.tasks.pop(state.task_id)
        self._causes.pop(state.task_id, None)
        self._remember_done(state.task_id, final.version)
        self._dirty.add(runtime.pool_id)

    async def _enqueue(self, runtime: PoolRuntime, state: TaskState, now: datetime) -> None:
        """Put a new or requeued task into its pool's queue (failing it if it can never run)."""
        if state.held is not None:
            await self._release_held(runtime, state, now)
            state = self.tasks[state.task_id]
        try:
            request = request_for(
                runtime.state, state.task_id, state.spec, run=state.run, attempt=next_attempt(state)
            )
            check_request(runtime.state, request)
        except InvalidRequest as exc:
            reason = f"cannot run in pool {runtime.pool_id}: {exc}"
            await self._decide_and_commit(runtime, state, [Fail(state.task_id, reason)], now)
            await self._finish(runtime, self.tasks[state.task_id], now)
            return
        spot = (state.spec.spot or SpotOptions()) if state.spec.resource_type == "spot" else None
        queued = QueuedTask(
            request=request,
            submitted_at=state.submitted_at,
            queued_at=state.queued_at or now,
            spot=spot,
            requeues=state.requeues,
        )
        runtime.queue.add(queued)
        runtime.unreported[state.task_id] = None
        self._dirty.add(runtime.pool_id)

    async def _release_held(self, runtime: PoolRuntime, state: TaskState, now: datetime) -> None:
        """Release GPUs a task still holds from an earlier run before it queues again."""
        decision = _Decision(runtime.pool_id)
        if state.task_id in runtime.state.allocations:
            decision.pool_events.append(release(runtime.state, state.task_id, "new run"))
        decision.add_task(
            state.task_id, self._decide(state, [ReleaseResources(state.task_id, "new run")], now)
        )
        await self._commit(decision, now)

    async def _reschedule(self, runtime: PoolRuntime, state: TaskState, now: datetime) -> None:
        """Move a task off faulty nodes (R-31), or fail it when no healthy node can take it."""
        task_id = state.task_id
        exclude = runtime.exclude.get(task_id, ())
        decision = _Decision(runtime.pool_id)
        if task_id not in runtime.state.allocations:
            # Nothing held in the pool any more: place it like a new task would be.
            decision.add_task(task_id, self._decide(state, self._release_cmds(state), now))
            await self._commit(decision, now)
            await self._enqueue(runtime, self.tasks[task_id], now)
            return
        try:
            moved = plan_reschedule(runtime.state, task_id, exclude=exclude)
        except NoHealthyNode as exc:
            decision.pool_events.append(release(runtime.state, task_id, "reschedule failed"))
            # the task's failure reads "cannot be recovered: no healthy node can take ..."
            why = exc.message.removesuffix("; the task cannot be recovered")
            commands: list[Command] = [FailReschedule(task_id, why)]
            decision.add_task(
                task_id, self._decide(state, [*commands, *self._release_cmds(state)], now)
            )
            await self._commit(decision, now)
            await self._finish(runtime, self.tasks[task_id], now)
            return
        placement = _for_task(moved.placement, state)
        decision.pool_events.extend([moved.release, placement.event()])
        commands = [
            *self._release_cmds(state),
            _place_command(runtime.state, state.spec, placement),
        ]
        decision.add_task(task_id, self._decide(state, commands, now))
        await self._commit(decision, now)
        runtime.exclude.pop(task_id, None)
        self._dirty.add(runtime.pool_id)

    def _draining(self, runtime: PoolRuntime) -> bool:
        """Whether a preempted task's workers still run on GPUs the pool shows free.

        A spot shrink releases the victims' GPUs on the pool at once (the capacity
        change needs them), while the deployer is still ending their workers: nothing
        is placed in the pool until those exits are recorded (`held_live` empty), so
        a GPU is never given to a second task while a process of the first is alive.
        """
        return any(
            state.held_live and state.task_id not in runtime.state.allocations
            for state in self.tasks.values()
            if state.spec.pool == runtime.pool_id
        )

    @staticmethod
    def _release_cmds(state: TaskState) -> list[Command]:
        if state.held is None:
            return []
        return [ReleaseResources(state.task_id, "reschedule")]

    # -- placement passes ----------------------------------------------------------

    async def _pass(self, runtime: PoolRuntime, now: datetime, *, limit: int | None = None) -> int:
        """Place what the queue allows, in batches, then report queue reasons; placements made."""
        if self._draining(runtime):
            return 0
        placed = conflicts = 0
        while (limit is None or placed < limit) and conflicts < MAX_CONFLICT_RETRIES:
            batch = self.batch_size if limit is None else min(self.batch_size, limit - placed)
            plan = plan_queue(runtime.state, runtime.queue, max_placements=batch)
            runtime.plan = plan
            if not plan.placements:
                break
            try:
                placed += await self._commit_plan(runtime, plan, now)
            except ConcurrencyError as exc:
                conflicts += 1
                await self._refresh(exc.stream_id)
        await self._report_queue(runtime, now)
        return placed

    async def _commit_plan(self, runtime: PoolRuntime, plan: QueuePlan, now: datetime) -> int:
        """Append the plan's placements (pool + task streams) in one transaction."""
        decision = _Decision(runtime.pool_id)
        for placement in plan.placements:
            state = self.tasks.get(placement.task_id)
            if state is None:
                runtime.dequeue(placement.task_id)
                continue
            placement = _for_task(placement, state)
            command = _place_command(runtime.state, state.spec, placement)
            try:
                events = decide(state, command, now=now, ids=_no_ids)
            except DomainError as exc:
                log.info("not placing %s: %s", placement.task_id, exc)
                runtime.dequeue(placement.task_id)
                continue
            decision.pool_events.append(placement.event())
            decision.add_task(placement.task_id, events)
        if decision.empty:
            return 0
        await self._commit(decision, now)
        for task_id in decision.tasks:
            runtime.dequeue(task_id)
        self._dirty.add(runtime.pool_id)
        return len(decision.tasks)

    async def _report_queue(self, runtime: PoolRuntime, now: datetime) -> None:
        """Explain waiting tasks: changed rows for the read model, and TaskQueued where
        a wait starts or changes kind (the task domain's `decide` says when)."""
        statuses = queue_status(
            runtime.state, runtime.queue, runtime.plan, limit=self.status_window
        )
        seen = {s.task_id for s in statuses}
        for task_id in list(runtime.unreported)[: self.max_reports]:
            if task_id not in seen and task_id in runtime.queue:
                statuses.append(explain(runtime.state, runtime.queue, task_id, runtime.plan))
        decision = _Decision(runtime.pool_id)
        for status in statuses:
            state = self.tasks[status.task_id]
            request = runtime.queue.get(status.task_id)
            assert request is not None
            if state.queued_at is None and request.queued_at != now:
                # The wait starts with the TaskQueued decided now (a deferred pass runs
                # after the task was enqueued): memory and the row say what the log says.
                request = replace(request, queued_at=now)
                runtime.queue.remove(status.task_id)
                runtime.queue.add(request)
            row = queue_row(runtime.state, request, status)
            command = Queue(
                status.task_id,
                reason=status.reason,
                position=status.ahead,
                gpus_needed=row.gpus_needed,
                launchable=row.launchable,
                blocked=status.blocked,
            )
            try:
                decision.add_task(status.task_id, decide(state, command, now=now, ids=_no_ids))
            except DomainError as exc:
                log.info("not reporting %s: %s", status.task_id, exc)
            else:
                if self.write_views and runtime.rows.get(status.task_id) != row:
                    runtime.pending[status.task_id] = row
            runtime.unreported.pop(status.task_id, None)
        if not decision.empty:
            await self._commit_each_on_conflict(runtime, decision, now)

    async def _commit_each_on_conflict(
        self, runtime: PoolRuntime, decision: _Decision, now: datetime
    ) -> None:
        """Append task-only events together; on a conflict, one task at a time."""
        try:
            await self._commit(decision, now)
        except ConcurrencyError:
            for task_id, events in decision.tasks.items():
                try:
                    await self._commit(_Decision(None, [], {task_id: events}), now)
                except ConcurrencyError:
                    await self._refresh_task(task_id)
        for task_id in decision.tasks:
            state = self.tasks.get(task_id)
            if state is not None and state.finished:
                await self._finish(runtime, state, now)

    # -- periodic work -------------------------------------------------------------

    async def tick(self, now: datetime | None = None) -> None:
        """Time limits (R-08: max single queue duration), pending queue reports, and
        queue rows lost with a rolled-back transaction."""
        async with self._turn():
            now = now or self.clock()
            for runtime in self.pools.values():
                if self.write_views and runtime.unconfirmed:
                    ids = sorted(runtime.unconfirmed)
                    runtime.queue_stored(await read_queue_rows(self.store.pool, ids))
                for abnormal in timed_out(runtime.queue, now):
                    await self._retrying(partial(self._time_out, runtime, abnormal, now), [])
                if runtime.unreported or runtime.pool_id in self._dirty:
                    await self._pass(runtime, now)
            if self._swept_at is None or (now - self._swept_at).total_seconds() >= self.sweep_s:
                self._swept_at = now
                await self._sweep(now)
            self._dirty |= self._views_unconfirmed
            self._views_unconfirmed.clear()
            await self._flush_views(None)

    async def sweep(self, now: datetime | None = None) -> list[str]:
        """Anti-entropy now (the tick runs it every `sweep_s`); the tasks acted on."""
        async with self._turn():
            acted = await self._sweep(now or self.clock())
            await self._flush_views(None)
            return acted

    async def _sweep(self, now: datetime) -> list[str]:
        """Catch up with what the consumer should have brought, and do what was missed.

        Memory follows the log through the consumer, and nothing else reads a task
        again: were an event never to reach the scheduler (or its effect lost), its
        task would wait forever. So the sweep compares the store with memory:

        - events of our tasks' streams that memory has not folded, of a type the
          scheduler acts on, found unfolded at two sweeps in a row (so not an event
          still on its way): the task is read again from the log and reconciled;
        - every open task is reconciled: a consistent memory has nothing to do, so
          whatever it does do was missed.

        Both are logged as warnings (a healthy platform never needs them).
        """
        acted: list[str] = []
        unseen = await self._unseen_events()
        missed: dict[str, list[str]] = {}
        for sighting in unseen:
            if sighting in self._unseen:
                missed.setdefault(sighting.task_id, []).append(sighting.what)
        for task_id in sorted(missed):
            if task_id not in self._done and await self._recalled_settled(task_id):
                continue  # forgotten (or never seen), and nothing to do for it
            log.warning(
                "scheduler: events of task %s never reached it (%s); reading them now",
                task_id,
                ", ".join(missed[task_id]),
            )
            if await self._reload_task(task_id):
                acted.append(task_id)
        # What was read again whole is folded up to now: not sighted again.
        self._unseen = {s for s in unseen if s.task_id not in missed}
        self._fresh = []
        for task_id in list(self.tasks):
            if task_id in self.tasks and task_id not in missed:
                pool_id = await self._retrying(partial(self._reconcile, task_id, now), [])
                if pool_id is not None:
                    log.warning("scheduler: task %s was left undone; done now", task_id)
                    self._replan.add(pool_id)
                    acted.append(task_id)
        while self._replan:
            await self._pass(self.pools[self._replan.pop()], now)
        return acted

    async def _unseen_events(self) -> list[_Sighting]:
        """Every event of a task stream, of a type the scheduler acts on, that memory
        has not folded: of those recorded since the last sweep (the log is read on
        from where that sweep stopped, a gap waited out as the relay does), and of
        those not folded at the last sweep. What the sweep costs grows with what
        happened since the last one, not with the log."""
        if self._swept is None:  # memory built without `rebuild`: nothing to compare yet
            self._swept = self.store.all_reader(await self.store.head_position())
            return []
        async for rows in self._swept.heads(SWEEP_BATCH):
            self._fresh.extend(
                _Sighting(
                    row["stream_id"].removeprefix("task-"),
                    row["stream_version"],
                    f"{row['event_type']} v{row['stream_version']}"
                    f" at {row['occurred_at']:%H:%M:%S.%f}",
                )
                for row in rows
                if row["stream_id"].startswith("task-") and row["event_type"] not in IGNORED
            )
        sightings = [*self._unseen, *self._fresh]
        return [sighting for sighting in sightings if not self._folded(sighting)]

    def _folded(self, sighting: _Sighting) -> bool:
        """Whether memory has folded the event (or it is of another pool's task)."""
        if sighting.task_id in self._foreign:
            return True
        state = self.tasks.get(sighting.task_id)
        known = state.version if state is not None else self._done.get(sighting.task_id, 0)
        return sighting.version <= known

    async def _recalled_settled(self, task_id: str) -> bool:
        """Read the stream of a task memory does not hold (forgotten, or never seen):
        True, and remembered again, when it is another pool's or finished with
        nothing held (nothing to do for it); False when it is an open task of ours."""
        if task_id in self.tasks:
            return False
        state = None
        for recorded in await self.store.read_stream(task_stream(task_id)):
            state = evolve(state, recorded)
        if state is None:
            return True
        if state.spec.pool not in self.pools:
            self._remember_foreign(task_id)
            return True
        if state.finished and state.held is None:
            self._remember_done(task_id, state.version)
            return True
        return False

    async def _reload_task(self, task_id: str) -> bool:
        """Fold the task's whole stream again and do what it asks; whether it is ours."""
        self.tasks.pop(task_id, None)
        self._done.pop(task_id, None)
        await self._refresh_task(task_id)
        state = self.tasks.get(task_id)
        if state is None:
            return False
        if state.spec.pool not in self.pools:
            del self.tasks[task_id]
            self._causes.pop(task_id, None)
            self._remember_foreign(task_id)
            return False
        pool_id = await self._retrying(partial(self._reconcile, task_id, self.clock()), [])
        if pool_id is not None:
            self._replan.add(pool_id)
        return True

    async def _time_out(self, runtime: PoolRuntime, abnormal: Abnormal, now: datetime) -> None:
        """A spot task waited past its max single queue duration: abnormal, out of the queue."""
        state = self.tasks[abnormal.task_id]
        command = MarkAbnormal(abnormal.task_id, abnormal.reason, abnormal.next_steps)
        await self._decide_and_commit(runtime, state, [command], now)
        await self._finish(runtime, self.tasks[abnormal.task_id], now)
        self._dirty.add(runtime.pool_id)

    # -- admin (in-process callers; the gateway calls runyard.scheduler.admin) ----------

    async def add_node(
        self, pool_id: str, node: str, gpus: int = GPUS_PER_NODE, *, actor: str = ACTOR
    ) -> AdminResult:
        """Add a healthy node with every GPU free; the queue is re-planned."""
        return await self._admin(
            pool_id,
            lambda now: admin.add_node(self.store, pool_id, node, gpus, actor=actor, now=now),
        )

    async def remove_node(self, pool_id: str, node: str, *, actor: str = ACTOR) -> AdminResult:
        """Remove an idle node (NodeBusy while workers run on it)."""
        return await self._admin(
            pool_id, lambda now: admin.remove_node(self.store, pool_id, node, actor=actor, now=now)
        )

    async def cordon_node(self, pool_id: str, node: str, *, actor: str = ACTOR) -> AdminResult:
        """No new workers go to the node; running ones stay."""
        return await self._admin(
            pool_id, lambda now: admin.cordon_node(self.store, pool_id, node, actor=actor, now=now)
        )

    async def uncordon_node(self, pool_id: str, node: str, *, actor: str = ACTOR) -> AdminResult:
        """The node takes new workers again."""
        return await self._admin(
            pool_id,
            lambda now: admin.uncordon_node(self.store, pool_id, node, actor=actor, now=now),
        )

    async def mark_node_faulty(
        self, pool_id: str, node: str, reason: str, *, actor: str = ACTOR
    ) -> AdminResult:
        """The node has a hardware fault: nothing new goes there (fault injection in tests)."""
        return await self._admin(
            pool_id,
            lambda now: admin.mark_node_faulty(
                self.store, pool_id, node, reason, actor=actor, now=now
            ),
        )

    async def mark_node_healthy(
        self, pool_id: str, node: str, *, actor: str = ACTOR
    ) -> AdminResult:
        """The node was repaired."""
        return await self._admin(
            pool_id,
            lambda now: admin.mark_node_healthy(self.store, pool_id, node, actor=actor, now=now),
        )

    async def change_spot_capacity(
        self,
        pool_id: str,
        *,
        remove: int = 0,
        add: Sequence[str] = (),
        gpus_per_node: int = GPUS_PER_NODE,
        reason: str = "spot capacity changed",
        actor: str = ACTOR,
    ) -> SpotShrink | None:
        """Grow a spot pool by `add` nodes, or shrink it by `remove` nodes (R-08).

        A shrink preempts running spot tasks (lowest priority, newest first) as
        `plan_spot_shrink` decides: their workers are released and each task is
        requeued, or marked abnormal past its max requeue count, all in one
        append with the capacity change (`admin.change_spot_capacity`).
        Requeued tasks go back to the queue at once. Returns the shrink, None
        for a growth.
        """
        result = await self._admin(
            pool_id,
            lambda now: admin.change_spot_capacity(
                self.store,
                pool_id,
                remove=remove,
                add=add,
                gpus_per_node=gpus_per_node,
                reason=reason,
                actor=actor,
                now=now,
            ),
        )
        return result.shrink

    async def _admin(
        self, pool_id: str, operation: Callable[[datetime], Awaitable[AdminResult]]
    ) -> AdminResult:
        """Run an admin decision (it reads and appends on its own), then catch up and re-plan."""
        async with self._turn():
            runtime = self._runtime(pool_id)
            now = self.clock()
            result = await operation(now)
            await self._refresh_pool(runtime)
            for victim in result.preempted:
                await self._refresh_task(victim.task_id)
                await self._retrying(partial(self._reconcile, victim.task_id, now), [])
            self._dirty.add(pool_id)
            await self._pass(runtime, now)
            await self._flush_views(None)
            return result

    def _runtime(self, pool_id: str) -> PoolRuntime:
        runtime = self.pools.get(pool_id)
        if runtime is None:
            raise UnknownPool(pool_id, tuple(self.pools))
        return runtime

    # -- reading (in-process callers, tests) ---------------------------------------

    def view(self, pool_id: str) -> dict[str, Any]:
        """The pool's read-model document as it would be written now."""
        runtime = self._runtime(pool_id)
        return build_view(
            runtime.state, runtime.queue, runtime.plan, version=runtime.version, now=self.clock()
        )

    def queue_rows(self, pool_id: str) -> list[QueueRow]:
        """Every waiting task's queue read-model row, explained now, in queue order."""
        runtime = self._runtime(pool_id)
        statuses = queue_status(runtime.state, runtime.queue, runtime.plan)
        return [
            queue_row(runtime.state, task, status)
            for task, status in zip(runtime.queue, statuses, strict=True)
        ]

    # -- appending and reloading -------------------------------------------------------

    def _decide(self, state: TaskState, commands: Sequence[Command], now: datetime) -> list[Event]:
        """Decide commands one after the other on the task (each sees the events before)."""
        return decide_all(state, commands, now=now, ids=_no_ids)

    async def _decide_and_commit(
        self, runtime: PoolRuntime, state: TaskState, commands: Sequence[Command], now: datetime
    ) -> None:
        decision = _Decision(runtime.pool_id)
        decision.add_task(state.task_id, self._decide(state, commands, now))
        await self._commit(decision, now)

    async def _commit(self, decision: _Decision, now: datetime) -> None:
        """Append the decision in one transaction with the versions it read; then fold it."""
        if decision.empty:
            return
        metadata = self._cause or Metadata(actor=ACTOR)
        requests = []
        runtime = self.pools[decision.pool_id] if decision.pool_id else None
        if decision.pool_events:
            assert runtime is not None
            # an allocation or release is caused by what its task went through, not by
            # whichever event triggered the placement pass
            requests.append(
                AppendRequest(
                    pool_stream(runtime.pool_id),
                    [
                        NewEvent(e, self._causes.get(getattr(e, "task_id", ""), metadata), now)
                        for e in decision.pool_events
                    ],
                    runtime.version,
                )
            )
        for task_id, events in decision.tasks.items():
            if events:
                requests.append(
                    AppendRequest(
                        task_stream(task_id),
                        [NewEvent(e, self._causes.get(task_id, metadata), now) for e in events],
                        self.tasks[task_id].version,
                    )
                )
        try:
            await self.store.append_many(requests)
        except ConcurrencyError:
            raise  # nothing was written
        except BaseException:
            # The store (or this task) failed mid-call: the append may have committed.
            self._unsure.update(request.stream_id for request in requests)
            raise
        if runtime is not None:
            for event in decision.pool_events:
                evolve_pool(runtime.state, event)
            runtime.version += len(decision.pool_events)
        for task_id, events in decision.tasks.items():
            state = self.tasks[task_id]
            for event in events:
                state = evolve(state, (event, now))
            self.tasks[task_id] = state

    async def _retrying(self, op: Callable[[], Awaitable[T]], streams: Sequence[str]) -> T:
        """Run a decision; on a conflict, read what moved on and decide again."""
        for _ in range(MAX_CONFLICT_RETRIES):
            try:
                return await op()
            except ConcurrencyError as exc:
                log.info("conflict on %s; reloading", exc.stream_id)
                await self._refresh(exc.stream_id)
                for stream in streams:
                    await self._refresh(stream)
        raise ConflictPersisted(
            f"gave up after {MAX_CONFLICT_RETRIES} conflicts", "the event will be retried"
        )

    @contextlib.asynccontextmanager
    async def _turn(self) -> AsyncIterator[None]:
        """One decision-making turn: the lock, and memory caught up first (`_settle`)."""
        async with self._lock:
            await self._settle()
            yield

    async def _settle(self) -> None:
        """Catch memory up with the streams of appends whose outcome was unknown (after an
        outage): what committed is folded in, so no decision repeats or misses it and the
        views written from memory stay equal to the log's fold."""
        now = self.clock()
        for stream_id in sorted(self._unsure):  # pools first: a task's reconcile reads them
            await self._refresh(stream_id)
            if stream_id.startswith("pool-"):
                self._dirty.add(stream_id.removeprefix("pool-"))
            else:  # what the task asks now (a finished one is forgotten, as usual)
                task_id = stream_id.removeprefix("task-")
                pool_id = await self._retrying(partial(self._reconcile, task_id, now), [])
                if pool_id is not None:
                    self._dirty.add(pool_id)
            self._unsure.discard(stream_id)

    async def _refresh(self, stream_id: str) -> None:
        if stream_id.startswith("pool-"):
            runtime = self.pools.get(stream_id.removeprefix("pool-"))
            if runtime is not None:
                await self._refresh_pool(runtime)
        elif stream_id.startswith("task-"):
            await self._refresh_task(stream_id.removeprefix("task-"))

    async def _refresh_pool(self, runtime: PoolRuntime) -> None:
        """Fold the pool events another writer appended since our version."""
        for recorded in await self.store.read_stream(
            pool_stream(runtime.pool_id), runtime.version + 1
        ):
            evolve_pool(runtime.state, recorded.event)
            runtime.version = recorded.stream_version
        self._dirty.add(runtime.pool_id)
        placed_elsewhere = [t for t in runtime.state.allocations if t in runtime.queue]
        for task_id in placed_elsewhere:  # another scheduler placed it
            await self._refresh_task(task_id)

    async def _refresh_task(self, task_id: str) -> None:
        """Fold the task events appended since our version (the whole stream if unknown)."""
        state = self.tasks.get(task_id)
        start = state.version + 1 if state is not None else 1
        last: RecordedEvent[Event] | None = None
        for last in await self.store.read_stream(task_stream(task_id), start):
            state = self._fold_task(state, last)
        if state is None:
            return
        self.tasks[task_id] = state
        if last is not None:
            self._note_cause(task_id, last)
        runtime = self.pools.get(state.spec.pool)
        if (
            runtime is not None
            and task_id in runtime.queue
            and state.status not in ("new", "queued")
        ):
            runtime.dequeue(task_id)

    async def _flush_views(self, conn: asyncpg.Connection | None) -> None:
        """Rewrite the read-model rows of the pools changed since the last flush, and
        the queue rows that changed: in `conn`'s transaction (a decision's), else in
        one of their own, so a reader sees every pool's view of one moment. (The
        submission checks specs against `pools.yaml` until the first views are
        written: it must never see some pools and not the others.)"""
        if not self.write_views:
            self._dirty.clear()
            return
        if conn is not None:
            await self._write_views(conn)
            self._views_unconfirmed |= self._dirty
        elif self._dirty or any(r.pending or r.left for r in self.pools.values()):
            async with self.store.pool.acquire() as own, own.transaction():
                await self._write_views(own)
        self._dirty.clear()

    async def _write_views(self, conn: asyncpg.Connection) -> None:
        for runtime in self.pools.values():
            if runtime.pending or runtime.left:
                rows, gone = runtime.queue_changes()
                await write_queue_rows(conn, rows, gone)
                runtime.queue_written(rows, gone)
        now = self.clock()
        for pool_id in sorted(self._dirty):
            changed = self.pools.get(pool_id)
            if changed is None:
                continue
            view = build_view(
                changed.state, changed.queue, changed.plan, version=changed.version, now=now
            )
            await write_view(conn, view)


def _for_task(placement: Placement, state: TaskState) -> Placement:
    """The placement as the task's next attempt (its run and attempt numbers)."""
    return replace(placement, run=state.run, attempt=next_attempt(state))


def _place_command(pool: PoolState, spec: TaskSpec, placement: Placement) -> Place:
    """The task's command for `placement`: each worker with its node, GPUs, CPUs and memory."""
    workers = []
    for w in placement.workers:
        cpus, memory = worker_resources(pool, spec, len(w.gpus)) or (None, None)
        workers.append(
            WorkerPlacement(index=w.index, node=w.node, gpus=w.gpus, cpus=cpus, memory_gib=memory)
        )
    return Place(placement.task_id, pool.pool_id, tuple(workers))
