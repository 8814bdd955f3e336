"""Fault tolerance with real processes: the deployer, its local runtime, the FT service
and (for reschedules) the scheduler, on a real Postgres.

A pump hands every stored event, in log order, to each app's `handle` (what their
Kafka consumers do); worker output goes from the runtime to `FaultToleranceApp.on_log`
(what the logs topic does). Nothing is faked in between: the env check is the real
`runyard.faulttolerance.bootcheck` program run in each worker's environment, the
all-reduce is a real gloo all-reduce between the worker processes, a faulty node is
marked through the scheduler's admin operation.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent, default_mapper
from runyard.contracts.spec import FaultToleranceOptions, TaskSpec, VolumeMount
from runyard.contracts.task_events import (
    EnvCheckFinished,
    EnvCheckItemReported,
    EnvCheckStarted,
    TaskFailed,
    TaskPlaced,
    TaskRescheduleFailed,
    TaskRescheduleRequested,
    TaskRestartScheduled,
    WorkerPlacement,
    WorkerStarted,
)
from runyard.deployer.app import DeployerApp
from runyard.deployer.runtime import LocalRuntime, LocalRuntimeConfig, OutputLine, group_members
from runyard.domain.task import Submit, TaskState, decide, fold
from runyard.eventstore import PostgresEventStore
from runyard.faulttolerance.app import FaultToleranceApp
from runyard.faulttolerance.bootcheck import FINISHED
from runyard.faulttolerance.ftlog import read_fault_tolerance_log

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_GPU_TOOLS = shutil.which("nvidia-smi") is not None


@dataclass
class World:
    store: PostgresEventStore
    tmp: Path
    runtime: LocalRuntime
    deployer: DeployerApp
    ft: FaultToleranceApp
    lines: list[OutputLine] = field(default_factory=list)
    apps: list[Any] = field(default_factory=list)

    async def events(self, task_id: str) -> list[RecordedEvent[Event]]:
        return await self.store.read_stream(f"task-{task_id}")

    async def payloads(self, task_id: str, kind: type[Any]) -> list[Any]:
        return [e.event for e in await self.events(task_id) if isinstance(e.event, kind)]

    async def append(self, task_id: str, *events: Event) -> None:
        stream = f"task-{task_id}"
        version = await self.store.stream_version(stream)
        now = datetime.now(UTC)
        meta = Metadata(actor="service:test")
        await self.store.append(stream, [NewEvent(e, meta, now) for e in events], version)

    async def submit(self, task_id: str, spec: TaskSpec) -> None:
        now = datetime.now(UTC)
        await self.append(
            task_id, *decide(None, Submit(task_id, "acme", "alice", spec), now=now, ids=lambda: "x")
        )

    async def until(
        self, task_id: str, done: Callable[[TaskState], bool], within: float = 60.0
    ) -> TaskState:
        async def poll() -> TaskState:
            while True:
                events = await self.events(task_id)
                if events:
                    state = fold(events)
                    if done(state):
                        return state
                await asyncio.sleep(0.05)

        try:
            return await asyncio.wait_for(poll(), within)
        except TimeoutError:
            types = [e.type for e in await self.events(task_id)]
            raise AssertionError(f"{task_id}: {types}; output: {self.output(task_id)}") from None

    def output(self, task_id: str, stream: str | None = None) -> list[str]:
        return [
            x.line
            for x in self.lines
            if x.task_id == task_id and (stream is None or x.stream == stream)
        ]


@contextlib.asynccontextmanager
async def world(
    store: PostgresEventStore, tmp: Path, *extra: Any, namespaces: bool | None = None
) -> AsyncIterator[World]:
    """The apps, fed by a pump; the store outlives it so the test can read afterwards."""
    runtime = LocalRuntime(
        LocalRuntimeConfig(
            scratch_root=tmp / "scratch",
            volumes_root=tmp / "volumes",
            images={"venv": Path(sys.prefix)},
            grace_s=1.0,
            namespaces=namespaces,
        )
    )
    ft = FaultToleranceApp(store, env_check_timeout_s=120)
    lines: list[OutputLine] = []

    async def sink(line: OutputLine) -> None:
        lines.append(line)
        await ft.on_log(line.record())

    deployer = DeployerApp(store, runtime, on_output=sink, stop_grace_s=1.0)
    w = World(store, tmp, runtime, deployer, ft, lines, [deployer, ft, *extra])

    async def pump() -> None:
        reader = store.all_reader(0)
        while True:
            for event in await reader.read(500):
                for app in w.apps:
                    await app.handle(event)
            await asyncio.sleep(0.02)

    task = asyncio.create_task(pump())
    try:
        yield w
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        with contextlib.suppress(Exception):
            await asyncio.wait_for(deployer.close(), 10)
        await ft.drain()


@pytest.fixture
async def store(dsn: str) -> AsyncIterator[PostgresEventStore]:
    opened = await PostgresEventStore.connect(dsn, default_mapper())
    try:
        yield opened
    finally:
        await opened.close()


def task_spec(
    command: str, *, workers: int, mounts: tuple[VolumeMount, ...] = (), **ft: Any
) -> TaskSpec:
    return TaskSpec(
        name="t",
        pool="dev",
        worker_spec="1gpu",
        worker_count=workers,
        image="venv",
        command=command,
        framework="pytorch_ddp" if workers > 1 else "single",
        mounts=mounts,
        fault_tolerance=FaultToleranceOptions(**ft),
    )


def mount_point() -> str:
    return f"/mnt/runyard-ft-{uuid.uuid4().hex[:8]}"


def items_of(events: list[EnvCheckItemReported], worker: int) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for item in events:
        if item.worker == worker:
            found.setdefault(item.item, []).append(item)
    return found


# --- env check (R-30) -----------------------------------------------------------------


@pytest.mark.parametrize("namespaces", [None, False], ids=["detected", "fallback"])
async def test_env_check_runs_in_every_worker_before_the_launch_command(
    store: PostgresEventStore, tmp_path: Path, namespaces: bool | None
) -> None:
    data = mount_point()
    spec = task_spec(
        'echo "launched rank $RANK"',
        workers=2,
        mounts=(VolumeMount(file_system="fs", volume="data", mount_path=data),),
        env_check=True,
    )
    async with world(store, tmp_path, namespaces=namespaces) as w:
        await w.submit("check", spec)
        workers = tuple(WorkerPlacement(index=i, node=f"n-{i}", gpus=(i,)) for i in range(2))
        await w.append("check", TaskPlaced(run=1, attempt=1, pool="dev", workers=workers))
        state = await w.until("check", lambda s: s.finished, within=180)
        await asyncio.wait_for(w.deployer.drain(), 10)
    assert state.status == "succeeded", state.last_failure_reason
    items = await w.payloads("check", EnvCheckItemReported)
    for worker in (0, 1):
        mine = items_of(items, worker)
        assert set(mine) == {"gpu", "rdma", "storage_io", "communication", "runtime"}, mine
        (gpu,) = mine["gpu"]
        if not HAS_GPU_TOOLS:
            assert gpu.result == "not_applicable" and "no NVIDIA driver" in gpu.detail
        (rdma,) = mine["rdma"]
        assert rdma.result == "not_applicable"
        (io,) = mine["storage_io"]
        assert io.result == "pass" and io.detail.startswith(f"{data}: wrote 8 MB at "), io
        (comm,) = mine["communication"]
        if HAS_TORCH:
            assert comm.result == "pass", comm.detail
            assert comm.detail.startswith("gloo all-reduce of 4 MB over 2 worker(s)")
        else:
            assert comm.result == "not_applicable" and "PyTorch" in comm.detail
        (runtime,) = mine["runtime"]
        assert runtime.result == "pass" and runtime.detail.startswith("Python ")
    (finished,) = await w.payloads("check", EnvCheckFinished)
    assert finished.result == "pass", items
    # every worker printed the end line, on stdout, before its launch command ran
    stdout = [(x.worker, x.line) for x in w.lines if x.task_id == "check" and x.stream == "stdout"]
    for worker in (0, 1):
        said = [line for i, line in stdout if i == worker]
        assert FINISHED in said and f"launched rank {worker}" in said
        assert said.index(FINISHED) < said.index(f"launched rank {worker}")
    types = [e.type for e in await w.events("check")]
    assert types.index("EnvCheckStarted") < types.index("EnvCheckFinished")
    assert types.index("EnvCheckFinished") < types.index("WorkerStarted")
    ft = await read_fault_tolerance_log(w.store, "check")
    texts = [line.text for line in ft.lines]
    assert texts[0] == "Bootcheck started" and texts[-1].startswith("Bootcheck Finished: pass")
    assert sum(t.startswith("worker ") for t in texts) == len(items) == 10
    with contextlib.suppress(OSError):
        os.rmdir(data)


@pytest.fixture
def read_only_fs(tmp_path: Path) -> Any:
    """A volume's host directory on a read-only file system (a tmpfs mounted `ro`)."""
    host = tmp_path / "volumes" / "ro-fs" / "ckpt"
    host.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(host)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield host
    finally:
        subprocess.run(["umount", "-l", str(host)], check=False)


