"""The deployer's application layer: placement in, running workers and their outcome out.

Reactions (`handle`, the IdempotentConsumer's handler; each starts background
work and returns at once, so a long deployment never holds the consumer):

- `TaskPlaced` of the task's current attempt: the four deploy stages in order
  (R-20), each `DeployStageStarted` then `DeployStageCompleted` (with its
  duration) or `DeployStageFailed` (with the runtime's reason; the domain
  fails the run with it); a completion and the next stage's start are one
  append. Then, when the spec asks for no env check (or once
  `EnvCheckFinished` passed), every worker starts at once (gang) and one
  append records all `WorkerStarted` (the domain adds `TaskRunning`).
- a worker exits: `WorkerExited` with its code, at the time it exited (from
  its status file); the domain decides the outcome (R-21). A non-zero exit
  ends the worker's peers, whose exits are recorded too (they hold the run's
  GPUs until then). Once every worker is gone and recorded the runtime cleans
  up (scratch removed, R-22). A store outage is waited out: nothing the
  deployer saw is dropped, and no scratch is removed before its exit is in
  the log.
- `TaskStopRequested`: no new stage starts, every process group is ended
  (SIGTERM, SIGKILL after the grace period), then `TaskStopped` (R-23).
- `TaskRestartScheduled` (a new attempt of the same run, R-32): the old
  attempt's workers are ended if any are left, their exits recorded as
  `WorkerExited` of the old attempt (it decides nothing), and after `delay_s`
  (counted from the event's time, capped by `max_restart_delay_s` when set)
  the same placement is deployed again as the new attempt: stages, then
  workers. Never before those exits are in the log: the new attempt waits for
  the old deployment's driver, which returns once every exit is recorded.
- `TaskRescheduleRequested` (with its `TaskRestartScheduled`, reason
  `hardware_fault`, whose attempt has no placement): the attempt's workers are
  ended (they leave the faulty nodes) and nothing is redeployed; the
  scheduler's `TaskPlaced` for the restart's attempt then deploys it like any
  placement (ending the old attempt first if it is still there).
- `TaskPreempted` (spot capacity reclaimed): the run's workers are ended. For
  a reschedule and a preemption alike their exits are recorded as
  `WorkerExited` of that attempt, and the task's GPUs are released (by the
  scheduler) only after the last of them.
- `EnvCheckStarted` of the deployment being driven (R-30): the runtime runs
  the env check program in every worker (`start_env_check`); its lines go to
  `on_output` like worker lines, and the fault-tolerance service turns them
  into events. The deployer appends no env check event; the launch command
  waits for `EnvCheckFinished` (pass or warn).

Commands (`capture_stacks`, from the deployer's command topic): a
`CaptureStacks` for an attempt this deployer holds dumps its workers' stacks
and appends `StacksCaptured` with the command's metadata (R-33).

After a restart of the deployer, `reconcile` (called once before the
consumer starts) compares what the log says with what the runtime holds; see
its docstring and docs/deployer.md. While it runs, `sweep` (every `SWEEP_S`)
reads the log on from where it last stopped and acts on a placement or a stop
request the consumer never handed it (`SWEPT`), found undelivered at two
sweeps in a row: an event a consumer had to give up on (after a broker loss,
runyard.messaging.consumer) costs a delay, not a task.

Every decision goes through `runyard.domain.task.decide` on the task's state
folded from its stream, and is appended with the version it read; a
`ConcurrencyError` means another writer moved on: read again, decide again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent
from runyard.contracts.commands import CaptureStacks
from runyard.contracts.stacks import bounded, by_worker, digest
from runyard.contracts.task_events import (
    DEPLOY_STAGES,
    DeployStageName,
    EnvCheckFinished,
    EnvCheckStarted,
    StacksCaptured,
    TaskFailed,
    TaskPlaced,
    TaskPreempted,
    TaskRerunRequested,
    TaskRescheduleRequested,
    TaskRestartScheduled,
    TaskStopRequested,
    TaskSubmitted,
)
from runyard.deployer.retry import STORE, until_done
from runyard.deployer.runtime import (
    UNKNOWN_EXIT_CODE,
    Deployment,
    DeploymentKey,
    OnOutput,
    OutputLine,
    Runtime,
    StageFailed,
    free_port,
)
from runyard.domain.errors import DomainError
from runyard.domain.task import (
    PLACED_STATUSES,
    Command,
    CompleteStage,
    ConfirmStop,
    ExitWorker,
    Fail,
    FailStage,
    Record,
    StartStage,
    StartWorker,
    TaskState,
    evolve,
    fold,
)
from runyard.eventstore import (
    AppendRequest,
    AppendResult,
    Decision,
    PostgresAllReader,
    PostgresEventStore,
    StreamLocks,
    TaskCommands,
    decide_and_append,
)

log = logging.getLogger("runyard.deployer")

#: Seconds between anti-entropy sweeps (`DeployerApp.sweep`).
SWEEP_S = 15.0
#: Events the sweep reads from the log per query.
SWEEP_BATCH = 1000

#: What a masked creator-only value reads as in messages (as in API answers).
MASK = "******"
#: The kernel's limit on one argument of a new process (MAX_ARG_STRLEN).
MAX_ARG_BYTES = 128 * 1024

ACTOR = "service:deployer"
MAX_CONFLICT_RETRIES = 8
Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _no_ids() -> str:
    raise RuntimeError("deployer decisions never create ids")


def task_stream(task_id: str) -> str:
    return f"task-{task_id}"


async def _discard(line: OutputLine) -> None:
    return None


@dataclass
class _Active:
    """One deployment this deployer is driving."""

    deployment: Deployment
    task: asyncio.Task[None] | None = None
    stopping: bool = False
    #: Set once the WorkerStarted events are appended (or could not be): exits wait for it.
    started_recorded: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set when the env check passed (or none is needed): workers may start.
    may_start: asyncio.Event = field(default_factory=asyncio.Event)
    failed_worker: int | None = None
    #: Metadata for what this deployment appends: caused by its TaskPlaced (R-62).
    meta: Metadata | None = None
    #: The env check program was started in the workers (R-30).
    env_check_started: bool = False
    #: The task's stream as of this deployer's last decision (None: read it again).
    #: Decisions start from it instead of reading the stream each time; one that
    #: another writer made stale conflicts on append and is decided again on a
    #: fresh read.
    events: list[RecordedEvent[Event]] | None = None


#: The task events the deployer reacts to; the consumer skips every other type
#: before any database work (see `handle`, which dispatches on exactly these).
REACTS_TO = frozenset(
    t.type_name()
    for t in (
        TaskPlaced,
        TaskStopRequested,
        TaskRestartScheduled,
        TaskRescheduleRequested,
        TaskPreempted,
        EnvCheckStarted,
        EnvCheckFinished,
        TaskFailed,
    )
)
#: The events the sweep makes sure were acted on: those that start or stop work
#: (a missed one would leave a task placed, or running, for ever).
SWEPT = frozenset(t.type_name() for t in (TaskPlaced, TaskStopRequested))


class DeployerApp:
    """Drives deployments through a `Runtime`; see the module docstring."""

    def __init__(
        self,
        store: PostgresEventStore,
        runtime: Runtime,
        *,
        on_output: OnOutput = _discard,
        clock: Clock = _utcnow,
        stop_grace_s: float | None = None,
        max_restart_delay_s: float | None = None,
    ) -> None:
        self.store = store
        self.runtime = runtime
        self.on_output = on_output
        self.clock = clock
        self.stop_grace_s = stop_grace_s
        #: Upper bound on a restart's delay (None: the event's `delay_s` as is).
        self.max_restart_delay_s = max_restart_delay_s
        self._active: dict[str, _Active] = {}
        self._locks = StreamLocks()  # one decision at a time per task
        self._background: set[asyncio.Task[Any]] = set()
        #: Restarts waiting out their delay, woken early by a stop.
        self._waiting: dict[str, asyncio.Event] = {}
        self._detached = False
        #: The sweep (see the module): where it read the log to, the events of `SWEPT`
        #: it found not handed over yet (task id, version, type) at the last sweep and
        #: in this one so far (kept when a sweep fails midway, an outage), and the
        #: events handed over (task id, version) with when, kept for three sweeps.
        self.sweep_s = SWEEP_S
        self._swept: PostgresAllReader | None = None
        self._sighted: list[tuple[str, int, str]] = []
        self._fresh: list[tuple[str, int, str]] = []
        self._delivered: dict[tuple[str, int], float] = {}

    # -- reactions ---------------------------------------------------------------

    async def handle(self, event: RecordedEvent[Event], conn: Any = None) -> None:
        """React to one task event (the IdempotentConsumer's handler)."""
        if not event.stream_id.startswith("task-") or event.type not in REACTS_TO:
            return
        task_id = event.stream_id.removeprefix("task-")
        if event.type in SWEPT:
            self._delivered[(task_id, event.stream_version)] = time.monotonic()
        payload = event.event
        if isinstance(payload, TaskPlaced):
            self._spawn(self._on_placed(task_id, payload, event))
        elif isinstance(payload, TaskStopRequested):
            wake = self._waiting.get(task_id)
            if wake is not None:
                wake.set()
            self._spawn(self._on_stop(task_id, event))
        elif isinstance(payload, TaskRestartScheduled):
            self._spawn(self._on_restart(task_id, payload, event))
        elif isinstance(payload, TaskRescheduleRequested):
            self._spawn(self._on_reschedule(task_id, payload, event))
        elif isinstance(payload, TaskPreempted):
            self._spawn(self._on_preempted(task_id, payload, event))
        elif isinstance(payload, EnvCheckStarted):
            active = self._active.get(task_id)
            if active is not None and active.deployment.key == (
                task_id,
                payload.run,
                payload.attempt,
            ):
                self._spawn(self._start_env_check(active))
        elif isinstance(payload, EnvCheckFinished) and payload.result != "fail":
            active = self._active.get(task_id)
            if active is not None and active.deployment.attempt == payload.attempt:
                active.may_start.set()
        elif isinstance(payload, TaskFailed):
            # a failure decided elsewhere (a hang with no restart left) while workers
            # still run: they end with their run (a worker's own exit already did)
            active = self._active.get(task_id)
            if active is not None and not active.stopping:
                self._spawn(self._end_if_recorded(active, event))

    # -- anti-entropy ----------------------------------------------------------------

    async def sweep_forever(self) -> None:
        """`sweep` every `sweep_s` until cancelled (an outage is waited out)."""
        while True:
            await asyncio.sleep(self.sweep_s)
            await until_done(self.sweep, what="the deployer's sweep of the log")

    async def sweep(self) -> list[str]:
        """Act on what the consumer should have handed over and did not; the task ids.

        Reads the log on from where the last sweep stopped (its first call only
        marks the log's head: what came before, `reconcile` took over). An event of
        `SWEPT` found at one sweep and still not handed over at the next (so not one
        on its way through the broker) is read from its stream and handled as the
        consumer would have: the reactions check the task's state, so one that was
        acted on meanwhile does nothing. Logged as a warning: a healthy platform
        never needs it. What it costs grows with what was appended since the last
        sweep, not with the log."""
        if self._swept is None:
            self._swept = self.store.all_reader(await self.store.head_position())
            return []
        async for rows in self._swept.heads(SWEEP_BATCH):
            self._fresh += [
                (row["stream_id"].removeprefix("task-"), row["stream_version"], row["event_type"])
                for row in rows
                if row["event_type"] in SWEPT and row["stream_id"].startswith("task-")
            ]
        acted: list[str] = []
        for task_id, version, kind in self._sighted:
            if (task_id, version) in self._delivered:
                continue
            found = await self.store.read_stream(task_stream(task_id), version, 1)
            if not found:
                continue
            log.warning(
                "deployer: %s of task %s (version %d) never reached it; acting on it now",
                kind,
                task_id,
                version,
            )
            await self.handle(found[0])
            acted.append(task_id)
        self._sighted = [s for s in self._fresh if (s[0], s[1]) not in self._delivered]
        self._fresh = []
        horizon = time.monotonic() - 3 * self.sweep_s
        self._delivered = {k: at for k, at in self._delivered.items() if at >= horizon}
        return acted

    # -- commands ------------------------------------------------------------------

    async def capture_stacks(self, command: CaptureStacks) -> StacksCaptured | None:
        """Carry out a `CaptureStacks` command (R-33): dump the stacks of the attempt's
        workers and append `StacksCaptured` with the command's metadata.

        Nothing is done for a command that expired (its asker stopped waiting) or whose
        attempt this deployer does not hold (another node agent's, or already ended);
        None then, or when the attempt changed before the append."""
        if command.expired(self.clock()):
            log.info("%s: stack capture %s expired; skipped", command.task_id, command.report_id)
            return None
        key = (command.task_id, command.run, command.attempt)
        if key not in self.runtime.deployments():
            return None
        stacks = await self.runtime.capture_stacks(key)
        if not stacks:
            return None
        kept, note = bounded(stacks)
        captured = StacksCaptured(
            run=command.run,
            attempt=command.attempt,
            workers=tuple(w.worker for w in stacks),
            report_id=command.report_id,
            summary=digest(by_worker(stacks)).summary,
            stacks=kept,
            note=note,
        )
        record = Record(command.task_id, captured)
        appended = await self._decide_quietly(command.task_id, [record], command.metadata())
        return captured if appended else None

    async def drain(self) -> None:
        """Wait until all background work (deployments, stops) has finished."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def close(self, *, record_within_s: float = 10.0, keep_workers: bool = False) -> None:
        """Stop every deployment this deployer drives (service shutdown).

        The workers are ended and their exits recorded as usual. What cannot be recorded
        within `record_within_s` (the store is away) is left exactly as a crash leaves
        it: exit statuses and output stay in the workers' scratch, and the next
        deployer's `reconcile` records them. Shutdown never removes the scratch of a
        worker whose exit is not in the log. With `keep_workers` (a deployer stopped
        to be replaced: an upgrade, a rollout) no worker is touched: everything is left
        as a crash leaves it, and the next deployer adopts the workers and records
        their exits, so a stop costs no task.
        """
        if keep_workers:
            self.detach()
            return
        for active in list(self._active.values()):
            active.stopping = True
            await self.runtime.stop(active.deployment.key, self.stop_grace_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + record_within_s
        while self._background and loop.time() < deadline:
            # asyncio.wait, not wait_for: a timeout must not cancel the drivers (a
            # cancelled driver would clean up what is not recorded yet)
            await asyncio.wait(list(self._background), timeout=deadline - loop.time())
        if self._background:
            log.warning(
                "shutting down with %d deployment(s) not fully recorded: their exit "
                "statuses and output stay on disk for the next deployer",
                len(self._active),
            )
            self.detach()

    def detach(self) -> None:
        """Drop everything without touching a worker: what a crash of the deployer does.

        The workers keep running; a new deployer finds them with `reconcile`.
        """
        self._detached = True
        for task in list(self._background):
            task.cancel()
        detach = getattr(self.runtime, "detach", None)
        if detach is not None:
            detach()
        self._active.clear()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_log_failure)

    # -- placement -> stages -> workers --------------------------------------------

    async def _on_placed(
        self, task_id: str, placed: TaskPlaced, cause: RecordedEvent[Event]
    ) -> None:
        active = self._active.get(task_id)
        if active is not None:
            if (active.deployment.run, active.deployment.attempt) >= (placed.run, placed.attempt):
                return  # a redelivery of the placement being deployed
            await self._end(active)  # an older attempt (e.g. before a reschedule)
        state = await self._load(task_id)
        if (
            state is None
            or (state.run, state.attempt) != (placed.run, placed.attempt)
            or state.status not in PLACED_STATUSES
            or state.stop_requested
            or state.stages_done
            or state.stage is not None
            or any(w.started for w in state.workers)
            or state.placement is None
        ):
            return  # stale, finished, or already deployed before (see reconcile)
        # Where the workers go is the log's word (the message only says to look).
        workers = state.placement.workers
        deployment = Deployment(task_id, placed.run, placed.attempt, state.spec, workers)
        await self._drive(deployment, state, Metadata(actor=ACTOR).caused_by(cause, ACTOR))

    async def _end(self, active: _Active) -> None:
        """End the workers of a deployment and wait until its driver has cleaned up."""
        active.stopping = True
        active.may_start.set()
        await self.runtime.stop(active.deployment.key, self.stop_grace_s)
        if active.task is not None and active.task is not asyncio.current_task():
            await asyncio.gather(active.task, return_exceptions=True)

    def _register(self, deployment: Deployment, state: TaskState, meta: Metadata) -> _Active | None:
        """The deployment as this deployer's to drive; None when one of the task is driven."""
        if deployment.task_id in self._active:
            return None
        active = _Active(deployment, meta=meta)
        check = state.env_check
        if not state.spec.fault_tolerance.env_check or (
            check is not None and check.finished and check.result != "fail"
        ):
            active.may_start.set()
        self._active[deployment.task_id] = active
        return active

    async def _drive(
        self,
        deployment: Deployment,
        state: TaskState,
        meta: Metadata,
        *,
        adopted: _Active | None = None,
    ) -> None:
        """Deploy (or, after a restart, resume) one attempt, or follow an adopted one."""
        task_id = deployment.task_id
        active = adopted or self._register(deployment, state, meta)
        if active is None:
            return
        active.task = asyncio.current_task()
        try:
            if adopted is not None:
                await self._adopt(active, state, meta)
            else:
                await self._deploy(active, meta, state)
        finally:
            if not self._detached:
                with contextlib.suppress(Exception):
                    await self.runtime.cleanup(deployment.key)
            active.started_recorded.set()
            if self._active.get(task_id) is active:
                del self._active[task_id]

    def _given_gpus(self, key: DeploymentKey) -> dict[int, tuple[int, ...]]:
        """The GPUs the runtime gave each started worker where it picks them (Slurm), by
        worker index; recorded in `WorkerStarted` where they are not the placement's."""
        given_gpus = getattr(self.runtime, "given_gpus", None)
        return given_gpus(key) if given_gpus is not None else {}

    async def _adopt(self, active: _Active, state: TaskState, meta: Metadata) -> None:
        """Watch workers an earlier deployer started; record starts the log missed."""
        d = active.deployment
        unrecorded = [w.index for w in state.workers if not w.started]
        # Each start at the time it happened (an exit right after keeps its own time).
        start_times = getattr(self.runtime, "start_times", None)
        times = start_times(d.key) if start_times is not None else {}
        now = self.clock()
        try:
            given = self._given_gpus(d.key)
            for i in sorted(unrecorded, key=lambda i: times.get(i, now)):
                start = StartWorker(d.task_id, d.run, d.attempt, i, gpus=given.get(i))
                await self._decide(d.task_id, [start], meta, at=times.get(i))
        except DomainError as exc:
            log.info("adopted workers of %s not recorded: %s", d.task_id, exc)
            active.stopping = True
        finally:
            active.started_recorded.set()
        if active.stopping:
            await self.runtime.stop(d.key, self.stop_grace_s)
        await self._wait_workers(d.key)

    async def _deploy(self, active: _Active, meta: Metadata, state: TaskState) -> None:
        d = active.deployment

        async def init_env(deployment: Deployment) -> None:
            async def resolve() -> dict[str, str]:
                return await self._creator_values(deployment.task_id)

            # a store outage here waits (a missing value still fails the stage at once)
            values = await until_done(resolve, what=f"reading the secrets of {d.task_id}")
            active.deployment = replace(deployment, creator_values=values)
            await self.runtime.init_env(active.deployment)

        steps = {
            "resource_allocation": self.runtime.allocate,
            "image_pull": self.runtime.pull_image,
            "storage_mount": self.runtime.mount_storage,
            "env_init": init_env,
        }
        slots = getattr(self.runtime, "stage_slots", None)
        turns = slots(d) if slots is not None else None
        # This machine's turns are shared by tenants: another's burst is no queue to wait in.
        async with turns.turn(state.tenant) if turns is not None else contextlib.nullcontext():
            if not await self._stages(active, state, steps, meta):
                return
        if not active.may_start.is_set():
            check = (await self._load(d.task_id) or state).env_check
            if check is not None and not check.finished:
                # the check began before a deployer restart: its program runs again
                self._spawn(self._start_env_check(active))
            await self._wait_for_start(active)
        if active.stopping:
            return
        d = active.deployment  # with the creator-only values env_init resolved
        try:
            end_env_check = getattr(self.runtime, "end_env_check", None)
            if active.env_check_started and end_env_check is not None:
                await end_env_check(d.key)  # finished (its lines are out); kill any straggler
            await self.runtime.start_workers(d, self.on_output, self._on_exit)
            # The start's own time: a store outage may delay its record, and a worker's
            # exit is never recorded as before its start.
            started_at = self.clock()
        except Exception as exc:
            # Never a task left in deploying: the attempt fails (its GPUs are released).
            reason = _masked(d, f"workers could not start (stage {START_STAGE}): {_why(exc, d)}")
            log.error("%s: %s", d.task_id, reason)
            await self._decide_quietly(d.task_id, [Fail(d.task_id, reason)], meta)
            return
        try:
            given = self._given_gpus(d.key)
            commands = [
                StartWorker(d.task_id, d.run, d.attempt, w.index, gpus=given.get(w.index))
                for w in d.workers
            ]
            await self._decide(d.task_id, commands, meta, at=started_at)
        except DomainError as exc:  # stopped meanwhile: the stop ends them
            log.info("workers of %s started but not recorded: %s", d.task_id, exc)
            active.stopping = True
        finally:
            active.started_recorded.set()
        if active.stopping:
            await self.runtime.stop(d.key, self.stop_grace_s)
        await self._wait_workers(d.key)

    async def _stages(
        self, active: _Active, state: TaskState, steps: dict[str, Any], meta: Metadata
    ) -> bool:
        """The four deploy stages in order; False when the deployment must not go on."""
        started_next = False  # the stage was started with the previous one's completion
        for i, stage in enumerate(DEPLOY_STAGES):
            if active.stopping and not started_next:
                return False
            if stage in state.stages_done:  # resumed after a restart: prepare it again
                ok = await self._redo(active, stage, steps[stage], meta)
                started_next = False
            else:
                # started before a restart (finish it), or with the previous one
                running = started_next or stage == state.stage
                then = DEPLOY_STAGES[i + 1] if i + 1 < len(DEPLOY_STAGES) else None
                ok = await self._stage(
                    active, stage, steps[stage], meta, started=running, then=then
                )
                started_next = then is not None
            if not ok:
                return False
        return True

    async def _start_env_check(self, active: _Active) -> None:
        """Run the env check program in every worker (R-30), once per deployment.

        The deployer appends no env check event: the fault-tolerance service reads the
        program's lines from the logs topic and decides; the launch command waits for
        its `EnvCheckFinished` (pass or warn).
        """
        start = getattr(self.runtime, "start_env_check", None)
        if active.env_check_started or active.stopping or active.may_start.is_set():
            return
        if start is None:
            log.warning("%s: this runtime cannot run the env check", active.deployment.task_id)
            return
        active.env_check_started = True
        port = free_port(0)
        d = active.deployment
        try:
            await start(d, self.on_output, port=port)
        except Exception as exc:
            # As for the workers: the attempt fails now rather than wait for a timeout.
            reason = _masked(d, f"the env check could not start (stage env_check): {_why(exc, d)}")
            log.error("%s: %s", d.task_id, reason)
            meta = active.meta or Metadata(actor=ACTOR)
            await self._decide_quietly(d.task_id, [Fail(d.task_id, reason)], meta)
            active.stopping = True
            active.may_start.set()

    async def _wait_for_start(self, active: _Active) -> None:
        while not active.stopping and not active.may_start.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await active.may_start.wait()

    async def _wait_workers(self, key: DeploymentKey) -> None:
        wait = getattr(self.runtime, "wait", None)
        if wait is not None:
            await wait(key)

    async def _redo(
        self, active: _Active, stage: DeployStageName, step: Any, meta: Metadata
    ) -> bool:
        """Do a stage the log already has as completed again, without events."""
        d = active.deployment
        try:
            await step(d)
        except Exception as exc:
            why = exc.reason if isinstance(exc, StageFailed) else f"{type(exc).__name__}: {exc}"
            reason = _masked(
                active.deployment,
                f"deploy stage {stage} could not be prepared again after a deployer restart: {why}",
            )
            await self._decide_quietly(d.task_id, [Fail(d.task_id, reason)], meta)
            return False
        return True

    async def _stage(
        self,
        active: _Active,
        stage: DeployStageName,
        step: Any,
        meta: Metadata,
        *,
        started: bool = False,
        then: DeployStageName | None = None,
    ) -> bool:
        """Run one stage with its events; False when the deployment must not go on.

        `then`: the stage that follows, started in the same append as this one's
        completion (one write instead of two; the next stage starts at that moment)."""
        d = active.deployment
        try:
            if not started:
                await self._decide(d.task_id, [StartStage(d.task_id, stage)], meta)
        except DomainError as exc:
            log.info("%s: stage %s not started: %s", d.task_id, stage, exc)
            return False
        if active.stopping:  # stopped before its step began
            reason = "the task is being stopped"
            await self._decide_quietly(d.task_id, [FailStage(d.task_id, stage, reason)], meta)
            return False
        try:
            await step(d)
        except StageFailed as failed:
            reason = _masked(active.deployment, failed.reason)
            await self._decide_quietly(d.task_id, [FailStage(d.task_id, stage, reason)], meta)
            return False
        except Exception as exc:
            reason = _masked(active.deployment, f"{type(exc).__name__}: {exc}")
            log.error("%s: stage %s failed: %s", d.task_id, stage, reason)
            await self._decide_quietly(d.task_id, [FailStage(d.task_id, stage, reason)], meta)
            return False
        if active.stopping:
            reason = "the task is being stopped"
            await self._decide_quietly(d.task_id, [FailStage(d.task_id, stage, reason)], meta)
            return False
        commands: list[Command] = [CompleteStage(d.task_id, stage)]
        if then is not None:
            commands.append(StartStage(d.task_id, then))
        try:
            await self._decide(d.task_id, commands, meta)
        except DomainError as exc:
            log.info("%s: stage %s not completed: %s", d.task_id, stage, exc)
            return False
        return True

    async def _on_exit(
        self, key: DeploymentKey, worker: int, exit_code: int, exited_at: datetime | None = None
    ) -> None:
        """Record a worker's exit at the time it happened; returns once it is in the log.

        The runtime keeps the worker's exit status and output until this returns (its
        cleanup comes after), so a store outage delays the record, never loses it.
        """
        task_id, run, attempt = key
        active = self._active.get(task_id)
        if active is not None and active.deployment.key != key:
            active = None
        if active is not None:
            await active.started_recorded.wait()
        meta = (active.meta if active is not None else None) or Metadata(actor=ACTOR)
        await self._decide_quietly(
            task_id, [ExitWorker(task_id, run, attempt, worker, exit_code)], meta, at=exited_at
        )
        if exit_code != 0 and active is not None and not active.stopping:
            # the first failing worker decides the run; its peers end with it.
            active.failed_worker = worker
            active.stopping = True
            self._spawn(self.runtime.stop(key, self.stop_grace_s))

    # -- restart and reschedule ----------------------------------------------------------

    async def _on_restart(
        self, task_id: str, restart: TaskRestartScheduled, cause: RecordedEvent[Event]
    ) -> None:
        """Deploy the same placement again as the new attempt, once the delay is over.

        A restart after a reschedule (reason `hardware_fault`) has no placement: the
        old attempt is ended and the scheduler's `TaskPlaced` deploys the new one.
        """
        active = self._active.get(task_id)
        if active is not None:
            if active.deployment.attempt >= restart.attempt:
                return  # a redelivery: this attempt is being deployed
            # the replaced attempt: its workers go, and their exits are recorded, first
            await self._end(active)
        delay = restart.delay_s
        if self.max_restart_delay_s is not None:
            delay = min(delay, self.max_restart_delay_s)
        due = cause.occurred_at + timedelta(seconds=delay)
        left = (due - self.clock()).total_seconds()
        if left > 0:
            wake = self._waiting.setdefault(task_id, asyncio.Event())
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await wake.wait()
            finally:
                if self._waiting.get(task_id) is wake:
                    del self._waiting[task_id]
        state = await self._load(task_id)
        if (
            state is None
            or (state.run, state.attempt) != (restart.run, restart.attempt)
            or state.status != "restarting"
            or state.placement is None
            or state.stop_requested
            or state.stages_done
            or state.stage is not None
        ):
            return  # stopped, moved on, or already deployed
        deployment = Deployment(
            task_id, state.run, state.attempt, state.spec, state.placement.workers
        )
        await self._drive(deployment, state, Metadata(actor=ACTOR).caused_by(cause, ACTOR))

    async def _on_reschedule(
        self, task_id: str, reschedule: TaskRescheduleRequested, cause: RecordedEvent[Event]
    ) -> None:
        """The attempt's workers leave their (faulty) nodes; the scheduler places them again.

        Their exits are recorded (`WorkerExited` of the withdrawn attempt); the last one
        lets the scheduler release the attempt's GPUs and place the next attempt.
        """
        active = self._active.get(task_id)
        if active is not None and active.deployment.attempt <= reschedule.attempt:
            await self._end_if_recorded(active, cause)

    async def _on_preempted(
        self, task_id: str, preempted: TaskPreempted, cause: RecordedEvent[Event]
    ) -> None:
        """Spot capacity was reclaimed: the run's workers end now, and their exits are
        recorded; the task's GPUs count as free only after the last of them."""
        active = self._active.get(task_id)
        if active is not None and active.deployment.run == preempted.run:
            await self._end_if_recorded(active, cause)

    async def _end_if_recorded(self, active: _Active, cause: RecordedEvent[Event]) -> None:
        """`_end` the deployment, if the log holds `cause` as delivered."""
        if await self._recorded(cause):
            await self._end(active)

    async def _recorded(self, event: RecordedEvent[Event]) -> bool:
        """Whether the log holds `event` as the broker delivered it (id and payload at its
        stream and version; a store outage is waited out). What ends workers is acted
        on only then: a corrupted or forged message ends nothing (logged)."""
        held = partial(self.store.holds_or_says, event, log)
        return await until_done(held, what=f"reading {event.stream_id}")

    # -- reconciliation after a restart ----------------------------------------------------

    async def reconcile(self) -> list[str]:
        """Take over what an earlier deployer process left; the task ids it took over.

        For each task the log says is placed (deploying, env checking, running or
        restarting) on this runtime:

        - its current attempt has workers the runtime found (`recover`): they are
          adopted, never started again; exits that happened meanwhile are recorded from
          the status the worker's wrapper wrote; starts the log missed are recorded;
        - its deployment was cut before the workers started (mid-stage, or never
          begun): it is resumed, stages completed before are prepared again without
          new events, the stage that was running is done and completed, the rest run
          as usual (so a deployer restart does not fail the task);
        - its workers started per the log but the runtime holds nothing of them (the
          machine restarted): each is recorded as exited with `UNKNOWN_EXIT_CODE`,
          which fails (or, with auto restart, restarts) the attempt;
        - a restart waiting out its delay is scheduled for the rest of it;
        - a stop that was asked for is carried out;
        - an attempt that is over (restarted, preempted, rescheduled, failed) with
          workers whose exits are not recorded (`held_live`) is retired: its workers
          found on disk are ended and their exits recorded (`_retire_withdrawn`); a
          restart in place deploys its new attempt once that is done.

        Workers of attempts the log has moved past (or of finished or stopping tasks)
        are ended and their scratch removed.
        """
        recover = getattr(self.runtime, "recover", None)
        found: dict[DeploymentKey, dict[int, int]] = recover() if recover is not None else {}
        tasks = await self._placed_tasks()
        current: set[DeploymentKey] = set()
        for task_id, (state, _) in tasks.items():
            if not state.stop_requested and state.placement is not None and not state.finished:
                current.add((task_id, state.run, state.attempt))
        retired = await self._retire_withdrawn(tasks, found)
        for key in found:
            if key not in current and key not in retired:
                discard = getattr(self.runtime, "discard", None)
                if discard is not None:
                    await discard(key, self.stop_grace_s)
        taken: list[str] = []
        for task_id, (state, cause) in tasks.items():
            meta = Metadata(actor=ACTOR)
            if cause is not None:
                meta = meta.caused_by(cause, ACTOR)
            key = (task_id, state.run, state.attempt)
            if state.finished:
                continue  # only its last exits were left to record (above)
            if state.stop_requested:
                if cause is not None:
                    self._spawn(self._on_stop(task_id, cause))
                continue
            if state.placement is None:
                continue  # waiting for the scheduler (a reschedule)
            placement = state.placement
            deployment = Deployment(
                task_id, state.run, state.attempt, state.spec, placement.workers
            )
            adopt = getattr(self.runtime, "adopt", None)
            if key in found and adopt is not None:
                active = self._register(deployment, state, meta)
                if active is None:
                    continue
                await adopt(deployment, self.on_output, self._on_exit)  # watched from now on
                self._spawn(self._drive(deployment, state, meta, adopted=active))
            elif any(w.started for w in state.workers):
                for worker in state.workers:
                    if worker.started and not worker.exited:
                        lost = ExitWorker(
                            task_id, state.run, state.attempt, worker.index, UNKNOWN_EXIT_CODE
                        )
                        await self._decide_quietly(task_id, [lost], meta)
            elif (
                state.status == "restarting"
                and cause is not None
                and isinstance(cause.event, TaskRestartScheduled)
            ):
                self._spawn(self._on_restart(task_id, cause.event, cause))
            else:
                self._spawn(self._drive(deployment, state, meta))
            taken.append(task_id)
        return taken

    async def _retire_withdrawn(
        self,
        tasks: dict[str, tuple[TaskState, RecordedEvent[Event] | None]],
        found: dict[DeploymentKey, dict[int, int]],
    ) -> set[DeploymentKey]:
        """End the workers of attempts that are over and record their exits.

        An attempt that is over (restarted, preempted, rescheduled, or its run failed)
        whose workers have no recorded exit (`held_live`) keeps its GPUs until they are
        recorded. Found on disk: its workers are followed (their
        output too), ended, and each exit recorded with the status its wrapper wrote.
        Not on disk (the machine restarted): they are gone, recorded as
        `UNKNOWN_EXIT_CODE` (an exit of a withdrawn attempt decides nothing). Returns
        the deployments taken over this way.
        """
        taken: set[DeploymentKey] = set()
        adopt = getattr(self.runtime, "adopt", None)
        for task_id, (state, cause) in tasks.items():
            held = state.held
            if not state.held_live or held is None:
                continue
            run, attempt = state.held_live_of
            key = (task_id, run, attempt)
            # caused by the task's last placement or restart, in its correlation
            meta = Metadata(actor=ACTOR)
            if cause is not None:
                meta = meta.caused_by(cause, ACTOR)
            if key in found and adopt is not None and task_id not in self._active:
                d = Deployment(task_id, run, attempt, state.spec, held.workers)
                active = _Active(d, stopping=True, meta=meta)
                active.started_recorded.set()
                active.may_start.set()
                self._active[task_id] = active
                await adopt(d, self.on_output, self._on_exit)
                self._spawn(self._retire(active))
                taken.add(key)
                continue
            for worker in state.held_live:
                lost = ExitWorker(task_id, run, attempt, worker, UNKNOWN_EXIT_CODE)
                await self._decide_quietly(task_id, [lost], meta)
        return taken

    async def _retire(self, active: _Active) -> None:
        """End an adopted withdrawn attempt; its exits are recorded as they come."""
        active.task = asyncio.current_task()
        key = active.deployment.key
        try:
            await self.runtime.stop(key, self.stop_grace_s)
            await self._wait_workers(key)
        finally:
            if not self._detached:
                with contextlib.suppress(Exception):
                    await self.runtime.cleanup(key)
            if self._active.get(key[0]) is active:
                del self._active[key[0]]

    async def _placed_tasks(
        self,
    ) -> dict[str, tuple[TaskState, RecordedEvent[Event] | None]]:
        """Tasks the log says are placed, with the event that placed or restarted them last,
        and tasks whose withdrawn attempt has workers with no recorded exit (`held_live`).

        Reads the whole log once (a deployer restart is rare; a read model of open
        tasks would make this cheaper).
        """
        states: dict[str, TaskState] = {}
        causes: dict[str, RecordedEvent[Event]] = {}
        head = await self.store.head_position()
        reader = self.store.all_reader(0)
        while reader.position < head:
            batch = await reader.read(1000)
            if not batch:
                await asyncio.sleep(0.01)
                continue
            for recorded in batch:
                if not recorded.stream_id.startswith("task-"):
                    continue
                task_id = recorded.stream_id.removeprefix("task-")
                states[task_id] = evolve(states.get(task_id), recorded)
                if isinstance(recorded.event, TaskPlaced | TaskRestartScheduled):
                    causes[task_id] = recorded
        return {
            task_id: (state, causes.get(task_id))
            for task_id, state in states.items()
            if (not state.finished and state.status in PLACED_STATUSES) or state.held_live
        }

    # -- stop ------------------------------------------------------------------------

    async def _on_stop(self, task_id: str, cause: RecordedEvent[Event]) -> None:
        if not await self._recorded(cause):
            return
        meta = Metadata(actor=ACTOR).caused_by(cause, ACTOR)
        active = self._active.get(task_id)
        if active is not None:
            active.stopping = True
            active.may_start.set()
            await self.runtime.stop(active.deployment.key, self.stop_grace_s)
            if active.task is not None and active.task is not asyncio.current_task():
                await asyncio.gather(active.task, return_exceptions=True)
        state = await self._load(task_id)
        if state is None or state.finished or not state.stop_requested:
            return
        if state.status in PLACED_STATUSES:
            await self._decide_quietly(task_id, [ConfirmStop(task_id)], meta)

    # -- creator-only values (R-12) --------------------------------------------------------

    async def _creator_values(self, task_id: str) -> dict[str, str]:
        """Values of the creator-only variables, by name, for the task's current run.

        Only a run its creator started (submitted, cloned or reran: the actor of the
        run's `TaskSubmitted` / `TaskRerunRequested`) gets them, read from the secret
        store of the task's tenant; a run started by anyone else runs with them unset.
        A creator's run whose value is gone from the store fails `env_init`, naming
        the variables (never a value).
        """
        events = await self.store.read_stream(task_stream(task_id))
        state = fold(events, task_id=task_id)
        wanted = {v.name: v.secret_ref for v in state.spec.env if v.creator_only}
        if not wanted:
            return {}
        starter = _run_starter(events, state.run)
        creator = f"user:{state.tenant}/{state.creator}"
        if starter is None or starter.metadata.actor != creator:
            who = starter.metadata.actor if starter is not None else "nobody known"
            log.info(
                "%s: run %d was started by %s, not by its creator: its creator-only "
                "variables (%s) stay unset",
                task_id,
                state.run,
                who,
                ", ".join(sorted(wanted)),
            )
            return {}
        refs = [ref for ref in wanted.values() if ref]
        rows = await self.store.pool.fetch(
            "SELECT ref, value FROM secrets WHERE tenant = $1 AND ref = ANY($2)",
            state.tenant,
            refs,
        )
        stored = {r["ref"]: r["value"] for r in rows}
        missing = sorted(name for name, ref in wanted.items() if ref not in stored)
        if missing:
            raise StageFailed(
                f"creator-only variable(s) {', '.join(missing)} have no value in the secret "
                "store: clone the task and give them again"
            )
        return {name: stored[ref] for name, ref in wanted.items() if ref is not None}

    # -- decisions -------------------------------------------------------------------

    async def _read(self, task_id: str) -> list[RecordedEvent[Event]]:
        """The task's stream; waits out a store outage."""

        async def read() -> list[RecordedEvent[Event]]:
            return await self.store.read_stream(task_stream(task_id))

        return await until_done(read, what=f"reading task {task_id}")

    async def _load(self, task_id: str) -> TaskState | None:
        events = await self._read(task_id)
        return fold(events, task_id=task_id) if events else None

    async def _decide(
        self,
        task_id: str,
        commands: Sequence[Command],
        meta: Metadata,
        *,
        at: datetime | None = None,
        quietly: bool = False,
    ) -> list[Event]:
        """Decide `commands` in order on the task's current state and append them together.

        `at`: when the fact happened, when it is known (a worker's exit, from its status
        file); the events carry that time rather than the time they are appended. A store
        outage is waited out (retries with backoff): what the deployer saw is recorded
        once the store is back, never given up. `quietly`: see `_decide_quietly`.
        """
        decision = TaskCommands(
            task_id,
            commands,
            meta,
            self.clock,
            ids=_no_ids,
            at=at,
            log_refusals=log if quietly else None,
        )
        active = self._active.get(task_id)
        async with self._locks.hold(task_id):
            cached = active.events if active is not None else None
            try:
                appended, stream = await self._decide_on(task_id, decision, cached)
                if cached is not None and not appended:  # a refusal: never on a stale copy
                    appended, stream = await self._decide_on(task_id, decision, None)
            except DomainError:
                if cached is None:
                    raise
                appended, stream = await self._decide_on(task_id, decision, None)
            if active is not None and self._active.get(task_id) is active:
                active.events = stream
        return [e.event for e in appended]

    async def _decide_on(
        self,
        task_id: str,
        decision: TaskCommands,
        recorded: list[RecordedEvent[Event]] | None,
    ) -> tuple[list[NewEvent[Event]], list[RecordedEvent[Event]] | None]:
        """`decision` on `recorded` (None: the stream read now), appended; the events
        appended and the stream as it is after them (None when not known)."""
        stream_id = task_stream(task_id)
        read: list[list[RecordedEvent[Event]]] = []
        results: list[AppendResult] = []

        def decide(events: list[RecordedEvent[Event]]) -> Decision[list[NewEvent[Event]]]:
            read.append(events)
            return decision(events)

        async def write(requests: list[AppendRequest]) -> None:
            (request,) = requests
            result = await self.store.append(stream_id, request.events, request.expected)
            results.append(result)

        appended = await decide_and_append(
            self.store,
            stream_id,
            decide,
            attempts=MAX_CONFLICT_RETRIES,
            recorded=recorded,
            write=write,
            wait_out_outages=STORE,
        )
        if not appended:
            return appended, read[-1] if read else None
        if not results or len(results[-1].positions) != len(appended):
            return appended, None
        result = results[-1]
        first = result.version - len(appended) + 1
        stored = [
            e.recorded(stream_id, first + i, position)
            for i, (e, position) in enumerate(zip(appended, result.positions, strict=True))
        ]
        return appended, [*read[-1], *stored]

    async def _decide_quietly(
        self,
        task_id: str,
        commands: Sequence[Command],
        meta: Metadata,
        *,
        at: datetime | None = None,
    ) -> list[Event]:
        """`_decide`, where a refusal (finished, stale attempt) means there is nothing to do:
        it is logged and nothing is appended."""
        return await self._decide(task_id, commands, meta, at=at, quietly=True)


#: The name failures to start a deployment's workers give as their stage (after env_init).
START_STAGE = "worker_start"
#: Creator-only values shorter than this are not masked in messages (they would mask
#: ordinary words; a value that short protects nothing).
MIN_MASKED_LENGTH = 4


def _run_starter(events: Sequence[RecordedEvent[Event]], run: int) -> RecordedEvent[Event] | None:
    """The event that started run `run` of a task: its submission or its rerun."""
    found: RecordedEvent[Event] | None = None
    for recorded in events:
        payload = recorded.event
        submitted = isinstance(payload, TaskSubmitted) and run == 1
        if submitted or (isinstance(payload, TaskRerunRequested) and payload.run == run):
            found = recorded
    return found


def _masked(deployment: Deployment, text: str) -> str:
    """`text` with every creator-only value of the deployment replaced by `******`."""
    for value in sorted(deployment.creator_values.values(), key=len, reverse=True):
        if len(value) >= MIN_MASKED_LENGTH:
            text = text.replace(value, MASK)
    return text


def _why(exc: BaseException, deployment: Deployment) -> str:
    """What went wrong starting the workers, and what to do about it when known."""
    if isinstance(exc, OSError) and exc.errno == errno.E2BIG:
        size = len(deployment.spec.command.encode())
        return (
            f"the launch command ({size} bytes) is over the kernel's argument size limit "
            f"({MAX_ARG_BYTES} bytes for one argument): put a long script in a file on a "
            "volume and run that file"
        )
    return f"{type(exc).__name__}: {exc}"


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("deployer background work failed", exc_info=task.exception())
