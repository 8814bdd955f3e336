"""The fault-tolerance service's application layer (SPEC R-30 to R-35).

Inputs: task and pool events (`handle`, the idempotent consumer's handler),
worker output lines from the `runyard.logs` topic (`on_log`), and a clock tick
(`tick`, about once a second). Every decision goes through the domain's
`decide` on the task's state folded from its stream and is appended with the
version it read (a conflict: read again, decide again).

Reactions:

- env check (R-30, R-31): when `env_init` completed for a task whose spec asks
  for one, `StartEnvCheck`. The runtime then runs `python -m
  runyard.faulttolerance.bootcheck` in every worker and its lines come on the
  logs topic; each item line becomes `EnvCheckItemReported`, and once every
  worker printed `Bootcheck Finished`, `FinishEnvCheck`. A blocking failure
  (a GPU fault) appends `TaskRescheduleRequested` naming the faulty nodes in
  the same append. A worker still silent after `env_check_timeout_s` gets a
  failed (warning) `runtime` item and the check finishes without it.
- a node marked faulty (R-31) while a task has workers on it: reschedule.
- hang (R-33): a running attempt with `hang_timeout_s` and no new line and no
  step advance for that long: `HangDetected`; then a `CaptureStacks` command
  to the deployer (which owns the worker processes), and a wait of up to
  `stacks_wait_s` for its `StacksCaptured`; then `TaskRestartScheduled`
  (reason `hang`) when auto restart allows it, else `TaskFailed` ("hang, no
  restarts left", or "hang, auto restart is off"): the deployer ends the
  workers, the scheduler frees the GPUs, the notification service alerts as
  for any failure. No answer (no deployer, no worker process): the restart
  or failure follows all the same, without stacks.
- stacks (R-33): every `StacksCaptured` (after a hang, or asked for through
  `request_stacks`) becomes a stored report (`report_of`), read by the API.
- resume (R-32): in an attempt that follows one that ran, the first
  checkpoint-load line gives `ResumeObserved` (step, path); none within
  `resume_wait_s` after the attempt started running, or before the run
  ended or the next attempt began, gives `ResumeNotObserved`. Lines travel
  apart from events: lines of the attempt that come before its TaskRunning is
  known are kept and replayed then, and an attempt that ended (its run, or a
  restart) waits `late_lines_s` for late lines.
- slowdown (R-34): with `slowdown_detection` on, step times from the lines of
  the first worker of each attempt that reports them; every window over the
  threshold gives `SlowdownDetected` with the R-34 line. Every line of the run
  counts, whether the task still runs or has just ended (a script that prints
  its log and exits at once is analysed all the same): the slowdown watch
  follows the lines' own run and attempt, apart from the task's status.

Audit chain (R-62): every event this service appends names its cause: the
event it reacts to, or for what it reads in worker lines and timers, the
task event the detection follows from (the attempt's `TaskRunning`, or
`EnvCheckStarted` for env check items), and `HangDetected` for the stacks,
restart or failure that follow a hang. Each keeps its cause's correlation id.

The watches live in memory and are rebuilt from the task's stream on the first
event or line of a task after a service restart (a hang timer then counts from
that moment; a slowdown watch starts a new warm-up and baseline).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Literal, Protocol, TypeAlias, cast

from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent
from runyard.contracts.commands import CaptureStacks
from runyard.contracts.loglines import LogRecord
from runyard.contracts.pool_events import NodeMarkedFaulty, NodeMarkedHealthy
from runyard.contracts.task_events import (
    DeployStageCompleted,
    EnvCheckItemName,
    EnvCheckItemResult,
    EnvCheckStarted,
    HangDetected,
    ResumeNotObserved,
    ResumeObserved,
    SlowdownDetected,
    StacksCaptured,
    TaskRunning,
)
from runyard.domain.task import (
    PLACED_STATUSES,
    Command,
    Fail,
    FinishEnvCheck,
    Record,
    ReportEnvCheckItem,
    RequestReschedule,
    ScheduleRestart,
    StartEnvCheck,
    TaskState,
    evolve,
    restart_refusal,
    worker_count,
)
from runyard.eventstore import (
    EventStore,
    StreamLocks,
    TaskCommands,
    decide_and_append,
    remember_last,
)
from runyard.faulttolerance.bootcheck import ITEMS, is_finished_line, parse_line
from runyard.faulttolerance.hang import HangDetector
from runyard.faulttolerance.patterns import UserPatternError
from runyard.faulttolerance.reports import StackReportStore
from runyard.faulttolerance.resume import ResumeMatcher
from runyard.faulttolerance.slowdown import SlowdownDetector, StepTime, StepTimeParser
from runyard.faulttolerance.stacks import StackReport, report_of
from runyard.faulttolerance.watched import WatchedTasks

log = logging.getLogger("runyard.faulttolerance")

ACTOR = "service:faulttolerance"
MAX_CONFLICT_RETRIES = 8
RESUME_WAIT_S = 600.0
#: A worker that has not printed `Bootcheck Finished` by then is reported as a warning.
ENV_CHECK_TIMEOUT_S = 600.0
#: Lines of an attempt kept while its TaskRunning is not known yet (per task).
EARLY_LINES = 2000
#: After a run ended, how long its lines may still come (they travel apart from events).
LATE_LINES_S = 10.0
#: Slowdown watches of ended runs kept for late lines (the oldest go first).
ENDED_SLOW_WATCHES = 1000
#: Finished tasks remembered as finished (the oldest go first; see `_finished`).
FINISHED_KEPT = 10_000
#: How long a stack capture is awaited (the deployer's py-spy dumps take seconds).
STACKS_WAIT_S = 20.0
#: How often the stream is read while a capture is awaited.
STACKS_POLL_S = 0.1
#: How long handing a command to the broker may take.
SEND_TIMEOUT_S = 10.0
Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _new_id() -> str:
    return uuid.uuid4().hex


def task_stream(task_id: str) -> str:
    return f"task-{task_id}"


class DeployerCommands(Protocol):
    """Where commands to the deployer go (its command topic; a fake in tests)."""

    async def send(self, command: CaptureStacks) -> None: ...


class StacksUnavailable(Exception):
    """No capture could be asked for or none came in time; `timed_out` tells which."""

    def __init__(self, message: str, *, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


@dataclass
class _EnvCheck:
    attempt: int
    deadline: datetime
    finished_workers: set[int] = field(default_factory=set)
    reported: set[tuple[int, str, str]] = field(default_factory=set)
    faulty_nodes: set[str] = field(default_factory=set)
    done: bool = False


@dataclass(frozen=True, slots=True)
class Because:
    """The task event a detection follows from, when no event triggered it (a worker
    line, a timer): the latest `kind` event of (run, attempt) in the stream, else the
    stream's last event. Its id becomes the causation id, its correlation id is kept."""

    kind: type[Event]
    run: int
    attempt: int | None = None
    actor: str = ACTOR

    def find(self, events: Sequence[RecordedEvent[Event]]) -> RecordedEvent[Event] | None:
        for recorded in reversed(events):
            e = recorded.event
            if (
                isinstance(e, self.kind)
                and getattr(e, "run", None) == self.run
                and (self.attempt is None or getattr(e, "attempt", None) == self.attempt)
            ):
                return recorded
        return events[-1] if events else None