async def test_a_volume_that_cannot_be_written_is_a_warning_and_the_task_runs(
    store: PostgresEventStore, tmp_path: Path, read_only_fs: Path
) -> None:
    ckpt, data = mount_point(), mount_point()
    spec = task_spec(
        "echo launched",
        workers=1,
        mounts=(
            # meant to be written (checkpoints), but its storage is read-only
            VolumeMount(file_system="ro-fs", volume="ckpt", mount_path=ckpt),
            # read-only by the spec: only listed, never written
            VolumeMount(file_system="fs", volume="data", mount_path=data, read_only=True),
        ),
        env_check=True,
    )
    async with world(store, tmp_path) as w:
        await w.submit("ro", spec)
        workers = (WorkerPlacement(index=0, node="n-0", gpus=(0,)),)
        await w.append("ro", TaskPlaced(run=1, attempt=1, pool="dev", workers=workers))
        state = await w.until("ro", lambda s: s.finished, within=120)
        await asyncio.wait_for(w.deployer.drain(), 10)
    assert state.status == "succeeded", state.last_failure_reason
    io = {
        i.detail.split(":")[0]: i
        for i in await w.payloads("ro", EnvCheckItemReported)
        if i.item == "storage_io"
    }
    assert io[ckpt].result == "fail" and not io[ckpt].blocking
    assert io[ckpt].detail == f"{ckpt}: cannot write: Read-only file system"
    assert io[data].result == "pass" and "read-only volume readable" in io[data].detail
    (finished,) = await w.payloads("ro", EnvCheckFinished)
    assert (finished.result, finished.blocking_failures, finished.warnings) == ("warn", 0, 1)
    assert w.output("ro")[-1] == "launched"  # the launch command still ran
    assert await w.payloads("ro", TaskRescheduleRequested) == []
    ft = await read_fault_tolerance_log(w.store, "ro")
    (line,) = [x for x in ft.lines if "Read-only file system" in x.text]
    assert line.level == "warning"
    assert line.text == f"worker 0 storage_io: fail - {ckpt}: cannot write: Read-only file system"
    for path in (ckpt, data):
        with contextlib.suppress(OSError):
            os.rmdir(path)


