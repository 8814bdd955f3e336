"""The deployer on a real Postgres with the local runtime: real worker processes.

Tests append `TaskSubmitted` (through the domain's `decide`) and `TaskPlaced`
as the submission and scheduler services would, hand the stored events to
`DeployerApp.handle` as the Kafka consumer would, and read the stream back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent, default_mapper
from runyard.contracts.spec import TaskSpec
from runyard.contracts.task_events import (
    DEPLOY_STAGES,
    DeployStageCompleted,
    DeployStageFailed,
    DeployStageStarted,
    TaskFailed,
    TaskPlaced,
    WorkerExited,
    WorkerPlacement,
    WorkerStarted,
)
from runyard.deployer import runtime as runtime_module
from runyard.deployer.app import DeployerApp
from runyard.deployer.runtime import LocalRuntime, LocalRuntimeConfig, OutputLine, group_members
from runyard.domain.task import RequestStop, Submit, decide, fold
from runyard.eventstore import PostgresEventStore

pytestmark = pytest.mark.integration


def make_spec(command: str, *, workers: int = 1, image: str = "bash-only", **kw: Any) -> TaskSpec:
    return TaskSpec(
        name="t",
        pool="dev",
        worker_spec="1gpu",
        worker_count=workers,
        image=image,
        command=command,
        **kw,
    )


class Harness:
    def __init__(self, store: PostgresEventStore, app: DeployerApp, runtime: LocalRuntime) -> None:
        self.store = store
        self.app = app
        self.runtime = runtime
        self.lines: list[OutputLine] = []

    async def events(self, task_id: str) -> list[RecordedEvent[Event]]:
        return await self.store.read_stream(f"task-{task_id}")

    async def types(self, task_id: str) -> list[str]:
        return [e.type for e in await self.events(task_id)]

    async def append(self, task_id: str, events: list[Event]) -> list[RecordedEvent[Event]]:
        stream = f"task-{task_id}"
        version = await self.store.stream_version(stream)
        meta = Metadata(actor="service:test")
        from datetime import UTC, datetime

        now = datetime.now(UTC)
        await self.store.append(stream, [NewEvent(e, meta, now) for e in events], version)
        return await self.store.read_stream(stream, version + 1)

    async def deliver(self, recorded: list[RecordedEvent[Event]]) -> None:
        for event in recorded:
            await self.app.handle(event)

    async def submit(self, task_id: str, task_spec: TaskSpec, tenant: str = "acme") -> None:
        """Append the task's submission (nothing handed over)."""
        from datetime import UTC, datetime

        submitted = decide(
            None,
            Submit(task_id, tenant, "alice", task_spec),
            now=datetime.now(UTC),
            ids=lambda: "x",
        )
        await self.append(task_id, submitted)

    async def launch(
        self,
        task_id: str,
        task_spec: TaskSpec,
        *,
        wait: bool = True,
        tenant: str = "acme",
        **resources: int,
    ) -> None:
        """Submit and place the task (GPU i for worker i; each worker's `cpus` and
        `memory_gib` when given), and hand the placement over."""
        await self.submit(task_id, task_spec, tenant)
        workers = tuple(
            WorkerPlacement(index=i, node=f"n-{i}", gpus=(i,), **resources)
            for i in range(task_spec.worker_count)
        )
        placed = TaskPlaced(run=1, attempt=1, pool="dev", workers=workers)
        await self.deliver(await self.append(task_id, [placed]))
        if wait:
            await asyncio.wait_for(self.app.drain(), 8)

    async def state(self, task_id: str) -> Any:
        return fold(await self.events(task_id))

    async def wait_for(self, task_id: str, type_name: str, within: float = 5.0) -> None:
        async def poll() -> None:
            while type_name not in await self.types(task_id):  # noqa: ASYNC110
                await asyncio.sleep(0.02)

        await asyncio.wait_for(poll(), within)

    def output(self, task_id: str) -> list[str]:
        return [f"{x.worker}:{x.line}" for x in self.lines if x.task_id == task_id]


@pytest.fixture
async def h(dsn: str, tmp_path: Path) -> Any:
    store = await PostgresEventStore.connect(dsn, default_mapper())
    async with running_harness(store, LocalRuntime(local_config(tmp_path))) as harness:
        yield harness


def local_config(tmp_path: Path, **options: Any) -> LocalRuntimeConfig:
    """The local runtime of these tests: folders under `tmp_path`, the image `bash-only`
    on /usr, a 2 s grace period; `options` change or add to that."""
    defaults: dict[str, Any] = {
        "scratch_root": tmp_path / "scratch",
        "volumes_root": tmp_path / "volumes",
        "images": {"bash-only": Path("/usr")},
        "grace_s": 2.0,
    }
    return LocalRuntimeConfig(**{**defaults, **options})


@contextlib.asynccontextmanager
async def running_harness(
    store: PostgresEventStore, runtime: LocalRuntime
) -> AsyncIterator[Harness]:
    """A deployer on `runtime` whose output lines the harness keeps; it is closed, and
    the store with it, on the way out."""
    harness: Harness

    async def sink(line: OutputLine) -> None:
        harness.lines.append(line)

    app = DeployerApp(store, runtime, on_output=sink, stop_grace_s=1.0)
    harness = Harness(store, app, runtime)
    try:
        yield harness
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(app.close(), 5)
        await store.close()


def alive(pid: int) -> bool:
    """Whether a process (or a process group when pid is negative) still has a live member.

    Zombies do not count: an orphan killed here waits for PID 1 to reap it.
    """
    if pid < 0:
        return bool(group_members(-pid))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return pid in group_members(os.getpgid(pid))


async def test_true_succeeds_with_every_stage_timed(h: Harness) -> None:
    await h.launch("ok", make_spec("true"))
    events = [e.event for e in await h.events("ok")]
    started = [e.stage for e in events if isinstance(e, DeployStageStarted)]
    completed = [e for e in events if isinstance(e, DeployStageCompleted)]
    assert started == list(DEPLOY_STAGES)
    assert [e.stage for e in completed] == list(DEPLOY_STAGES)
    assert all(isinstance(e.duration_ms, int) and e.duration_ms >= 0 for e in completed)
    assert (await h.types("ok"))[-5:] == [
        "DeployStageCompleted",
        "WorkerStarted",
        "TaskRunning",
        "WorkerExited",
        "TaskSucceeded",
    ]
    assert (await h.state("ok")).status == "succeeded"
    # everything the deployer wrote names the placement as its cause.
    recorded = await h.events("ok")
    placed = next(e for e in recorded if e.type == "TaskPlaced")
    for e in recorded[recorded.index(placed) + 1 :]:
        assert e.metadata.actor == "service:deployer"
        assert e.metadata.causation_id == str(placed.event_id)
        assert e.metadata.correlation_id == (placed.metadata.correlation_id or str(placed.event_id))


async def test_a_placement_is_deployed_as_the_log_has_it_not_as_a_message_says(
    h: Harness,
) -> None:
    """The broker's message only says to look: a `TaskPlaced` whose payload differs from
    the stored one (a forged or corrupted message with the stored event's id) deploys
    the workers where the log placed them."""
    await h.submit("forged", make_spec('echo "gpus=$CUDA_VISIBLE_DEVICES"'))
    stored = TaskPlaced(
        run=1, attempt=1, pool="dev", workers=(WorkerPlacement(index=0, node="n-0", gpus=(2,)),)
    )
    (real,) = await h.append("forged", [stored])
    other = (WorkerPlacement(index=0, node="elsewhere", gpus=(6,)),)
    message = RecordedEvent(
        real.event_id, real.stream_id, real.stream_version, real.global_position,
        real.occurred_at, stored.model_copy(update={"workers": other}), real.metadata,
    )  # fmt: skip
    await h.deliver([message])
    await asyncio.wait_for(h.app.drain(), 8)
    assert h.output("forged") == ["0:gpus=2"]
    started = [e.event for e in await h.events("forged") if isinstance(e.event, WorkerStarted)]
    assert [w.node for w in started] == ["n-0"]