#: Why an append happens: the metadata itself (a reaction to a known event, a
#: person's request), or the task event to name as its cause (`Because`).
Why: TypeAlias = Metadata | Because


def after(new: NewEvent[Event]) -> Metadata:
    """Metadata for what follows from `new` (appended by this service): it is the cause."""
    return Metadata(
        actor=new.metadata.actor,
        causation_id=str(new.event_id),
        correlation_id=new.metadata.correlation_id or str(new.event_id),
        trace_context=dict(new.metadata.trace_context),
    )


@dataclass
class _SlowWatch:
    """Step times of one task's lines, by the lines' own run and attempt (R-34).

    Apart from `_Watch`: lines of a run that just ended still count, and a task
    first seen finished (a script that printed its log and exited at once) too.
    """

    run: int
    attempt: int
    #: The run's spec asks for slowdown detection (step times still feed the hang timer).
    on: bool
    detector: SlowdownDetector = field(default_factory=SlowdownDetector)
    parsers: dict[int, StepTimeParser] = field(default_factory=dict)
    step_worker: int | None = None

    def next_attempt(self, attempt: int) -> None:
        self.attempt = attempt
        self.parsers, self.step_worker = {}, None
        self.detector.restart()


@dataclass
class _Watch:
    """What the service follows of one task (its current run and attempt)."""

    task_id: str
    run: int
    attempt: int
    state: TaskState
    hang: HangDetector | None = None
    resume: ResumeMatcher | None = None
    resume_deadline: datetime | None = None
    resume_since: datetime | None = None
    #: When the attempt awaiting its resume ended (its run over, or replaced): what
    #: comes after is the wait for its late lines, not time it ran without a resume.
    resume_ended: datetime | None = None
    env_check: _EnvCheck | None = None
    hang_handling: bool = False
    #: Lines of this attempt that came before it was known to run (replayed then).
    early: list[LogRecord] = field(default_factory=list)
    #: The attempt was seen running (its detectors are set up).
    started: bool = False
    #: The run ended; kept only while a resume is still awaited (late lines).
    closed: bool = False

    @property
    def nodes(self) -> dict[int, str]:
        return {w.index: w.node for w in self.state.workers}