# --- a node marked faulty while the task runs (R-31) ------------------------------------


def pools(nodes: int) -> Any:
    from runyard.scheduler.config import parse_pools

    return parse_pools(
        {
            "pools": [
                {
                    "id": "dev",
                    "zone": "z",
                    "resource_type": "subscription",
                    "gpu_model": "A100",
                    "network": "roce",
                    "specs": [{"name": "1gpu", "gpus": 1, "cpus": 8, "memory_gib": 64}],
                    "nodes": {"prefix": "n-", "count": nodes, "gpus": 2},
                }
            ]
        }
    )


@contextlib.asynccontextmanager
async def with_scheduler(
    store: PostgresEventStore, tmp_path: Path, nodes: int
) -> AsyncIterator[tuple[World, Any]]:
    from runyard.scheduler.app import SchedulerApp

    scheduler = SchedulerApp(store, pools(nodes))
    await scheduler.start()
    async with world(store, tmp_path, scheduler) as w:
        yield w, scheduler


MOVING = (
    'echo "on $RUNYARD_NODE attempt $RUNYARD_ATTEMPT"; '
    'if [ "$RUNYARD_ATTEMPT" = 1 ]; then sleep 60; fi'
)


async def test_a_faulty_node_moves_the_task_to_a_healthy_one_and_restarts_it(
    store: PostgresEventStore, tmp_path: Path
) -> None:
    async with with_scheduler(store, tmp_path, nodes=2) as (w, scheduler):
        await w.submit("move", task_spec(MOVING, workers=2))
        await w.until("move", lambda s: s.status == "running")
        state = fold(await w.events("move"))
        bad = state.workers[0].node
        old = list(w.runtime.pids(("move", 1, 1)).values())
        await scheduler.mark_node_faulty("dev", bad, "GPU 3 fell off the bus")
        state = await w.until("move", lambda s: s.finished)
        await asyncio.wait_for(w.deployer.drain(), 10)
    assert state.status == "succeeded", state.last_failure_reason
    assert (state.attempt, state.restarts, state.reschedules) == (2, 1, 1)
    (moved,) = await w.payloads("move", TaskRescheduleRequested)
    assert moved.faulty_nodes == (bad,) and moved.attempt == 1
    assert moved.reason == f"node {bad} is faulty: GPU 3 fell off the bus"
    (restart,) = await w.payloads("move", TaskRestartScheduled)
    assert (restart.reason, restart.attempt) == ("hardware_fault", 2)
    placed = await w.payloads("move", TaskPlaced)
    assert [p.attempt for p in placed] == [1, 2]
    assert bad not in {x.node for x in placed[1].workers}
    started = await w.payloads("move", WorkerStarted)
    assert sorted((s.attempt, s.worker) for s in started) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(s.node != bad for s in started if s.attempt == 2)
    assert not any(group_members(pid) for pid in old), "the old attempt's workers are gone"
    assert sorted(x for x in w.output("move") if x.endswith("attempt 2")) == sorted(
        f"on {x.node} attempt 2" for x in placed[1].workers
    )
    ft = await read_fault_tolerance_log(w.store, "move")
    assert ft.counts() == {"restarts": 1, "reschedules": 1, "hangs": 0, "slowdowns": 0}
    assert [line.text for line in ft.lines[:3]] == [
        f"Reschedule 1 requested: node {bad} is faulty: GPU 3 fell off the bus (faulty: {bad})",
        "Restart 1 scheduled after hardware fault: attempt 2 on healthy nodes",
        f"Placed again on {', '.join(sorted({x.node for x in placed[1].workers}))}",
    ]
    # then at most the R-32 warning: this script loads no checkpoint after its restart
    assert [line.kind for line in ft.lines[3:]] in ([], ["resume"])