async def test_failing_command_fails_with_its_exit_code(h: Harness) -> None:
    await h.launch("bad", make_spec("exit 3"))
    state = await h.state("bad")
    assert state.status == "failed"
    failed = (await h.events("bad"))[-1].event
    assert isinstance(failed, TaskFailed)
    assert failed.exit_code == 3 and failed.worker == 0


async def test_a_failing_worker_ends_its_peers(h: Harness) -> None:
    command = 'if [ "$RUNYARD_WORKER_INDEX" = 1 ]; then sleep 0.3; exit 7; fi; sleep 30'
    await h.launch("gang", make_spec(command, workers=2), wait=False)
    await h.wait_for("gang", "TaskRunning")
    pids = h.runtime.pids(("gang", 1, 1))
    assert set(pids) == {0, 1}
    await asyncio.wait_for(h.app.drain(), 8)
    failed = await h.events("gang")
    outcome = [e.event for e in failed if isinstance(e.event, TaskFailed)]
    assert len(outcome) == 1 and outcome[0].worker == 1 and outcome[0].exit_code == 7
    assert not any(alive(-pid) for pid in pids.values()), "a worker process is left"


async def test_pipe_without_pipefail_reports_what_the_command_returned(h: Harness) -> None:
    fail = "python3 -c 'import sys; sys.exit(1)' | tee out.log"
    await h.launch("pipe", make_spec(fail))
    assert (await h.state("pipe")).status == "succeeded"
    await h.launch("pipefail", make_spec("set -o pipefail; " + fail))
    state = await h.state("pipefail")
    assert state.status == "failed"
    exited = [e.event for e in await h.events("pipefail") if isinstance(e.event, WorkerExited)]
    assert exited[0].exit_code == 1


async def test_missing_image_fails_in_image_pull_with_a_reason(h: Harness) -> None:
    await h.launch("noimg", make_spec("true", image="nope:latest"))
    events = [e.event for e in await h.events("noimg")]
    failed = [e for e in events if isinstance(e, DeployStageFailed)]
    assert len(failed) == 1 and failed[0].stage == "image_pull"
    assert "nope:latest" in failed[0].reason and "catalogue" in failed[0].reason
    assert not any(isinstance(e, DeployStageStarted) and e.stage == "storage_mount" for e in events)
    state = await h.state("noimg")
    assert state.status == "failed" and "image_pull" in (state.last_failure_reason or "")
    assert not (h.runtime.config.scratch_root / "noimg").exists()


async def test_stop_during_running_ends_every_process(h: Harness) -> None:
    # Each worker also leaves a background child in its group.
    command = "sleep 60 & trap '' TERM; sleep 60; wait"
    await h.launch("stopme", make_spec(command, workers=2), wait=False)
    await h.wait_for("stopme", "TaskRunning")
    pids = h.runtime.pids(("stopme", 1, 1))
    scratch = h.runtime.scratch_dir(("stopme", 1, 1), 0)
    assert scratch is not None and scratch.exists()
    assert all(alive(-pid) for pid in pids.values())
    state = await h.state("stopme")
    stop = decide(state, RequestStop("stopme"), now=state.submitted_at, ids=lambda: "x")
    await h.deliver(await h.append("stopme", stop))
    await asyncio.wait_for(h.app.drain(), 8)
    assert (await h.types("stopme"))[-1] == "TaskStopped"
    assert (await h.state("stopme")).status == "stopped"
    assert not any(alive(-pid) for pid in pids.values()), "a worker process is left"
    assert not scratch.exists()


async def test_a_worker_signalled_again_and_again_as_it_ends_keeps_its_exit_status(
    h: Harness,
) -> None:
    """A stop's SIGTERM may reach a worker more than once (two stops of one attempt: a
    restart while a failing worker's peers are being ended). Its wrapper still writes
    the exit status it exits with: a deployer that adopts the worker after a crash has
    nothing else to learn it from."""
    statuses: dict[int, str | None] = {}
    record = h.app._on_exit

    async def on_exit(
        key: tuple[str, int, int], worker: int, exit_code: int, exited_at: datetime | None = None
    ) -> None:
        scratch = h.runtime.scratch_dir(key, worker)
        status = scratch / "exit_status" if scratch is not None else None
        statuses[worker] = status.read_text() if status and status.exists() else None
        await record(key, worker, exit_code, exited_at)

    h.app._on_exit = on_exit  # type: ignore[method-assign]
    await h.launch("signalled", make_spec("echo up; sleep 60"), wait=False)
    await h.wait_for("signalled", "TaskRunning")
    for _ in range(1000):  # the launch command runs (past the sandbox's mounts)
        if h.output("signalled"):
            break
        await asyncio.sleep(0.02)
    assert h.output("signalled") == ["0:up"]
    (pid,) = h.runtime.pids(("signalled", 1, 1)).values()
    done = threading.Event()

    def signal_until_gone() -> None:
        while not done.is_set():
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                return

    signaller = threading.Thread(target=signal_until_gone)
    signaller.start()
    try:
        await h.wait_for("signalled", "TaskFailed", within=20)
    finally:
        done.set()
        signaller.join()
    await asyncio.wait_for(h.app.drain(), 8)
    (exited,) = [e.event for e in await h.events("signalled") if isinstance(e.event, WorkerExited)]
    written = statuses[0]
    assert written is not None, "the wrapper was killed before its exit status was written"
    assert int(written.split()[0]) == exited.exit_code