class FaultToleranceApp:
    """See the module docstring."""

    def __init__(
        self,
        store: EventStore,
        *,
        reports: StackReportStore | None = None,
        watched: WatchedTasks | None = None,
        deployer: DeployerCommands | None = None,
        clock: Clock = _utcnow,
        ids: Callable[[], str] = _new_id,
        resume_wait_s: float = RESUME_WAIT_S,
        env_check_timeout_s: float = ENV_CHECK_TIMEOUT_S,
        stacks_wait_s: float = STACKS_WAIT_S,
        late_lines_s: float = LATE_LINES_S,
    ) -> None:
        self.late_lines_s = late_lines_s
        self.store = store
        self.env_check_timeout_s = env_check_timeout_s
        self.reports = reports
        self.watched = watched
        self.deployer = deployer
        self.stacks_wait_s = stacks_wait_s
        self.clock = clock
        self.ids = ids
        self.resume_wait_s = resume_wait_s
        self._watches: dict[str, _Watch] = {}
        #: The attempt a restart replaced, while its resume is still awaited (late lines).
        self._replaced: dict[str, _Watch] = {}
        #: Tasks found finished, oldest first (the last FINISHED_KEPT): a line of one
        #: needs no read of its stream. One that fell out is read again, found
        #: finished again, and kept again.
        self._finished: dict[str, None] = {}
        self._slow: dict[str, _SlowWatch] = {}
        #: Tasks whose run ended, oldest first: their slowdown watches wait for late lines.
        self._ended: dict[str, None] = {}
        #: Nodes marked faulty (and the event that said so), until marked healthy: a task
        #: whose events arrive after the fault's (the two topics are not ordered) is
        #: still moved off them.
        self._faulty: dict[str, tuple[NodeMarkedFaulty, RecordedEvent[Event]]] = {}
        self._locks = StreamLocks()  # one decision at a time per task
        self._background: set[asyncio.Task[Any]] = set()
        #: Each unfinished task's state as of the last event folded here: a stream only
        #: grows, so a later read folds just the events after it (see `_load`).
        self._states: dict[str, TaskState] = {}

    # -- task and pool events ----------------------------------------------------

    async def handle(self, event: RecordedEvent[Event], conn: Any = None) -> None:
        """React to one task or pool event (the IdempotentConsumer's handler)."""
        payload = event.event
        if isinstance(payload, (NodeMarkedFaulty, NodeMarkedHealthy)) and not await self._held(
            event
        ):
            return
        if isinstance(payload, NodeMarkedFaulty):
            self._faulty[payload.node] = (payload, event)
            await self._on_node_faulty(payload, event)
            return
        if isinstance(payload, NodeMarkedHealthy):
            self._faulty.pop(payload.node, None)
            return
        if not event.stream_id.startswith("task-"):
            return
        task_id = event.stream_id.removeprefix("task-")
        if isinstance(payload, StacksCaptured):
            await self._keep_report(task_id, cast(RecordedEvent[StacksCaptured], event))
        state = await self._load(task_id, event)
        if state is None:
            return
        watch = await self._sync(task_id, state, event)
        if watch is None:
            return
        await self._off_faulty_nodes(task_id, state)
        meta = Metadata(actor=ACTOR).caused_by(event, ACTOR)
        if (
            isinstance(payload, DeployStageCompleted)
            and payload.stage == "env_init"
            and state.spec.fault_tolerance.env_check
            and state.env_check is None
            and (payload.run, payload.attempt) == (state.run, state.attempt)
        ):
            await self._decide_quietly(task_id, [StartEnvCheck(task_id)], meta)

    async def _held(self, event: RecordedEvent[Event]) -> bool:
        """Whether the log holds `event` as the broker delivered it (id and payload at
        its stream and version). A node's mark moves every task on the node: it is acted
        on only then, so a forged or corrupted message moves nothing (logged)."""
        return await self.store.holds_or_says(event, log)

    async def _sync(
        self, task_id: str, state: TaskState, cause: RecordedEvent[Event] | None
    ) -> _Watch | None:
        """Bring the task's watch in line with its state; None once the task is finished."""
        watch = self._watches.get(task_id)
        self._note_ended(task_id, state)
        if state.finished:
            if task_id not in self._finished and self.watched is not None:
                await self.watched.remove(task_id)
            self._note_finished(task_id)
            if watch is not None and watch.run == state.run:
                await self._close(watch, state, cause)
            elif watch is not None:
                self._watches.pop(task_id, None)
            return None
        self._finished.pop(task_id, None)
        now = cause.occurred_at if cause is not None else self.clock()
        if watch is None or watch.run != state.run:
            if watch is None and self.watched is not None:
                await self.watched.add(task_id)
            watch = _Watch(task_id, state.run, state.attempt, state)
            self._watches[task_id] = watch
        elif watch.attempt != state.attempt:
            await self._replace(watch, cause)
            watch.attempt = state.attempt
            watch.hang, watch.env_check = None, None
            watch.resume = watch.resume_deadline = watch.resume_since = None
            watch.resume_ended = None
            watch.early, watch.started, watch.closed = [], False, False
        watch.state = state
        options = state.spec.fault_tolerance
        if state.status == "env_checking" and watch.env_check is None:
            watch.env_check = _EnvCheck(
                state.attempt, now + timedelta(seconds=self.env_check_timeout_s)
            )
        if state.status == "running" and not watch.started:
            watch.started = True
            just_started = cause is not None and isinstance(cause.event, TaskRunning)
            started = now if just_started else self.clock()
            if options.hang_timeout_s is not None:
                watch.hang = HangDetector(float(options.hang_timeout_s), started)
            if _follows_a_run(state, cause):
                watch.resume = _resume_matcher(task_id, options.resume_pattern)
                watch.resume_since = started
                watch.resume_deadline = started + timedelta(seconds=self.resume_wait_s)
            early, watch.early = watch.early, []
            for line in early:
                if (line.run, line.attempt) == (watch.run, watch.attempt):
                    await self._running_line(watch, line)
        return watch

    async def _close(
        self, watch: _Watch, state: TaskState, cause: RecordedEvent[Event] | None
    ) -> None:
        """The run ended. Worker lines travel apart from events and may still come: a
        resume still awaited is decided `late_lines_s` later (or at its own deadline)."""
        watch.state, watch.hang = state, None
        if watch.resume is None or watch.resume_since is None:
            self._forget(watch)
            return
        if watch.closed:
            return
        watch.closed = True
        now = cause.occurred_at if cause is not None else self.clock()
        watch.resume_ended = now
        grace = now + timedelta(seconds=self.late_lines_s)
        deadline = watch.resume_deadline
        watch.resume_deadline = min(deadline, grace) if deadline is not None else grace
        early, watch.early = watch.early, []
        for line in early:
            if (line.run, line.attempt) == (watch.run, watch.attempt) and watch.resume:
                await self._resume(watch, line)
        if watch.resume is None:
            self._forget(watch)

    async def _replace(self, watch: _Watch, cause: RecordedEvent[Event] | None) -> None:
        """A new attempt replaces the watched one: a resume it still awaited is decided
        `late_lines_s` later (or at its own deadline), as at the end of a run."""
        earlier = self._replaced.pop(watch.task_id, None)
        if earlier is not None:  # restarted again meanwhile: its wait is over
            await self._end_resume_watch(earlier, earlier.state, cause)
        if watch.resume is None or watch.resume_since is None:
            return
        now = cause.occurred_at if cause is not None else self.clock()
        grace = now + timedelta(seconds=self.late_lines_s)
        deadline = watch.resume_deadline
        self._replaced[watch.task_id] = _Watch(
            watch.task_id,
            watch.run,
            watch.attempt,
            watch.state,
            resume=watch.resume,
            resume_since=watch.resume_since,
            resume_ended=now,
            resume_deadline=min(deadline, grace) if deadline is not None else grace,
            closed=True,
        )

    def _forget(self, watch: _Watch) -> None:
        if self._watches.get(watch.task_id) is watch:
            del self._watches[watch.task_id]

    async def _end_resume_watch(
        self, watch: _Watch, state: TaskState, cause: RecordedEvent[Event] | None
    ) -> None:
        if watch.resume is None or watch.resume_since is None:
            return
        now = cause.occurred_at if cause is not None else self.clock()
        # How long the attempt ran without one: to its end, or to the end of the wait
        # (the wait for its late lines, or a timer's lateness, not counted).
        until = min(now, watch.resume_since + timedelta(seconds=self.resume_wait_s))
        if watch.resume_ended is not None:
            until = min(until, watch.resume_ended)
        waited = max(0.0, (until - watch.resume_since).total_seconds())
        watch.resume = None
        event = ResumeNotObserved(run=watch.run, attempt=watch.attempt, waited_s=waited)
        why = self._meta(cause) if cause is not None else self._because(watch)
        await self._decide_quietly(watch.task_id, [Record(watch.task_id, event)], why)

    async def _on_node_faulty(self, fault: NodeMarkedFaulty, cause: RecordedEvent[Event]) -> None:
        meta = Metadata(actor=ACTOR).caused_by(cause, ACTOR)
        for watch in list(self._watches.values()):
            if fault.node not in watch.nodes.values():
                continue
            state = await self._load(watch.task_id)
            if state is None or state.status not in PLACED_STATUSES or state.placement is None:
                continue
            if fault.node not in {w.node for w in state.placement.workers}:
                continue
            reason = f"node {fault.node} is faulty: {fault.reason}"
            command = RequestReschedule(watch.task_id, reason, (fault.node,))
            await self._decide_quietly(watch.task_id, [command], meta)

    async def _off_faulty_nodes(self, task_id: str, state: TaskState) -> None:
        """A placed task on a node already marked faulty: the fault came first (its
        reschedule request found no watch then), so ask for it now."""
        if not self._faulty or state.placement is None or state.status not in PLACED_STATUSES:
            return
        for node in sorted({w.node for w in state.placement.workers} & self._faulty.keys()):
            fault, cause = self._faulty[node]
            meta = Metadata(actor=ACTOR).caused_by(cause, ACTOR)
            reason = f"node {fault.node} is faulty: {fault.reason}"
            command = RequestReschedule(task_id, reason, (fault.node,))
            if await self._decide_quietly(task_id, [command], meta):
                return

    async def adopt(self, tasks: Callable[[str], bool]) -> int:
        """Set up the watches of the unfinished tasks `tasks` picks (this instance took
        their events and lines over: at start, or in a rebalance) from their streams,
        without waiting for their next event or line; a hang timer counts from now.
        Returns how many watches were set up."""
        if self.watched is None:
            return 0
        adopted = 0
        for task_id in await self.watched.all():
            if not tasks(task_id) or task_id in self._watches:
                continue
            state = await self._load(task_id)
            if state is None:
                continue
            if await self._sync(task_id, state, None) is not None:
                adopted += 1
        if adopted:
            log.info("%d unfinished tasks taken over", adopted)
        return adopted

    def drop(self, tasks: Callable[[str], bool]) -> int:
        """Forget every watch of the tasks `tasks` picks (another instance took their
        events and lines in a rebalance); returns how many tasks were watched. A
        capture or restart already under way finishes: its appends check versions."""
        dropped = {t for t in (*self._watches, *self._slow, *self._ended) if tasks(t)}
        for task_id in [*dropped, *(t for t in self._states if tasks(t))]:
            self._states.pop(task_id, None)
        for task_id in dropped:
            self._watches.pop(task_id, None)
            self._replaced.pop(task_id, None)
            self._slow.pop(task_id, None)
            self._ended.pop(task_id, None)
        for task_id in [t for t in self._finished if tasks(t)]:
            del self._finished[task_id]
        if dropped:
            log.info("%d watched tasks moved to another instance", len(dropped))
        return len(dropped)

    # -- log lines -----------------------------------------------------------------

    async def on_log(self, line: LogRecord) -> None:
        """One worker output line of the logs topic."""
        sample = await self._step_time(line)
        replaced = self._replaced.get(line.task_id)
        if replaced is not None and (line.run, line.attempt) == (replaced.run, replaced.attempt):
            if replaced.resume is not None:  # a late line of the attempt a restart replaced
                await self._resume(replaced, line)
            return
        watch = await self._watch_for(line.task_id)
        if watch is None:
            return
        if watch.closed:  # the run ended; only a late checkpoint-load line still counts
            if (line.run, line.attempt) == (watch.run, watch.attempt) and watch.resume:
                await self._resume(watch, line)
                if watch.resume is None:
                    self._forget(watch)
            return
        if (line.run, line.attempt) != (watch.run, watch.attempt) or (
            watch.state.status != "running" and watch.env_check is None
        ):
            # the line may be ahead of the task events this service has seen: read again
            state = await self._load(line.task_id)
            watch = await self._sync(line.task_id, state, None) if state is not None else None
            if watch is None or (line.run, line.attempt) != (watch.run, watch.attempt):
                return
        checking = watch.env_check is not None and not watch.env_check.done
        if checking and await self._env_check_line(watch, line):
            return
        if watch.state.status != "running":
            # a worker may print before its TaskRunning is recorded (or seen here):
            # kept until then, so a checkpoint-load line printed at once still counts
            if len(watch.early) < EARLY_LINES:
                watch.early.append(line)
            return
        await self._running_line(watch, line, sample)

    async def _running_line(
        self, watch: _Watch, line: LogRecord, sample: StepTime | None = None
    ) -> None:
        """A line of the running attempt: hang timer (a step advance counts), resume."""
        step = sample.iteration if sample is not None else None
        if watch.hang is not None:
            watch.hang.line(line.worker, line.at, step)
        if watch.resume is not None:
            await self._resume(watch, line)

    # -- slowdown ------------------------------------------------------------------------

    async def _step_time(self, line: LogRecord) -> StepTime | None:
        """Feed the line to its task's slowdown watch; the step time it gives, if any.

        Lines of the watch's run and attempt count whatever the task's status; a
        later attempt restarts the detector (warm-up, window alignment), a later
        run starts a new watch, lines of earlier attempts or runs are ignored.
        """
        slow = self._slow.get(line.task_id)
        if slow is None or line.run > slow.run:
            slow = await self._new_slow_watch(line)
            if slow is None:
                return None
        if (line.run, line.attempt) < (slow.run, slow.attempt):
            return None
        if line.attempt > slow.attempt:
            slow.next_attempt(line.attempt)
        sample = slow.parsers.setdefault(line.worker, StepTimeParser()).feed(line.line)
        if sample is None or not slow.on:
            return sample
        if slow.step_worker is None:
            slow.step_worker = line.worker
        if line.worker == slow.step_worker:
            for warning in slow.detector.observe(sample):
                event = SlowdownDetected(
                    run=slow.run,
                    first_iter=warning.first_iter,
                    last_iter=warning.last_iter,
                    mean_ms=warning.mean_ms,
                    baseline_ms=warning.baseline_ms,
                    ratio=warning.ratio,
                    message=warning.message,
                )
                why = Because(TaskRunning, slow.run, slow.attempt)
                await self._decide_quietly(line.task_id, [Record(line.task_id, event)], why)
        return sample

    async def _new_slow_watch(self, line: LogRecord) -> _SlowWatch | None:
        state = await self._load(line.task_id)
        if state is None or line.run != state.run:
            return None  # an unknown task, or a line of a run since replaced
        slow = _SlowWatch(line.run, line.attempt, state.spec.fault_tolerance.slowdown_detection)
        self._slow[line.task_id] = slow
        self._note_ended(line.task_id, state)
        return slow

    def _note_finished(self, task_id: str) -> None:
        """Remember that the task finished, forgetting the oldest past FINISHED_KEPT."""
        remember_last(self._finished, task_id, None, FINISHED_KEPT)

    def _note_ended(self, task_id: str, state: TaskState) -> None:
        """Keep the slowdown watches of the last ENDED_SLOW_WATCHES ended runs only."""
        if not state.finished:
            self._ended.pop(task_id, None)
            return
        for oldest in remember_last(self._ended, task_id, None, ENDED_SLOW_WATCHES):
            self._slow.pop(oldest, None)

    async def _watch_for(self, task_id: str) -> _Watch | None:
        watch = self._watches.get(task_id)
        if watch is not None or task_id in self._finished:
            return watch
        state = await self._load(task_id)
        if state is None:
            return None
        return await self._sync(task_id, state, None)

    async def _env_check_line(self, watch: _Watch, line: LogRecord) -> bool:
        check = watch.env_check
        assert check is not None
        if is_finished_line(line.line):
            check.finished_workers.add(line.worker)
            if len(check.finished_workers) >= worker_count(watch.state.spec):
                await self._finish_env_check(watch, check)
            return True
        item = parse_line(line.line)
        if item is None or item.item not in ITEMS:
            return False
        key = (line.worker, item.item, item.detail)
        if key in check.reported:
            return True
        check.reported.add(key)
        result = (
            item.result if item.result in ("pass", "warn", "fail", "not_applicable") else "fail"
        )
        blocking = item.blocking and result == "fail"
        if blocking and line.worker in watch.nodes:
            check.faulty_nodes.add(watch.nodes[line.worker])
        command = ReportEnvCheckItem(
            watch.task_id,
            line.worker,
            cast(EnvCheckItemName, item.item),
            cast(EnvCheckItemResult, result),
            item.detail or "-",
            blocking,
        )
        await self._decide_quietly(watch.task_id, [command], self._env_check_cause(watch))
        return True

    async def _finish_env_check(self, watch: _Watch, check: _EnvCheck) -> None:
        check.done = True
        commands: list[Command] = [FinishEnvCheck(watch.task_id)]
        if check.faulty_nodes:
            nodes = tuple(sorted(check.faulty_nodes))
            reason = f"env check found a hardware fault on {', '.join(nodes)}"
            commands.append(RequestReschedule(watch.task_id, reason, nodes))
        await self._decide_quietly(watch.task_id, commands, self._env_check_cause(watch))

    async def _resume(self, watch: _Watch, line: LogRecord) -> None:
        assert watch.resume is not None
        found = watch.resume.match(line.line)
        if found is None:
            return
        watch.resume = None
        event = ResumeObserved(
            run=watch.run,
            attempt=watch.attempt,
            step=found.step,
            path=found.path,
            line=found.line[:2000],
        )
        await self._decide_quietly(
            watch.task_id, [Record(watch.task_id, event)], self._because(watch)
        )

    # -- timers ----------------------------------------------------------------------

    async def tick(self) -> None:
        """Check hang timers and resume deadlines (call about once a second)."""
        now = self.clock()
        for task_id, replaced in list(self._replaced.items()):
            if replaced.resume is None:
                del self._replaced[task_id]
            elif replaced.resume_deadline is not None and now >= replaced.resume_deadline:
                del self._replaced[task_id]
                await self._end_resume_watch(replaced, replaced.state, None)
        for watch in list(self._watches.values()):
            check = watch.env_check
            if check is not None and not check.done and now >= check.deadline:
                await self._env_check_timed_out(watch, check)
            if watch.resume is not None and watch.resume_deadline and now >= watch.resume_deadline:
                await self._end_resume_watch(watch, watch.state, None)
            if watch.closed:
                if watch.resume is None:
                    self._forget(watch)
                continue
            if watch.hang is None or watch.hang_handling:
                continue
            verdict = watch.hang.check(now)
            if verdict is not None:
                watch.hang_handling = True
                self._spawn(self._on_hang(watch, verdict.idle_s, verdict.last_log_at))

    async def _env_check_timed_out(self, watch: _Watch, check: _EnvCheck) -> None:
        """Workers that never finished their check: a warning each (R-31), then finish."""
        missing = [
            w for w in range(worker_count(watch.state.spec)) if w not in check.finished_workers
        ]
        detail = f"the env check did not finish within {self.env_check_timeout_s:.0f} s"
        commands: list[Command] = [
            ReportEnvCheckItem(watch.task_id, w, "runtime", "fail", detail) for w in missing
        ]
        check.finished_workers.update(missing)
        await self._decide_quietly(watch.task_id, commands, self._env_check_cause(watch))
        await self._finish_env_check(watch, check)

    async def _on_hang(self, watch: _Watch, idle_s: float, last_log_at: datetime | None) -> None:
        """R-33 then R-32: HangDetected, the stacks, and a restart or, with none left, the
        failure; what follows the hang names it as its cause."""
        task_id, run, attempt = watch.task_id, watch.run, watch.attempt
        try:
            hang = HangDetected(run=run, attempt=attempt, idle_s=idle_s, last_log_at=last_log_at)
            recorded = await self._decide_quietly(
                task_id, [Record(task_id, hang)], self._because(watch)
            )
            if not recorded:
                return
            why = after(recorded[0])
            try:
                await self._capture(task_id, run, attempt, "hang", why)
            except StacksUnavailable as exc:
                log.info("%s hung; no stacks: %s", task_id, exc)
            state = await self._load(task_id)
            if state is None or (state.run, state.attempt) != (run, attempt):
                return
            refusal = restart_refusal(state, "hang")
            command: Command
            if refusal is None:
                command = ScheduleRestart(task_id, "hang")
            else:
                log.info("%s hung; no restart: %s", task_id, refusal)
                command = Fail(task_id, hang_failure_reason(state))
            await self._decide_quietly(task_id, [command], why, still=(run, attempt, "running"))
        finally:
            watch.hang_handling = False

    async def request_stacks(self, task_id: str, meta: Metadata) -> StackReport:
        """Stacks on demand (API/CLI, R-33): ask the deployer to capture the current
        attempt's stacks and answer the report once its `StacksCaptured` is recorded.

        `meta` is the request's (the caller as actor, the request id as causation and
        correlation): the event carries it. Raises `StacksUnavailable` when the task
        has no placed workers, the command cannot be sent, or no answer comes within
        `stacks_wait_s`."""
        state = await self._load(task_id)
        if state is None or state.status not in PLACED_STATUSES:
            raise StacksUnavailable(f"task {task_id} has no worker processes", timed_out=False)
        return await self._capture(task_id, state.run, state.attempt, "request", meta)

    async def _capture(
        self,
        task_id: str,
        run: int,
        attempt: int,
        reason: Literal["hang", "request"],
        meta: Metadata,
    ) -> StackReport:
        """Send `CaptureStacks` for the attempt and wait for its `StacksCaptured`; the
        report is stored before it is answered."""
        if self.deployer is None:
            raise StacksUnavailable("no deployer to send the capture to", timed_out=False)
        stream = task_stream(task_id)
        since = await self.store.stream_version(stream)
        now = self.clock()
        command = CaptureStacks(
            task_id=task_id,
            run=run,
            attempt=attempt,
            report_id=self.ids(),
            reason=reason,
            requested_at=now,
            expires_at=now + timedelta(seconds=self.stacks_wait_s),
            actor=meta.actor,
            causation_id=meta.causation_id,
            correlation_id=meta.correlation_id,
            trace_context=dict(meta.trace_context),
        )
        try:
            async with asyncio.timeout(SEND_TIMEOUT_S):
                await self.deployer.send(command)
        except Exception as exc:
            message = f"the capture command could not be sent: {type(exc).__name__}: {exc}"
            raise StacksUnavailable(message, timed_out=False) from exc
        captured = await self._await_captured(stream, command.report_id, since)
        if captured is None:
            message = f"no deployer answered within {self.stacks_wait_s:.0f} s"
            raise StacksUnavailable(message, timed_out=True)
        return await self._keep_report(task_id, captured)

    async def _await_captured(
        self, stream: str, report_id: str, since: int
    ) -> RecordedEvent[StacksCaptured] | None:
        """The `StacksCaptured` of `report_id` once it is in the stream (None: not in time)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.stacks_wait_s
        while True:
            for recorded in await self.store.read_stream(stream, since + 1):
                payload = recorded.event
                if isinstance(payload, StacksCaptured) and payload.report_id == report_id:
                    return cast(RecordedEvent[StacksCaptured], recorded)
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(STACKS_POLL_S)

    async def _keep_report(
        self, task_id: str, captured: RecordedEvent[StacksCaptured]
    ) -> StackReport:
        """Store the report of a capture (once: a report id is stored only the first time)."""
        report = report_of(task_id, captured)
        if self.reports is not None:
            await self.reports.save(report)
        return report

    async def drain(self) -> None:
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_log_failure)

    # -- decisions -----------------------------------------------------------------

    def _meta(self, cause: RecordedEvent[Event]) -> Metadata:
        return Metadata(actor=ACTOR).caused_by(cause, ACTOR)

    def _because(self, watch: _Watch) -> Because:
        """What a detection in the running attempt follows from: its TaskRunning."""
        return Because(TaskRunning, watch.run, watch.attempt)

    def _env_check_cause(self, watch: _Watch) -> Because:
        return Because(EnvCheckStarted, watch.run, watch.attempt)

    async def _load(
        self, task_id: str, delivered: RecordedEvent[Event] | None = None
    ) -> TaskState | None:
        """The task's state: the one kept here with the events recorded since folded
        on (read from the store), or, for a `delivered` event, the kept state up to it
        with no read at all when nothing lies between them. None: no such task."""
        known = self._states.get(task_id)
        folded = known.version if known is not None else 0
        state = known
        if delivered is not None and known is not None and folded >= delivered.stream_version:
            return known
        if delivered is not None and delivered.stream_version == folded + 1:
            state = evolve(known, delivered)
            if _ends_the_watch(known, state) and not await self._held(delivered):
                return known  # a message the log does not hold ends nothing
        else:
            for recorded in await self.store.read_stream(task_stream(task_id), folded + 1):
                state = evolve(state, recorded)
        if state is None:
            return None
        if state.finished:
            self._states.pop(task_id, None)
        elif state.version > self._kept_version(task_id):
            self._states[task_id] = state
        return state

    def _kept_version(self, task_id: str) -> int:
        kept = self._states.get(task_id)
        return kept.version if kept is not None else 0

    async def _decide_quietly(
        self,
        task_id: str,
        commands: Sequence[Command],
        why: Why,
        still: tuple[int, int, str] | None = None,
    ) -> list[NewEvent[Event]]:
        """Decide `commands` in order on the task's current state and append them together;
        a refusal (finished, stale attempt) means there is nothing to do. The events appended.

        `still` (run, attempt, status): decide only while the task is there (a hang's
        verdict must not fail an attempt that replaced the hung one meanwhile).
        """
        decision = TaskCommands(
            task_id,
            commands,
            why if isinstance(why, Metadata) else partial(_metadata_of, why),
            self.clock,
            ids=self.ids,
            only_if=None if still is None else partial(_is_at, still),
            log_refusals=log,
        )
        async with self._locks.hold(task_id):
            return await decide_and_append(
                self.store, task_stream(task_id), decision, attempts=MAX_CONFLICT_RETRIES
            )


def _ends_the_watch(before: TaskState | None, after: TaskState) -> bool:
    """Whether a delivered event folded without a read ends what the service watches of
    the task (the run finished, or another attempt or run began): it is folded so only
    as the log holds it, since a later event of that version is not read again."""
    if before is None:
        return after.finished
    return after.finished or (after.run, after.attempt) != (before.run, before.attempt)


def _is_at(where: tuple[int, int, str], state: TaskState | None) -> bool:
    """Whether the task is still at (run, attempt, status) `where`."""
    return state is not None and (state.run, state.attempt, state.status) == where


def _follows_a_run(state: TaskState, cause: RecordedEvent[Event] | None) -> bool:
    """Whether an earlier attempt of this run already ran (so this one should resume)."""
    if state.attempt <= 1 or state.started_at is None:
        return False
    if cause is not None and isinstance(cause.event, TaskRunning):
        return bool(state.started_at < cause.occurred_at)
    return bool(state.restarts > 0 or state.reschedules > 0)


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("fault-tolerance background work failed", exc_info=task.exception())


def hang_failure_reason(state: TaskState) -> str:
    """Why a hung task fails instead of restarting (R-32, R-33)."""
    if not state.spec.fault_tolerance.auto_restart:
        return "hang, auto restart is off"
    return "hang, no restarts left"


def _metadata_of(why: Because, events: Sequence[RecordedEvent[Event]]) -> Metadata:
    cause = why.find(events)
    if cause is None:
        return Metadata(actor=why.actor)
    return Metadata(actor=why.actor).caused_by(cause, why.actor)


def _resume_matcher(task_id: str, pattern: str | None) -> ResumeMatcher:
    """The task's resume matcher; a pattern RE2 refuses (a spec accepted before patterns
    were checked) is left out, with a log line, and the built-in patterns still apply."""
    try:
        return ResumeMatcher(pattern)
    except UserPatternError as exc:
        log.warning("%s: resume_pattern ignored: %s", task_id, exc)
        return ResumeMatcher(None)