async def test_a_faulty_node_without_a_spare_fails_the_task_unrecoverably(
    store: PostgresEventStore, tmp_path: Path
) -> None:
    async with with_scheduler(store, tmp_path, nodes=1) as (w, scheduler):
        await w.submit("stuck", task_spec(MOVING, workers=2))
        await w.until("stuck", lambda s: s.status == "running")
        old = list(w.runtime.pids(("stuck", 1, 1)).values())
        await scheduler.mark_node_faulty("dev", "n-0", "GPU 3 fell off the bus")
        state = await w.until("stuck", lambda s: s.finished)
        await asyncio.wait_for(w.deployer.drain(), 10)
    assert state.status == "failed"
    (failed,) = await w.payloads("stuck", TaskFailed)
    assert failed.unrecoverable
    assert failed.reason.startswith("cannot be recovered: no healthy node can take task stuck")
    assert failed.reason.endswith(
        "(rescheduled because node n-0 is faulty: GPU 3 fell off the bus)"
    )
    assert len(await w.payloads("stuck", TaskRescheduleFailed)) == 1
    assert len(await w.payloads("stuck", WorkerStarted)) == 2  # never started again
    assert not any(group_members(pid) for pid in old)
    ft = await read_fault_tolerance_log(w.store, "stuck")
    assert ft.lines[-1].level == "error"
    assert ft.lines[-1].text == f"Task failed: {failed.reason}"
    assert ft.lines[-2].text.startswith("Reschedule failed: no healthy node can take task stuck")


async def test_env_check_events_come_from_the_ft_service_only(
    store: PostgresEventStore, tmp_path: Path
) -> None:
    """The deployer appends no env check event (R-30): EnvCheck* are the FT service's."""
    spec = task_spec("echo ok", workers=1, env_check=True)
    async with world(store, tmp_path) as w:
        await w.submit("who", spec)
        workers = (WorkerPlacement(index=0, node="n-0", gpus=(0,)),)
        await w.append("who", TaskPlaced(run=1, attempt=1, pool="dev", workers=workers))
        await w.until("who", lambda s: s.finished, within=120)
        await asyncio.wait_for(w.deployer.drain(), 10)
    kinds = (EnvCheckStarted, EnvCheckItemReported, EnvCheckFinished)
    actors = {e.metadata.actor for e in await w.events("who") if isinstance(e.event, kinds)}
    assert actors == {"service:faulttolerance"}


FAKE_SMI = """#!/bin/bash
# A node whose GPU fell off the bus in attempt 1; a healthy one afterwards.
if [ "$RUNYARD_ATTEMPT" = 1 ]; then
    echo "Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost" >&2
    exit 15
fi
echo "0, NVIDIA A100-SXM4-80GB, 81920, 0"
"""