async def test_a_stop_or_preemption_the_log_does_not_hold_ends_no_worker(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """What ends workers is acted on only once the log is seen to hold it: messages that
    are not the log's (a forged id, or the stored id with another payload) end
    nothing; the stored stop then does."""
    import uuid
    from datetime import UTC, datetime

    from runyard.contracts.task_events import TaskPreempted, TaskStopRequested

    await h.launch("kept", make_spec("sleep 60"), wait=False)
    await h.wait_for("kept", "TaskRunning")
    pids = h.runtime.pids(("kept", 1, 1))
    version = len(await h.events("kept"))
    meta = Metadata(actor="service:test")
    forged: list[RecordedEvent[Event]] = [
        RecordedEvent(uuid.uuid4(), "task-kept", version + 1, 10**9, datetime.now(UTC),
                      TaskStopRequested(reason="forged", stopped_by="mallory"), meta),
        RecordedEvent(uuid.uuid4(), "task-kept", version + 1, 10**9, datetime.now(UTC),
                      TaskPreempted(run=1, reason="forged"), meta),
    ]  # fmt: skip
    await h.deliver(forged)
    state = await h.state("kept")
    (stored,) = await h.append(
        "kept", decide(state, RequestStop("kept"), now=state.submitted_at, ids=lambda: "x")[:1]
    )
    altered = RecordedEvent(
        stored.event_id, stored.stream_id, stored.stream_version, stored.global_position,
        stored.occurred_at, TaskPreempted(run=1, reason="forged"), meta,
    )  # fmt: skip
    await h.deliver([altered])

    async def all_three_looked_at() -> None:
        while caplog.text.count("that the log does not hold was ignored") < 3:  # noqa: ASYNC110
            await asyncio.sleep(0.02)

    await asyncio.wait_for(all_three_looked_at(), 30)
    assert all(alive(-pid) for pid in pids.values()), "a message the log lacks ended a worker"
    assert (await h.state("kept")).status == "running"
    await h.deliver([stored])
    await asyncio.wait_for(h.app.drain(), 8)
    assert (await h.state("kept")).status == "stopped"
    assert not any(alive(-pid) for pid in pids.values())


async def test_the_sweep_acts_on_a_placement_and_a_stop_the_consumer_never_handed_over(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Events a consumer had to give up on (after a broker loss) never reach the
    deployer's handler: the sweep finds them in the log, undelivered at two sweeps in
    a row, and acts on them as the consumer would have, once. Events that were
    handed over are left alone."""
    from datetime import UTC, datetime

    assert await h.app.sweep() == []  # the first marks the log's head
    await h.launch("handed", make_spec("true"))  # placed, and handed over
    spec = make_spec("sleep 60")
    submitted = decide(None, Submit("lost", "acme", "alice", spec), now=datetime.now(UTC),
                       ids=lambda: "x")  # fmt: skip
    await h.append("lost", submitted)
    worker = WorkerPlacement(index=0, node="n-0", gpus=(0,))
    placed = TaskPlaced(run=1, attempt=1, pool="dev", workers=(worker,))
    await h.append("lost", [placed])  # never handed over
    assert await h.app.sweep() == []  # seen once: it may still be on its way
    assert "DeployStageStarted" not in await h.types("lost")
    assert await h.app.sweep() == ["lost"]
    await h.wait_for("lost", "TaskRunning", within=10)
    assert (await h.state("handed")).status == "succeeded"

    state = await h.state("lost")
    await h.append("lost", decide(state, RequestStop("lost"), now=state.submitted_at,
                                  ids=lambda: "x"))  # fmt: skip
    assert await h.app.sweep() == []
    assert await h.app.sweep() == ["lost"]
    await asyncio.wait_for(h.app.drain(), 8)
    assert (await h.state("lost")).status == "stopped"
    assert await h.app.sweep() == [] and await h.app.sweep() == []  # once
    missed = [r.getMessage() for r in caplog.records if "never reached it" in r.getMessage()]
    assert [m.split(" of task")[0] for m in missed] == [
        "deployer: TaskPlaced",
        "deployer: TaskStopRequested",
    ], missed
    types = await h.types("lost")
    assert types.count("DeployStageStarted") == 4 and types.count("TaskStopped") == 1


async def test_scratch_is_private_and_removed_after_the_task(h: Harness) -> None:
    command = 'echo "$HOME|$TMPDIR|$PWD"; echo data > local.txt'
    await h.launch("scratch", make_spec(command))
    assert (await h.state("scratch")).status == "succeeded"
    (line,) = h.output("scratch")
    home, tmp, work = line.removeprefix("0:").split("|")
    root = str(h.runtime.config.scratch_root)
    assert home.startswith(root) and tmp.startswith(root) and work.startswith(root)
    assert not os.path.exists(work) and not os.path.exists(home)


async def test_pytorch_ddp_env_is_injected(h: Harness) -> None:
    command = (
        'echo "$RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT'
        ' $CUDA_VISIBLE_DEVICES $RUNYARD_RUN_ID $FOO"'
    )
    spec = make_spec(
        command, workers=2, framework="pytorch_ddp", env=({"name": "FOO", "value": "bar"},)
    )
    await h.launch("ddp", spec)
    assert (await h.state("ddp")).status == "succeeded"
    lines = sorted(h.output("ddp"))
    assert len(lines) == 2
    ranks = [line.split()[0] for line in lines]
    assert ranks == ["0:0", "1:1"]
    fields = [line.split()[1:] for line in lines]
    port = fields[0][2]
    assert int(port) > 0
    assert fields[0] == ["2", "127.0.0.1", port, "0", "ddp-run1", "bar"]
    assert fields[1] == ["2", "127.0.0.1", port, "1", "ddp-run1", "bar"]


async def _wait_stages_done(h: Harness, task_id: str) -> None:
    for _ in range(400):
        if len((await h.state(task_id)).stages_done) == len(DEPLOY_STAGES):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the deploy stages of {task_id} did not complete")


async def test_a_launch_command_over_the_argument_limit_cannot_start_and_leaves_nothing(
    h: Harness,
) -> None:
    """200 KB: over the kernel's limit for one argument. The spec's own limit is lower (so
    no event can carry it), hence the runtime directly: the start raises E2BIG, which the
    deployer turns into a failed attempt like any error at worker start (next test)."""
    import errno

    from runyard.deployer.app import _why
    from runyard.deployer.runtime import Deployment

    huge = "true # " + "x" * (200 * 1024)
    spec = make_spec("true", workers=2).model_copy(update={"command": huge})
    workers = tuple(WorkerPlacement(index=i, node="n", gpus=(i,)) for i in range(2))
    deployment = Deployment("huge", 1, 1, spec, workers)
    runtime = h.runtime
    for step in (runtime.allocate, runtime.pull_image, runtime.mount_storage, runtime.init_env):
        await step(deployment)

    async def no_exit(*_: Any) -> None:
        raise AssertionError("no worker may start")

    with pytest.raises(OSError) as raised:
        await runtime.start_workers(deployment, h.app.on_output, no_exit)
    assert raised.value.errno == errno.E2BIG
    assert "argument size limit" in _why(raised.value, deployment)
    assert runtime.pids(deployment.key) == {}
    leftover = [p for p in os.listdir("/proc") if p.isdigit() and _runs_task(int(p), "huge")]
    assert leftover == []
    await runtime.cleanup(deployment.key)
    assert not (runtime.config.scratch_root / "huge").exists()


async def test_two_ends_of_one_env_check_may_overlap(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new placement ends an older attempt's env check while the end that follows
    the check's result is still waiting for a process to go: both end cleanly."""
    from runyard.deployer import runtime as local_runtime
    from runyard.deployer.runtime import Deployment, free_port

    workers = tuple(WorkerPlacement(index=i, node="n", gpus=(i,)) for i in range(2))
    deployment = Deployment("overlap", 1, 1, make_spec("true", workers=2), workers)
    runtime = h.runtime
    for step in (runtime.allocate, runtime.pull_image, runtime.mount_storage, runtime.init_env):
        await step(deployment)
    await runtime.start_env_check(deployment, h.app.on_output, port=free_port(0))
    until_gone, waiting, held = local_runtime._until_gone, asyncio.Event(), asyncio.Event()

    async def held_until_gone(pgid: int, *args: Any, **kwargs: Any) -> None:
        if not waiting.is_set():  # the first end waits here, inside its round of the checks
            waiting.set()
            await held.wait()
        await until_gone(pgid, *args, **kwargs)

    monkeypatch.setattr(local_runtime, "_until_gone", held_until_gone)
    first = asyncio.create_task(runtime.end_env_check(deployment.key))
    await asyncio.wait_for(waiting.wait(), 30)
    await asyncio.wait_for(runtime.end_env_check(deployment.key), 30)  # the whole second end
    held.set()
    await asyncio.wait_for(first, 30)
    assert runtime.pids(deployment.key) == {}
    leftover = [p for p in os.listdir("/proc") if p.isdigit() and _runs_task(int(p), "overlap")]
    assert leftover == [], "an env check process is left"
    await runtime.cleanup(deployment.key)


async def test_an_error_while_starting_workers_fails_the_task_and_leaves_no_process(
    h: Harness,
) -> None:
    """Worker 0 starts, worker 1 cannot (its scratch is gone): the attempt fails, none runs."""
    from runyard.domain.task import FinishEnvCheck, StartEnvCheck

    spec = make_spec("sleep 30", workers=2, fault_tolerance={"env_check": True})
    await h.launch("broken", spec, wait=False)
    await _wait_stages_done(h, "broken")
    scratch = h.runtime.scratch_dir(("broken", 1, 1), 1)
    assert scratch is not None
    remove_scratch(scratch)
    state = await h.state("broken")
    now = state.submitted_at
    started = decide(state, StartEnvCheck("broken"), now=now, ids=lambda: "x")
    await h.append("broken", started)  # not delivered: no env check program runs
    state = await h.state("broken")
    finished = decide(state, FinishEnvCheck("broken"), now=now, ids=lambda: "x")
    await h.deliver(await h.append("broken", finished))
    await asyncio.wait_for(h.app.drain(), 8)
    state = await h.state("broken")
    assert state.status == "failed"
    reason = state.last_failure_reason or ""
    assert "worker_start" in reason and "FileNotFoundError" in reason, reason
    assert "WorkerStarted" not in await h.types("broken")
    assert h.runtime.deployments() == []
    leftover = [p for p in os.listdir("/proc") if p.isdigit() and _runs_task(int(p), "broken")]
    assert leftover == [], "a worker process is left"


def remove_scratch(scratch: Path) -> None:
    """Remove a worker's scratch folder (its system disk unmounted first)."""
    if os.path.ismount(scratch / "disk"):
        subprocess.run(["umount", "-l", str(scratch / "disk")], check=True)
    shutil.rmtree(scratch)


def _runs_task(pid: int, task_id: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"RUNYARD_TASK_ID={task_id}".encode() in f.read().split(b"\0")
    except OSError:
        return False


async def test_platform_values_win_over_user_variables(h: Harness) -> None:
    env = (
        {"name": "PATH", "value": "x"},
        {"name": "CUDA_VISIBLE_DEVICES", "value": "7"},
        {"name": "RUNYARD_TASK_ID", "value": "someone-else"},
        {"name": "MINE", "value": "kept"},
    )
    command = 'echo "$CUDA_VISIBLE_DEVICES $RUNYARD_TASK_ID $MINE"; command -v bash'
    spec = make_spec(command, env=env)
    await h.launch("env", spec)
    assert (await h.state("env")).status == "succeeded"
    out = h.output("env")
    assert out[0] == "0:0 env kept" and out[1].endswith("/bash"), out


async def test_an_env_check_that_cannot_start_fails_the_task_and_leaves_no_process(
    h: Harness,
) -> None:
    from runyard.domain.task import StartEnvCheck

    spec = make_spec("sleep 30", workers=2, fault_tolerance={"env_check": True})
    await h.launch("nocheck", spec, wait=False)
    await _wait_stages_done(h, "nocheck")
    scratch = h.runtime.scratch_dir(("nocheck", 1, 1), 1)
    assert scratch is not None
    remove_scratch(scratch)
    state = await h.state("nocheck")
    started = decide(state, StartEnvCheck("nocheck"), now=state.submitted_at, ids=lambda: "x")
    await h.deliver(await h.append("nocheck", started))
    await asyncio.wait_for(h.app.drain(), 8)
    state = await h.state("nocheck")
    assert state.status == "failed"
    reason = state.last_failure_reason or ""
    assert "env_check" in reason and "FileNotFoundError" in reason, reason
    assert "WorkerStarted" not in await h.types("nocheck")
    assert h.runtime.deployments() == []
    leftover = [p for p in os.listdir("/proc") if p.isdigit() and _runs_task(int(p), "nocheck")]
    assert leftover == [], "an env check process is left"


class _StartBreaks(LocalRuntime):
    """The local runtime with a bug at worker start: what any exception there must do."""

    async def start_workers(self, deployment: Any, on_output: Any, on_exit: Any) -> dict[int, int]:
        raise RuntimeError("no worker started (a bug in the runtime)")


async def test_a_runtime_exception_at_start_fails_the_task_and_frees_its_gpus(
    dsn: str, tmp_path: Path
) -> None:
    from datetime import UTC, datetime

    from runyard.scheduler.app import SchedulerApp

    from tests.integration.test_faulttolerance_deployer import pools

    store = await PostgresEventStore.connect(dsn, default_mapper())
    scheduler = SchedulerApp(store, pools(1))
    await scheduler.start()
    runtime = _StartBreaks(
        LocalRuntimeConfig(
            scratch_root=tmp_path / "scratch",
            volumes_root=tmp_path / "volumes",
            images={"bash-only": Path("/usr")},
        )
    )
    deployer = DeployerApp(store, runtime, stop_grace_s=1.0)

    async def pump() -> None:
        reader = store.all_reader(0)
        while True:
            for event in await reader.read(500):
                for app in (scheduler, deployer):
                    await app.handle(event)
            await asyncio.sleep(0.02)

    pumping = asyncio.create_task(pump())
    try:
        submitted = decide(
            None,
            Submit("bug", "acme", "alice", make_spec("true", workers=2)),
            now=datetime.now(UTC),
            ids=lambda: "x",
        )
        await store.append(
            "task-bug",
            [NewEvent(e, Metadata(actor="user:acme/alice"), datetime.now(UTC)) for e in submitted],
            0,
        )
        for _ in range(400):
            types = [e.type for e in await store.read_stream("task-bug")]
            if "ResourcesReleased" in types:
                break
            await asyncio.sleep(0.05)
        state = fold(await store.read_stream("task-bug"))
        assert state.status == "failed", types
        reason = state.last_failure_reason or ""
        assert "worker_start" in reason and "a bug in the runtime" in reason, reason
        assert "TaskPlaced" in types and "WorkerStarted" not in types
        assert "ResourcesReleased" in types and state.held is None, types
        await asyncio.wait_for(deployer.drain(), 8)
        assert runtime.deployments() == []
    finally:
        pumping.cancel()
        with contextlib.suppress(BaseException):
            await pumping
        await store.close()


async def test_only_so_many_deployments_run_their_stages_at_once(dsn: str, tmp_path: Path) -> None:
    """`deploys_at_once=1`: three placements handed over together deploy one after
    the other (no stage of one between the first and last stage of another), and a
    task stopped while waiting its turn ends without running a stage."""
    store = await PostgresEventStore.connect(dsn, default_mapper())
    config = local_config(tmp_path, deploys_at_once=1)
    runtime = LocalRuntime(config)
    app = DeployerApp(store, runtime, stop_grace_s=1.0)
    h = Harness(store, app, runtime)
    turns = runtime.stage_slots(None)  # type: ignore[arg-type]  # one for every deployment
    assert turns is not None
    try:
        async with turns.turn("test"):  # the test's turn first: every placement waits
            for task_id in ("one", "two", "three"):
                await h.launch(task_id, make_spec("true"), wait=False)
            await asyncio.sleep(0.3)
            for task_id in ("one", "two", "three"):
                assert "DeployStageStarted" not in await h.types(task_id)
            await h.deliver(await h.append("three", _stop("three", await h.state("three"))))
        await asyncio.wait_for(app.drain(), 30)

        spans = {}
        for task_id in ("one", "two"):
            stages = [e for e in await h.events(task_id) if e.type.startswith("DeployStage")]
            assert [e.type for e in stages][-1] == "DeployStageCompleted"
            spans[task_id] = (stages[0].global_position, stages[-1].global_position)
        (_, a_last), (b_first, _) = sorted(spans.values())
        assert a_last < b_first, "the second deployment's stages waited for the first's"
        assert (await h.state("one")).status == "succeeded"
        assert (await h.state("two")).status == "succeeded"
        three = await h.types("three")
        assert "DeployStageStarted" not in three and (await h.state("three")).finished
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(app.close(), 5)
        await store.close()


async def test_a_tenants_burst_of_placements_keeps_no_other_tenant_waiting_behind_it(
    dsn: str, tmp_path: Path
) -> None:
    """`deploys_at_once=1` and four placements of one tenant handed over before one of
    another: the other tenant's task deploys second, not after the whole burst (the
    machine's turns go round the tenants)."""
    store = await PostgresEventStore.connect(dsn, default_mapper())
    runtime = LocalRuntime(local_config(tmp_path, deploys_at_once=1))
    app = DeployerApp(store, runtime, stop_grace_s=1.0)
    h = Harness(store, app, runtime)
    turns = runtime.stage_slots(None)  # type: ignore[arg-type]  # one for every deployment
    assert turns is not None
    burst = [f"burst-{i}" for i in range(4)]
    try:
        async with turns.turn("test"):  # every placement waits behind the test's turn
            for task_id in burst:
                await h.launch(task_id, make_spec("true"), wait=False, tenant="bursty")
            await waiting(turns, 4)  # the whole burst is in the queue first
            await h.launch("lone", make_spec("true"), wait=False, tenant="other")
            await waiting(turns, 5)
        await asyncio.wait_for(app.drain(), 60)
        firsts = {}
        for task_id in [*burst, "lone"]:
            assert (await h.state(task_id)).status == "succeeded", task_id
            events = await h.events(task_id)
            firsts[task_id] = next(e for e in events if e.type == "DeployStageStarted")
        order = sorted(firsts, key=lambda t: firsts[t].global_position)
        assert order[1] == "lone", order  # first come, first served: it would be last
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(app.close(), 5)
        await store.close()


async def waiting(turns: Any, count: int) -> None:
    """Until `count` deployments wait for a turn."""
    async with asyncio.timeout(20):
        while turns.waiting() < count:  # noqa: ASYNC110 (the deployer's own)
            await asyncio.sleep(0.02)


def _stop(task_id: str, state: Any) -> list[Event]:
    from datetime import UTC, datetime

    return decide(state, RequestStop(task_id), now=datetime.now(UTC), ids=lambda: "x")


@pytest.mark.parametrize("folder", ["world-writable", "worker-owned"])
async def test_a_mount_path_through_a_folder_a_worker_can_change_is_refused(
    h: Harness, folder: str
) -> None:
    """A worker links a path it may write to (a world-writable /data on a shared host,
    its own scratch) elsewhere, and a task of its mounts a volume there: the root wrapper
    would bind the volume at the link's target (over /usr/bin, whose `mount` it runs next
    as root). The deployer refuses the mount path before any worker runs."""
    if not h.runtime.namespaces or h.runtime.worker_ids is None:
        pytest.skip("sandboxed workers need a root deployer with util-linux")
    uid, gid, _ = h.runtime.worker_ids
    base = Path("/mnt") / f"runyard-test-{os.urandom(4).hex()}"
    victim, changeable = base / "victim", base / "open"
    victim.mkdir(parents=True)
    (victim / "original").write_text("host file\n")
    changeable.mkdir()
    if folder == "world-writable":
        changeable.chmod(0o1777)
    else:
        os.chown(changeable, uid, gid)
    link = changeable / "link"
    link.symlink_to(victim)
    os.lchown(link, uid, gid)  # as the worker would have made it
    (h.runtime.config.volumes_root / "fs" / "out").mkdir(parents=True)
    (h.runtime.config.volumes_root / "fs" / "out" / "planted").write_text("volume file\n")
    spec = make_spec(
        f"ls {victim}",
        mounts=({"file_system": "fs", "volume": "out", "mount_path": str(link)},),
    )
    try:
        await h.launch("linked", spec)
        events = [e.event for e in await h.events("linked")]
        failed = [e for e in events if isinstance(e, DeployStageFailed)]
        assert [f.stage for f in failed] == ["storage_mount"], h.output("linked")
        assert str(link) in failed[0].reason and str(changeable) in failed[0].reason
        assert "only root" in failed[0].reason
        assert (await h.state("linked")).status == "failed"
        assert "WorkerStarted" not in await h.types("linked")
        assert h.output("linked") == []
    finally:
        shutil.rmtree(base, ignore_errors=True)


FORK_WITHOUT_END = """
import os, time
forked = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    forked += 1
print("forked", forked, flush=True)
"""


async def test_a_worker_that_forks_without_end_is_held_to_its_process_limit(
    dsn: str, tmp_path: Path
) -> None:
    """A fork bomb in a sandboxed worker fails its own forks at `worker_pids_max` (its
    pids cgroup) instead of taking every pid of the host; its processes end with the
    worker and the cgroup goes with the deployment."""
    store = await PostgresEventStore.connect(dsn, default_mapper())
    config = local_config(tmp_path, worker_pids_max=40)
    runtime = LocalRuntime(config)
    v1, unified = Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/cgroup.controllers")
    # A cgroup file system mounted read-only (a container's) has no pids cgroup to give.
    writable = os.access(unified.parent, os.W_OK)
    pids = os.access(v1, os.W_OK) or (
        unified.exists() and writable and "pids" in unified.read_text()
    )
    if not runtime.namespaces or not pids:
        await store.close()
        pytest.skip("sandboxed workers with a pids cgroup need a root deployer")
    assert runtime.pids_base is not None
    command = f"{shlex.quote(sys.executable)} -c {shlex.quote(FORK_WITHOUT_END)}"
    async with running_harness(store, runtime) as h:
        await h.launch("forks", make_spec(command, workers=2), wait=False)
        await h.wait_for("forks", "TaskRunning")
        folder = runtime._group_folders(config.scratch_root / "forks" / "run1-a1")[0]  # pids
        assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["w0", "w1"]
        await asyncio.wait_for(h.app.drain(), 30)
        assert (await h.state("forks")).status == "succeeded", h.output("forks")
        counts = sorted(int(line.split()[-1]) for line in h.output("forks"))
        assert len(counts) == 2 and all(0 < n < 40 for n in counts), counts
        assert not folder.exists(), "the workers' cgroups go with the deployment"


async def test_a_sandboxed_worker_is_the_first_the_kernel_ends_when_memory_runs_out(
    h: Harness,
) -> None:
    """Whatever its own limit, under the host's memory pressure the kernel's OOM killer
    must end a worker's process, not Postgres or a service of the control plane: every
    process of the worker has oom_score_adj 1000, set as root, which it cannot lower:
    the kernel keeps that floor only where root has CAP_SYS_RESOURCE (some VMs and
    containers take it from root), so a worker's /proc is also read-only."""
    if not h.runtime.namespaces:
        pytest.skip("sandboxed workers need a root deployer with util-linux")
    command = (
        "cat /proc/self/oom_score_adj;"
        " if echo 0 > /proc/self/oom_score_adj; then echo lowered; else echo kept; fi 2>/dev/null;"
        " cat /proc/self/oom_score_adj; head -c 3 /proc/self/status"
    )
    await h.launch("oom", make_spec(command))
    assert (await h.state("oom")).status == "succeeded", h.output("oom")
    assert h.output("oom") == ["0:1000", "0:kept", "0:1000", "0:Nam"]


#: Takes the mebibytes its first argument names (written, so resident), 64 at a time.
TAKE_MEMORY = """
import sys
held = [bytearray(b"x") * (64 << 20) for _ in range(int(sys.argv[1]) // 64)]
print("held", len(held) * 64, flush=True)
"""


#: Tries to lift the memory limit of the cgroup it is in (v1 and v2), and says how that went.
LIFT_LIMIT = """
import pathlib
for line in open("/proc/self/cgroup"):
    _, controllers, path = line.rstrip("\\n").split(":", 2)
    if controllers in ("memory", ""):
        where = pathlib.Path("/sys/fs/cgroup", controllers, path.lstrip("/"))
        for name, value in (
            ("memory.memsw.limit_in_bytes", str(8 << 30)),
            ("memory.limit_in_bytes", str(8 << 30)),
            ("memory.max", "max"),
        ):
            if (where / name).exists():
                try:
                    (where / name).write_text(value)
                    print("lifted", name, flush=True)
                except OSError as exc:
                    print("refused", name, exc.strerror, flush=True)
"""


def limits_of_memory_and_cpus(runtime: LocalRuntime) -> bool:
    """Whether this deployer holds sandboxed workers to their memory and CPUs (a root
    deployer with a writable cgroup file system)."""
    return runtime.namespaces and runtime.memory_base is not None


async def test_a_worker_is_held_to_its_placements_memory_and_told_why_it_ended(
    h: Harness,
) -> None:
    """A worker that takes more memory than its placement gives it (its spec's) has its
    largest process ended by the kernel at that limit (which it cannot lift), and its
    stderr says why; a worker of another task beside it, within the same limit, runs
    to its end."""
    if not limits_of_memory_and_cpus(h.runtime):
        pytest.skip("memory limits need a root deployer with a writable cgroup file system")
    take = f"{shlex.quote(sys.executable)} -c {shlex.quote(TAKE_MEMORY)}"
    lift = f"{shlex.quote(sys.executable)} -c {shlex.quote(LIFT_LIMIT)}"
    await h.launch("modest", make_spec(f"{take} 768"), wait=False, memory_gib=1)
    await h.launch("hungry", make_spec(f"{lift}; {take} 1536"), wait=False, memory_gib=1)
    await asyncio.wait_for(h.app.drain(), 30)
    for task_id, code in (("modest", 0), ("hungry", 137)):
        events = [e.event for e in await h.events(task_id)]
        [exited] = [e for e in events if isinstance(e, WorkerExited)]
        assert exited.exit_code == code, (task_id, h.output(task_id))
    assert h.output("modest") == ["0:held 768"]
    *tried, note = h.output("hungry")  # its own limit is not the worker's to lift
    assert tried and all(t.endswith("Permission denied") for t in tried), tried
    assert note.startswith("0:runyard: out of memory: the kernel ended 1 process(es)"), note
    assert "limit of 1 GiB" in note, note


#: The files of a worker's cgroups its CPU and memory limits are in (v1 and v2).
LIMIT_FILES = (
    *("cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us"),
    *("memory.max", "memory.limit_in_bytes"),
)


def limits_in(groups: list[Path]) -> dict[str, list[str]]:
    """What `LIMIT_FILES` of a worker's cgroups hold."""
    files = {
        n: (g / n).read_text().split() for g in groups for n in LIMIT_FILES if (g / n).exists()
    }
    if "cpu.cfs_quota_us" in files:  # v1, as v2 writes it: quota and period
        files["cpu.max"] = files.pop("cpu.cfs_quota_us") + files.pop("cpu.cfs_period_us")
    if "memory.limit_in_bytes" in files:
        files["memory.max"] = files.pop("memory.limit_in_bytes")
    return files


async def test_a_worker_runs_within_its_placements_cpus(h: Harness) -> None:
    """Each worker's cgroups hold a CPU quota of its placement's CPUs (per 100 ms)
    and its memory limit while it runs; none without them (an older placement), and
    none where they cannot bind (more CPUs and memory than the host has: no group is
    made for them); the groups go with the deployment."""
    if not limits_of_memory_and_cpus(h.runtime):
        pytest.skip("CPU limits need a root deployer with a writable cgroup file system")
    await h.launch("quota", make_spec("sleep 30", workers=2), wait=False, cpus=3, memory_gib=2)
    await h.launch("plain", make_spec("sleep 30"), wait=False)
    await h.launch("roomy", make_spec("sleep 30"), wait=False, cpus=10**6, memory_gib=2**30)
    for task_id in ("quota", "plain", "roomy"):
        await h.wait_for(task_id, "TaskRunning", within=20)
    groups = h.runtime._worker_groups(h.runtime._get(("quota", 1, 1)))
    if "cpu.max" not in limits_in(groups[0]):
        pytest.skip("no cpu controller to write: the memory limit alone is tested")
    for paths in groups.values():
        assert limits_in(paths) == {"cpu.max": ["300000", "100000"], "memory.max": [str(2 << 30)]}
    unlimited = []
    for task_id in ("plain", "roomy"):
        [paths] = h.runtime._worker_groups(h.runtime._get((task_id, 1, 1))).values()
        unlimited.append(paths)
        if h.runtime.limit_bases:  # cgroup v1: no memory or cpu group made for it
            assert h.runtime.pids_base is not None
            assert len(paths) == 1 and paths[0].is_relative_to(h.runtime.pids_base), paths
        for value, *_ in limits_in(paths).values():  # v2: the pids group's own files
            assert value in ("max", "-1") or int(value) > 1 << 50, (task_id, limits_in(paths))
    for task_id in ("quota", "plain", "roomy"):
        state = await h.state(task_id)
        stop = decide(state, RequestStop(task_id), now=state.submitted_at, ids=lambda: "x")
        await h.deliver(await h.append(task_id, stop))
    await asyncio.wait_for(h.app.drain(), 15)
    assert not any(p.exists() for paths in [*groups.values(), *unlimited] for p in paths)


#: A launcher that starts its rank in a session of its own, as torchrun does, and a rank
#: that outlives a SIGTERM (busy in a collective): it prints its pid and waits.
STUBBORN_RANK = """
import subprocess, sys
rank = "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
rank += "print(os.getpid(), flush=True); time.sleep(120)"
subprocess.run([sys.executable, "-c", rank], start_new_session=True)
"""


async def test_a_stop_without_sandbox_ends_ranks_in_sessions_of_their_own(
    dsn: str, tmp_path: Path
) -> None:
    """Without a PID namespace (the fallback) a group signal misses torchrun's ranks (each
    in a session of its own): the stop ends every process of the worker, so no rank
    keeps its GPU after the task stopped."""
    store = await PostgresEventStore.connect(dsn, default_mapper())
    config = local_config(tmp_path, grace_s=1.0, namespaces=False)
    command = f"{shlex.quote(sys.executable)} -c {shlex.quote(STUBBORN_RANK)}"
    async with running_harness(store, LocalRuntime(config)) as h:
        try:
            await h.launch("ranks", make_spec(command), wait=False)

            async def rank_pid() -> int:
                while not h.output("ranks"):  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
                return int(h.output("ranks")[0].removeprefix("0:"))

            async with asyncio.timeout(10):
                pid = await rank_pid()
            assert alive(pid)
            state = await h.state("ranks")
            stop = decide(state, RequestStop("ranks"), now=state.submitted_at, ids=lambda: "x")
            await h.deliver(await h.append("ranks", stop))
            await asyncio.wait_for(h.app.drain(), 10)
            assert (await h.state("ranks")).status == "stopped"
            assert not alive(pid), "the rank outlived the stop"
        finally:
            with contextlib.suppress(NameError, ProcessLookupError):
                os.kill(pid, 9)


async def test_pids_cgroups_a_crashed_deployer_left_are_swept_and_a_swept_one_made_again(
    dsn: str, tmp_path: Path
) -> None:
    """A deployer that crashed (or whose scratch went) leaves its deployments' empty pids
    cgroups: the next one removes them at start. One removed between a deployment's
    allocation and its start (by another deployer's sweep, once it is old) is made again
    by the worker's wrapper, with its limit, and the worker runs in it. Groups made
    just now are left: another deployer on the host may be about to start them."""
    from runyard.deployer.runtime import PIDS_SWEEP_AGE_S, Deployment

    config = local_config(tmp_path, grace_s=1.0, worker_pids_max=50)
    runtime = LocalRuntime(config)
    if runtime.pids_base is None:
        pytest.skip("sandboxed workers with a pids cgroup need a root deployer")
    stale = runtime.pids_base / f"d-stale-{os.urandom(4).hex()}"
    (stale / "w0").mkdir(parents=True)
    workers = (WorkerPlacement(index=0, node="n", gpus=(0,), cpus=1, memory_gib=1),)
    deployment = Deployment("swept", 1, 1, make_spec("grep pids /proc/self/cgroup"), workers)
    for step in (runtime.allocate, runtime.pull_image, runtime.mount_storage, runtime.init_env):
        await step(deployment)
    [groups] = runtime._worker_groups(runtime._get(deployment.key)).values()
    group = groups[0]  # the pids one
    assert group.is_dir() and group.is_relative_to(runtime.pids_base)
    LocalRuntime(config)  # another deployer starts: groups made just now are kept
    assert (stale / "w0").is_dir() and all(g.is_dir() for g in groups)
    long_ago = time.time() - PIDS_SWEEP_AGE_S - 5
    for folder in (stale / "w0", stale, *groups, *(g.parent for g in groups)):
        os.utime(folder, (long_ago, long_ago))
    LocalRuntime(config)  # and once they are old, both empty folders go
    assert not stale.exists() and not any(g.exists() for g in groups)
    lines: list[str] = []
    exits: list[int] = []

    async def on_output(line: OutputLine) -> None:
        lines.append(line.line)

    async def on_exit(_key: Any, _worker: int, code: int, _at: Any) -> None:
        exits.append(code)

    try:
        await runtime.start_workers(deployment, on_output, on_exit)
        await asyncio.wait_for(runtime.wait(deployment.key), 10)
        assert exits == [0], lines
        where = f"/{group.relative_to(runtime.pids_base.parent)}"
        assert len(lines) == 1 and lines[0].endswith(f":pids:{where}"), lines
        assert (group / "pids.max").read_text().strip() == "50"
        if limits_of_memory_and_cpus(runtime):  # made again with its memory and CPUs too
            files = limits_in(groups)
            assert files["memory.max"] == [str(1 << 30)], files
            assert files.get("cpu.max", ["100000"])[0] == "100000", files
    finally:
        await runtime.cleanup(deployment.key)
    assert not group.exists()


def mounts_under(folder: Path) -> list[str]:
    """Mount points at or below `folder` in this (the host's) mount namespace."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [m for line in lines if Path(m := line.split()[4]).is_relative_to(folder)]


#: Fills its home (the system disk) and /dev/shm past their limits, then says how big
#: each was and how much it wrote; `sleep` keeps the worker until the test stops it.
FILL = """
try() { if head -c "$2" /dev/zero > "$1" 2>/dev/null; then echo "$3=yes"; else echo "$3=no"; fi; }
try "$HOME/small" 1M small_disk
try "$HOME/big" 64M big_disk
try /tmp/big 64M big_tmp
try /dev/shm/small 1M small_shm
try /dev/shm/big 64M big_shm
echo "disk=$(df -B1 --output=size "$HOME" | tail -1 | tr -d ' ')"
echo "shm=$(df -B1 --output=size /dev/shm | tail -1 | tr -d ' ')"
echo done
exec sleep 60
"""


async def test_a_worker_cannot_write_past_its_system_disk_or_its_dev_shm(
    dsn: str, tmp_path: Path
) -> None:
    """R-13: a sandboxed worker's home, /tmp and working folder lie on a system disk of its
    own (`worker_disk_bytes`) and its /dev/shm is a tmpfs (`worker_shm_bytes`): writing
    past either fails in the worker, while the host's disk holds no more than the disk's
    size; both go with the deployment."""
    store = await PostgresEventStore.connect(dsn, default_mapper())
    disk, shm = 16 * 2**20, 4 * 2**20
    runtime = LocalRuntime(local_config(tmp_path, worker_disk_bytes=disk, worker_shm_bytes=shm))
    loops = Path("/dev/loop-control").exists() and shutil.which("mkfs.ext4")
    if not runtime.namespaces or not loops:
        await store.close()
        pytest.skip("workers' system disks need a root deployer, loop devices and mkfs.ext4")
    async with running_harness(store, runtime) as h:
        await h.launch("fill", make_spec(FILL), wait=False)

        async def filled() -> None:
            while "0:done" not in h.output("fill"):  # noqa: ASYNC110
                await asyncio.sleep(0.05)

        await asyncio.wait_for(filled(), 30)
        said = dict(line.removeprefix("0:").split("=") for line in h.output("fill")[:-1])
        assert said == {
            "small_disk": "yes",
            "big_disk": "no",
            "big_tmp": "no",
            "small_shm": "yes",
            "big_shm": "no",
            "disk": said["disk"],
            "shm": str(shm),
        }, h.output("fill")
        assert 0 < int(said["disk"]) <= disk
        # What the worker wrote took no more of the host's disk than its disk's size.
        root = runtime.config.scratch_root / "fill" / "run1-a1"
        image = root / "w0.disk"
        assert 0 < image.stat().st_blocks * 512 <= disk
        assert mounts_under(root)  # its disk and /dev/shm, while it runs
        state = await h.state("fill")
        stop = decide(state, RequestStop("fill"), now=state.submitted_at, ids=lambda: "x")
        await h.deliver(await h.append("fill", stop))
        await asyncio.wait_for(h.app.drain(), 15)
        assert (await h.state("fill")).status == "stopped"
        assert mounts_under(runtime.config.scratch_root) == []
        assert not root.exists()


async def test_workers_disks_are_copies_of_one_empty_file_system_made_once(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every sandboxed worker's system disk is copied from one empty file system, made by
    mkfs once (not once per worker): a fresh, empty disk for each worker all the same
    (what one task left on its disk is on no other's), as sparse as mkfs's own; a
    template removed meanwhile is made again."""
    store = await PostgresEventStore.connect(dsn, default_mapper())
    disk = 16 * 2**20
    runtime = LocalRuntime(local_config(tmp_path, worker_disk_bytes=disk))
    loops = Path("/dev/loop-control").exists() and shutil.which("mkfs.ext4")
    if not runtime.namespaces or not loops:
        await store.close()
        pytest.skip("workers' system disks need a root deployer, loop devices and mkfs.ext4")
    made: list[Path] = []
    make_ext4 = runtime_module._make_ext4

    def counted(mkfs: str, image: Path, size: int) -> None:
        made.append(image)
        make_ext4(mkfs, image, size)

    monkeypatch.setattr(runtime_module, "_make_ext4", counted)
    # What a worker finds on its fresh disk, then leaves there for the next.
    probe = (
        'echo "$(ls -A "$HOME" | tr "\\n" " ")|$(ls -A "$PWD" | tr "\\n" " ")";'
        ' echo left > "$HOME/left"; echo left > "$PWD/left"'
    )
    templates = runtime.config.scratch_root / ".disks"
    async with running_harness(store, runtime) as h:
        for n, task in enumerate(("first", "second", "third")):
            if n == 2:
                for template in templates.iterdir():
                    template.unlink()
            await h.launch(task, make_spec(probe, workers=2))
            assert (await h.state(task)).status == "succeeded", h.output(task)
            found = sorted(line for line in h.output(task) if "|" in line)
            # Only what mkfs and the runtime put there: nothing the last task left.
            assert found == ["0:.bash_profile |", "1:.bash_profile |"], h.output(task)
    # Once for the first disk, once more after the template was removed: 6 disks.
    assert len(made) == 2, made
    assert all(path.parent == templates for path in made), made
    [template] = templates.iterdir()
    assert template.stat().st_size == disk
    assert 0 < template.stat().st_blocks * 512 < disk // 2  # sparse


async def test_a_worker_can_open_the_device_nodes_of_its_own_gpus_only(
    dsn: str, tmp_path: Path
) -> None:
    """Worker i is placed on GPU i; three GPU device nodes (test ones, made where the
    real ones are, /dev, named by `gpu_devices`): each worker can open its own only, the
    others are covered in its view by a file it may not open."""
    store = await PostgresEventStore.connect(dsn, default_mapper())
    pattern = f"/dev/runyard-test-{uuid.uuid4().hex[:8]}-gpu{{gpu}}"
    runtime = LocalRuntime(local_config(tmp_path, gpu_devices=pattern))
    if not runtime.namespaces:
        await store.close()
        pytest.skip("sandboxed workers need a root deployer with util-linux")
    nodes = [Path(pattern.format(gpu=n)) for n in range(3)]
    probe = "".join(
        f'if [ -c {node} ] && head -c 1 {node} >/dev/null 2>&1; then echo "gpu{n}=yes";'
        f' else echo "gpu{n}=no"; fi\n'
        for n, node in enumerate(nodes)
    )
    try:
        for node in nodes:
            os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 5))  # like /dev/zero
            node.chmod(0o666)
        async with running_harness(store, runtime) as h:
            await h.launch("gpus", make_spec(probe, workers=2))
            assert (await h.state("gpus")).status == "succeeded", h.output("gpus")
            assert sorted(h.output("gpus")) == [
                "0:gpu0=yes",
                "0:gpu1=no",
                "0:gpu2=no",
                "1:gpu0=no",
                "1:gpu1=yes",
                "1:gpu2=no",
            ]
    finally:
        for node in nodes:
            node.unlink(missing_ok=True)


async def test_a_folder_of_the_host_anyone_may_write_to_is_the_workers_own(
    dsn: str, tmp_path: Path
) -> None:
    """A world-writable folder of the host (like /run/lock, or a site's shared scratch;
    one the test makes under /mnt) is, in a sandboxed worker, its own `tmp/`: what it
    writes there lands on its system disk, not on the host's, and no other task sees it."""
    store = await PostgresEventStore.connect(dsn, default_mapper())
    shared = Path(f"/mnt/runyard-test-{uuid.uuid4().hex[:8]}")
    shared.mkdir()
    shared.chmod(0o1777)
    try:
        runtime = LocalRuntime(local_config(tmp_path))
        if not runtime.namespaces:
            await store.close()
            pytest.skip("sandboxed workers need a root deployer with util-linux")
        assert shared in runtime.shared_dirs
        command = f"echo mine > {shared}/note && cat {shared}/note && cat $TMPDIR/note"
        async with running_harness(store, runtime) as h:
            await h.launch("shared", make_spec(command))
            assert (await h.state("shared")).status == "succeeded", h.output("shared")
            assert h.output("shared") == ["0:mine", "0:mine"]
        assert list(shared.iterdir()) == []  # nothing on the host's folder
    finally:
        shutil.rmtree(shared, ignore_errors=True)


#: Puts a key in the user keyring (`put`) or reads it back (`get`), by the raw system
#: calls (x86-64 and arm64 numbers); prints the answer and errno.
KEYRING = """
import ctypes, platform, sys
libc = ctypes.CDLL(None, use_errno=True)
add_key, keyctl = (248, 250) if platform.machine() == "x86_64" else (217, 219)
user = ctypes.c_int(-4)  # KEY_SPEC_USER_KEYRING
if sys.argv[1] == "put":
    got = libc.syscall(add_key, b"user", b"runyard-test-key", b"secret", 6, user)
else:
    got = libc.syscall(keyctl, 10, user, b"user", b"runyard-test-key", 0)  # KEYCTL_SEARCH
print(sys.argv[1], "ok" if got >= 0 else "refused", ctypes.get_errno())
"""


#: Where a sandboxed worker's filter is set: on the thread that starts it (`spawns`), or
#: by an interpreter between the privilege drop and its shell (where no such thread is
#: had, and in the env check).
FILTERED_BY = pytest.mark.parametrize("filtered_by", ["thread", "interpreter"])


def filter_set_by(h: Harness, filtered_by: str) -> None:
    """Skip where workers are not sandboxed or the filter does not know this machine;
    else make the runtime set the worker's filter as `filtered_by` says."""
    if not h.runtime.namespaces:
        pytest.skip("sandboxed workers need a root deployer with util-linux")
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("the worker's filter knows x86-64 and arm64")
    # Root on a known architecture: the spawning thread must be had.
    assert h.runtime.spawns is not None
    if filtered_by == "interpreter":
        h.runtime.spawns = None


@FILTERED_BY
async def test_tasks_cannot_share_the_kernel_keyring_of_their_one_uid(
    h: Harness, filtered_by: str
) -> None:
    """Every task's workers run as one uid, whose user keyring is one: a sandboxed worker
    is refused the keyring calls (EPERM), so what one task would put there (a ticket
    cache, a token) no other task reads."""
    filter_set_by(h, filtered_by)
    python = f"{shlex.quote(sys.executable)} -c {shlex.quote(KEYRING)}"
    await h.launch("keyput", make_spec(f"{python} put"))
    await h.launch("keyget", make_spec(f"{python} get"))
    assert h.output("keyput") == ["0:put refused 1"]
    assert h.output("keyget") == ["0:get refused 1"]


#: A user namespace asked for the ways a program can (the call, util-linux, a clone with
#: the flag), an io_uring, then what must still work: threads and child processes.
USERNS = """
import ctypes, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
def said(rc): return "ok" if rc >= 0 else os.strerror(ctypes.get_errno())
print("unshare", said(libc.unshare(0x10000000)))  # CLONE_NEWUSER
print("clone", said(libc.syscall({clone}, 0x10000000 | 17, None, None, None, None)))
print("util-linux", subprocess.run(["unshare", "-U", "true"], capture_output=True).returncode)
print("io_uring", said(libc.syscall(425, 1, ctypes.create_string_buffer(120))))
print("nice", os.nice(0))  # behind the control plane for CPU (`worker_nice`)
t = threading.Thread(target=print, args=("thread",))
t.start(); t.join()
print(subprocess.run(["echo", "child"], capture_output=True, text=True).stdout.strip())
"""


def userns_probe() -> str:
    """The launch command that runs `USERNS` on this machine's architecture."""
    clone = 56 if os.uname().machine == "x86_64" else 220
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(USERNS.format(clone=clone))}"


