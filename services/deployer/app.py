"""The deployer's application layer: placement in, running workers and their outcome out.

Reactions (`handle`, the IdempotentConsumer's handler; each starts background
work and returns at once, so a long deployment never holds the consumer):

- `TaskPlaced` of the task's current attempt: the four deploy stages in order
  (R-20), each `DeployStageStarted` then `DeployStageCompleted` (with its
  duration) or `DeployStageFailed` (with the runtime's reason; the domain
  fails the run with it). Then, when the spec asks for no env check (or once
  `EnvCheckFinished` passed), every worker starts at once (gang) and one
  append records all `WorkerStarted` (the domain adds `TaskRunning`).
- a worker exits: `WorkerExited` with its code; the domain decides the
  outcome (R-21). A non-zero exit ends the worker's peers. Once every worker
  is gone the runtime cleans up (scratch removed, R-22).
- `TaskStopRequested`: no new stage starts, every process group is ended
  (SIGTERM, SIGKILL after the grace period), then `TaskStopped` (R-23).

Every decision goes through `runyard.domain.task.decide` on the task's state
folded from its stream, and is appended with the version it read; a
`ConcurrencyError` means another writer moved on: read again, decide again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent
from runyard.contracts.task_events import (
    DEPLOY_STAGES,
    DeployStageName,
    EnvCheckFinished,
    TaskPlaced,
    TaskStopRequested,
)
from runyard.deployer.runtime import (
    Deployment,
    DeploymentKey,
    OnOutput,
    OutputLine,
    Runtime,
    StageFailed,
)
from runyard.domain.errors import DomainError
from runyard.domain.task import (
    PLACED_STATUSES,
    Command,
    CompleteStage,
    ConfirmStop,
    ExitWorker,
    FailStage,
    StartStage,
    StartWorker,
    TaskState,
    decide,
    evolve,
    fold,
)
from runyard.eventstore import ConcurrencyError, PostgresEventStore

log = logging.getLogger("runyard.deployer")

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
    ) -> None:
        self.store = store
        self.runtime = runtime
        self.on_output = on_output
        self.clock = clock
        self.stop_grace_s = stop_grace_s
        self._active: dict[str, _Active] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._background: set[asyncio.Task[Any]] = set()

    # -- reactions ---------------------------------------------------------------

    async def handle(self, event: RecordedEvent[Event], conn: Any = None) -> None:
        """React to one task event (the IdempotentConsumer's handler)."""
        if not event.stream_id.startswith("task-"):
            return
        task_id = event.stream_id.removeprefix("task-")
        payload = event.event
        if isinstance(payload, TaskPlaced):
            self._spawn(self._on_placed(task_id, payload, event))
        elif isinstance(payload, TaskStopRequested):
            self._spawn(self._on_stop(task_id, event))
        elif isinstance(payload, EnvCheckFinished) and payload.result != "fail":
            active = self._active.get(task_id)
            if active is not None and active.deployment.attempt == payload.attempt:
                active.may_start.set()

    async def drain(self) -> None:
        """Wait until all background work (deployments, stops) has finished."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def close(self) -> None:
        """Stop every deployment this deployer drives (service shutdown)."""
        for active in list(self._active.values()):
            active.stopping = True
            await self.runtime.stop(active.deployment.key, self.stop_grace_s)
        await self.drain()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_log_failure)

    # -- placement -> stages -> workers --------------------------------------------

    async def _on_placed(
        self, task_id: str, placed: TaskPlaced, cause: RecordedEvent[Event]
    ) -> None:
        if task_id in self._active:
            return  # a redelivery of the placement being deployed
        state = await self._load(task_id)
        if (
            state is None
            or (state.run, state.attempt) != (placed.run, placed.attempt)
            or state.status not in PLACED_STATUSES
            or state.stop_requested
            or state.stages_done
            or state.stage is not None
            or any(w.started for w in state.workers)
        ):
            return  # stale, finished, or already deployed before (see reconcile)
        deployment = Deployment(task_id, placed.run, placed.attempt, state.spec, placed.workers)
        active = _Active(deployment)
        if not state.spec.fault_tolerance.env_check:
            active.may_start.set()
        self._active[task_id] = active
        active.task = asyncio.current_task()
        meta = Metadata(actor=ACTOR).caused_by(cause, ACTOR)
        active.meta = meta
        try:
            await self._deploy(active, meta)
        finally:
            with contextlib.suppress(Exception):
                await self.runtime.cleanup(deployment.key)
            active.started_recorded.set()
            if self._active.get(task_id) is active:
                del self._active[task_id]

    async def _deploy(self, active: _Active, meta: Metadata) -> None:
        d = active.deployment
        steps = {
            "resource_allocation": self.runtime.allocate,
            "image_pull": self.runtime.pull_image,
            "storage_mount": self.runtime.mount_storage,
            "env_init": self.runtime.init_env,
        }
        for stage in DEPLOY_STAGES:
            if active.stopping or not await self._stage(active, stage, steps[stage], meta):
                return
        if not active.may_start.is_set():
            await self._wait_for_start(active)
        if active.stopping:
            return
        await self.runtime.start_workers(d, self.on_output, self._on_exit)
        try:
            commands = [StartWorker(d.task_id, d.run, d.attempt, w.index) for w in d.workers]
            await self._decide(d.task_id, commands, meta)
        except DomainError as exc:  # stopped meanwhile: the stop ends them
            log.info("workers of %s started but not recorded: %s", d.task_id, exc)
            active.stopping = True
        finally:
            active.started_recorded.set()
        if active.stopping:
            await self.runtime.stop(d.key, self.stop_grace_s)
        await self._wait_workers(d.key)

    async def _wait_for_start(self, active: _Active) -> None:
        while not active.stopping and not active.may_start.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(active.may_start.wait(), 0.5)

    async def _wait_workers(self, key: DeploymentKey) -> None:
        wait = getattr(self.runtime, "wait", None)
        if wait is not None:
            await wait(key)

    async def _stage(
        self, active: _Active, stage: DeployStageName, step: Any, meta: Metadata
    ) -> bool:
        """Run one stage with its events; False when the deployment must not go on."""
        d = active.deployment
        try:
            await self._decide(d.task_id, [StartStage(d.task_id, stage)], meta)
        except DomainError as exc:
            log.info("%s: stage %s not started: %s", d.task_id, stage, exc)
            return False
        try:
            await step(d)
        except StageFailed as failed:
            await self._decide_quietly(
                d.task_id, [FailStage(d.task_id, stage, failed.reason)], meta
            )
            return False
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            await self._decide_quietly(d.task_id, [FailStage(d.task_id, stage, reason)], meta)
            return False
        if active.stopping:
            reason = "the task is being stopped"
            await self._decide_quietly(d.task_id, [FailStage(d.task_id, stage, reason)], meta)
            return False
        try:
            await self._decide(d.task_id, [CompleteStage(d.task_id, stage)], meta)
        except DomainError as exc:
            log.info("%s: stage %s not completed: %s", d.task_id, stage, exc)
            return False
        return True

    async def _on_exit(self, key: DeploymentKey, worker: int, exit_code: int) -> None:
        task_id, run, attempt = key
        active = self._active.get(task_id)
        if active is not None:
            await active.started_recorded.wait()
        meta = (active.meta if active is not None else None) or Metadata(actor=ACTOR)
        await self._decide_quietly(
            task_id, [ExitWorker(task_id, run, attempt, worker, exit_code)], meta
        )
        if exit_code != 0 and active is not None and not active.stopping:
            # the first failing worker decides the run; its peers end with it.
            active.failed_worker = worker
            active.stopping = True
            self._spawn(self.runtime.stop(key, self.stop_grace_s))

    # -- stop ------------------------------------------------------------------------

    async def _on_stop(self, task_id: str, cause: RecordedEvent[Event]) -> None:
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

    # -- decisions -------------------------------------------------------------------

    async def _load(self, task_id: str) -> TaskState | None:
        events = await self.store.read_stream(task_stream(task_id))
        return fold(events, task_id=task_id) if events else None

    async def _decide(
        self, task_id: str, commands: Sequence[Command], meta: Metadata
    ) -> list[Event]:
        """Decide `commands` in order on the task's current state and append them together."""
        lock = self._locks.setdefault(task_id, asyncio.Lock())
        async with lock:
            for _ in range(MAX_CONFLICT_RETRIES):
                state = await self._load(task_id)
                now = self.clock()
                new: list[Event] = []
                folded = state
                for command in commands:
                    events = decide(folded, command, now=now, ids=_no_ids)
                    for event in events:
                        folded = evolve(folded, (event, now))
                    new.extend(events)
                if not new:
                    return []
                version = state.version if state is not None else 0
                try:
                    await self.store.append(
                        task_stream(task_id), [NewEvent(e, meta, now) for e in new], version
                    )
                except ConcurrencyError:
                    continue
                return new
        raise ConcurrencyError(task_stream(task_id), "retries", None)

    async def _decide_quietly(
        self, task_id: str, commands: Sequence[Command], meta: Metadata
    ) -> list[Event]:
        """`_decide`, where a refusal (finished, stale attempt) means there is nothing to do."""
        try:
            return await self._decide(task_id, commands, meta)
        except DomainError as exc:
            log.info("%s: %s", task_id, exc)
            return []


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("deployer background work failed", exc_info=task.exception())