@pytest.fixture
def gpu_image() -> Any:
    """An image whose `nvidia-smi` reports a lost GPU in attempt 1 (and Runyard's python).

    Not under /tmp: a worker's own mount namespace hides the host's /tmp.
    """
    build = Path(__file__).resolve().parents[2] / "build"
    build.mkdir(exist_ok=True)
    image = Path(tempfile.mkdtemp(prefix="runyard-gpu-image-", dir=build))
    image.chmod(0o755)  # readable by the unprivileged user sandboxed workers run as
    (image / "bin").mkdir(parents=True)
    for name, text in (
        ("nvidia-smi", FAKE_SMI),
        ("python", f'#!/bin/bash\nexec "{sys.executable}" "$@"\n'),
    ):
        (image / "bin" / name).write_text(text)
        (image / "bin" / name).chmod(0o755)
    yield image
    shutil.rmtree(image, ignore_errors=True)


async def test_a_gpu_fault_at_env_check_reschedules_and_restarts_before_the_launch(
    store: PostgresEventStore, tmp_path: Path, gpu_image: Path
) -> None:
    spec = task_spec('echo "launched on $RUNYARD_NODE"', workers=1, env_check=True)
    async with with_scheduler(store, tmp_path, nodes=2) as (w, _):
        w.runtime.config.images["gpu"] = gpu_image  # type: ignore[index]
        await w.submit("lost", spec.model_copy(update={"image": "gpu"}))
        state = await w.until("lost", lambda s: s.finished, within=40)
        await asyncio.wait_for(w.deployer.drain(), 10)
    assert state.status == "succeeded", state.last_failure_reason
    assert (state.attempt, state.restarts, state.reschedules) == (2, 1, 1)
    gpu = [i for i in await w.payloads("lost", EnvCheckItemReported) if i.item == "gpu"]
    assert [(i.attempt, i.result, i.blocking) for i in gpu] == [
        (1, "fail", True),
        (2, "pass", False),
    ]
    assert "GPU is lost" in gpu[0].detail
    placed = await w.payloads("lost", TaskPlaced)
    (moved,) = await w.payloads("lost", TaskRescheduleRequested)
    assert moved.faulty_nodes == (placed[0].workers[0].node,)
    assert placed[1].workers[0].node != placed[0].workers[0].node
    started = await w.payloads("lost", WorkerStarted)
    assert [s.attempt for s in started] == [2]  # the launch command never ran on the bad node
    assert [x for x in w.output("lost") if x.startswith("launched")] == [
        f"launched on {placed[1].workers[0].node}"
    ]


@pytest.fixture
def image_without_runyard() -> Any:
    """An image whose `python` cannot import Runyard (a custom image): the env check
    program ends at once with an error, before `Bootcheck Finished`."""
    build = Path(__file__).resolve().parents[2] / "build"
    build.mkdir(exist_ok=True)
    image = Path(tempfile.mkdtemp(prefix="runyard-bare-image-", dir=build))
    image.chmod(0o755)
    (image / "bin").mkdir()
    python = image / "bin" / "python"
    python.write_text(
        "#!/bin/bash\necho \"No module named 'runyard'\" >&2\nexit 1\n"  # as python says it
    )
    python.chmod(0o755)
    yield image
    shutil.rmtree(image, ignore_errors=True)


async def test_an_env_check_program_that_cannot_run_finishes_the_check_at_once(
    store: PostgresEventStore, tmp_path: Path, image_without_runyard: Path
) -> None:
    """Not 600 s in env_checking with the GPUs held (the service's timeout, 120 s here):
    the worker's check reports its `runtime` item failed with the exit status at once,
    a warning, and the launch command runs."""
    spec = task_spec("echo launched", workers=2, env_check=True)
    async with world(store, tmp_path) as w:
        w.runtime.config.images["bare"] = image_without_runyard  # type: ignore[index]
        await w.submit("bare", spec.model_copy(update={"image": "bare"}))
        workers = tuple(WorkerPlacement(index=i, node=f"n-{i}", gpus=(i,)) for i in range(2))
        await w.append("bare", TaskPlaced(run=1, attempt=1, pool="dev", workers=workers))
        state = await w.until("bare", lambda s: s.finished, within=30)
    assert state.status == "succeeded", state.last_failure_reason
    (finished,) = await w.payloads("bare", EnvCheckFinished)
    assert finished.result == "warn"
    items = await w.payloads("bare", EnvCheckItemReported)
    assert sorted((i.worker, i.item, i.result, i.blocking) for i in items) == [
        (0, "runtime", "fail", False),
        (1, "runtime", "fail", False),
    ]
    assert all("exit status 1 before it finished" in i.detail for i in items)
    assert "No module named 'runyard'" in w.output("bare", "stderr")
    assert w.output("bare", "stdout").count("launched") == 2