#: What `USERNS` prints in a sandboxed worker.
NO_USERNS = [
    "unshare Operation not permitted",
    "clone Operation not permitted",
    "util-linux 1",
    "io_uring Operation not permitted",
    "nice 10",
    "thread",
    "child",
]


@FILTERED_BY
async def test_a_sandboxed_worker_cannot_make_a_user_namespace_or_an_io_uring(
    h: Harness, filtered_by: str
) -> None:
    """In a user namespace of its own an unprivileged process holds every capability over
    what it makes there (network, mounts, netfilter): the kernel surface most container
    escapes went through; io_uring is the other. A sandboxed worker is refused both,
    however it asks; threads and child processes still start (clone3 answers ENOSYS,
    and the C library falls back to clone)."""
    filter_set_by(h, filtered_by)
    await h.launch("userns", make_spec(userns_probe()))
    assert (await h.state("userns")).status == "succeeded", h.output("userns")
    assert h.output("userns") == [f"0:{line}" for line in NO_USERNS]


async def test_a_worker_may_write_to_dev_stdout_and_dev_stderr(h: Harness) -> None:
    """`echo x > /dev/stderr` opens the worker's output file again (/proc/self/fd/2): in
    the sandbox it is the worker user's, so the command works as it does anywhere."""
    command = (
        "echo out > /dev/stdout && echo err > /dev/stderr"
        f' && {shlex.quote(sys.executable)} -c \'open("/dev/stdout", "a").write("py\\n")\''
    )
    await h.launch("devout", make_spec(command))
    assert (await h.state("devout")).status == "succeeded", h.output("devout")
    assert sorted(h.output("devout")) == ["0:err", "0:out", "0:py"]
