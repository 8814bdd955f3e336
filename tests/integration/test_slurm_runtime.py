"""The deployer with the Slurm runtime, on a real slurmctld and two slurmd (n1, n2).

As tests/integration/test_deployer.py does for the local runtime: tests append
`TaskSubmitted` and `TaskPlaced` (workers on Slurm's nodes), hand the events to
`DeployerApp.handle`, and read the stream back; Slurm runs the workers as steps
of one job per attempt. Skipped, with the reason, where Slurm cannot run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
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
from runyard.deployer.app import DeployerApp
from runyard.deployer.runtime import OutputLine, Runtime
from runyard.deployer.slurm import SlurmRuntime, SlurmRuntimeConfig
from runyard.domain.task import RequestStop, Submit, decide, fold
from runyard.eventstore import PostgresEventStore
from runyard.stack.slurm import SlurmCluster

from tests.integration.test_deployer import NO_USERNS, userns_probe

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

#: Generous: two cores shared with other work; Slurm polls and schedules in between.
WITHIN_S = 90.0


def make_spec(command: str, *, workers: int = 1, image: str = "python", **kw: Any) -> TaskSpec:
    return TaskSpec(
        name="t",
        pool="slurm",
        worker_spec="1gpu",
        worker_count=workers,
        image=image,
        command=command,
        **kw,
    )


class Harness:
    def __init__(
        self,
        store: PostgresEventStore,
        app: DeployerApp,
        runtime: SlurmRuntime,
        cluster: SlurmCluster,
    ) -> None:
        self.store = store
        self.app = app
        self.runtime = runtime
        self.cluster = cluster
        self.lines: list[OutputLine] = []

    async def events(self, task_id: str) -> list[RecordedEvent[Event]]:
        return await self.store.read_stream(f"task-{task_id}")

    async def types(self, task_id: str) -> list[str]:
        return [e.type for e in await self.events(task_id)]

    async def append(self, task_id: str, events: list[Event]) -> list[RecordedEvent[Event]]:
        stream = f"task-{task_id}"
        version = await self.store.stream_version(stream)
        meta = Metadata(actor="service:test")
        now = datetime.now(UTC)
        await self.store.append(stream, [NewEvent(e, meta, now) for e in events], version)
        return await self.store.read_stream(stream, version + 1)

    async def deliver(self, recorded: list[RecordedEvent[Event]]) -> None:
        for event in recorded:
            await self.app.handle(event)

    async def launch(
        self,
        task_id: str,
        spec: TaskSpec,
        *,
        wait: bool = True,
        gpus: tuple[int, ...] = (0,),
        one_node: bool = False,
        **resources: int,
    ) -> None:
        """Submit and place the task (worker i on node n<i+1>, `gpus`, `resources`: cpus and
        memory_gib; with `one_node`, every worker on n1, worker i with GPU i), hand the
        placement over."""
        submitted = decide(
            None, Submit(task_id, "acme", "alice", spec), now=datetime.now(UTC), ids=lambda: "x"
        )
        await self.append(task_id, submitted)
        nodes = self.cluster.nodes
        workers = tuple(
            WorkerPlacement(index=i, node=nodes[0], gpus=(i,), **resources)
            if one_node
            else WorkerPlacement(index=i, node=nodes[i % len(nodes)], gpus=gpus, **resources)
            for i in range(spec.worker_count)
        )
        placed = TaskPlaced(run=1, attempt=1, pool="slurm", workers=workers)
        await self.deliver(await self.append(task_id, [placed]))
        if wait:
            await asyncio.wait_for(self.app.drain(), WITHIN_S)

    async def state(self, task_id: str) -> Any:
        return fold(await self.events(task_id))

    async def wait_for(self, task_id: str, type_name: str, within: float = WITHIN_S) -> None:
        async def poll() -> None:
            while type_name not in await self.types(task_id):  # noqa: ASYNC110
                await asyncio.sleep(0.05)

        await asyncio.wait_for(poll(), within)

    def output(self, task_id: str) -> list[str]:
        return [f"{x.worker}:{x.line}" for x in self.lines if x.task_id == task_id]

    async def until_output(self, task_id: str, line: str, within: float = WITHIN_S) -> None:
        """Until `line` (`<worker>:<text>`) of the task's output has been published."""
        deadline = asyncio.get_running_loop().time() + within
        while line not in self.output(task_id):
            assert asyncio.get_running_loop().time() < deadline, self.output(task_id)
            await asyncio.sleep(0.05)

    def jobs(self) -> list[str]:
        """Every job Slurm holds now (squeue)."""
        return self.cluster.run("squeue", "-h", "-o", "%i %j %T").splitlines()


@pytest.fixture
async def h(dsn: str, tmp_path: Path, slurm_cluster: SlurmCluster) -> AsyncIterator[Harness]:
    store = await PostgresEventStore.connect(dsn, default_mapper())
    config = SlurmRuntimeConfig(
        scratch_root=tmp_path / "scratch",
        volumes_root=tmp_path / "volumes",
        images={"python": Path(sys.prefix)},
        grace_s=2.0,
        partition=slurm_cluster.partition,
        slurm_conf=slurm_cluster.conf,
    )
    runtime = SlurmRuntime(config)
    harness: Harness

    async def sink(line: OutputLine) -> None:
        harness.lines.append(line)

    app = DeployerApp(store, runtime, on_output=sink, stop_grace_s=2.0)
    harness = Harness(store, app, runtime, slurm_cluster)
    try:
        yield harness
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(app.close(), 60)
        await store.close()


#: A file the test makes to let a worker go on, in the worker's scratch folder (the
#: folder of its $HOME): all a sandboxed worker sees of the host's folders, and not on
#: its system disk, which the host does not see (`release_file`).
RELEASE = {"name": "RELEASE", "value": "release"}
#: Until the release file is there (bash).
WAIT_FOR_RELEASE = 'while [ ! -e "$(dirname "$HOME")/$RELEASE" ]; do sleep 0.1; done'


def release_file(runtime: SlurmRuntime, task_id: str, worker: int) -> Path:
    """The release file of a worker of attempt 1 of run 1, on the host."""
    return runtime.config.scratch_root / task_id / "run1-a1" / f"w{worker}" / "release"


def task_processes(task_id: str) -> list[int]:
    """Live processes whose environment names the task (workers and what they left)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        if stat[stat.rfind(")") + 2 :][:1] in ("Z", "X"):
            continue
        if f"RUNYARD_TASK_ID={task_id}".encode() in env:
            found.append(int(entry))
    return found


def job_processes(task_id: str) -> list[int]:
    """Live processes of the task's Slurm jobs on the host (batch script, steps, the
    holder of a one-node deployment's network): `SLURM_JOB_NAME` in their environment."""
    name = f"SLURM_JOB_NAME=runyard-{task_id}-r".encode()
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError), open(f"/proc/{entry}/environ", "rb") as f:
            if any(v.startswith(name) for v in f.read().split(b"\0")):
                found.append(int(entry))
    return found


async def until_no_job_process(task_id: str) -> None:
    """Until `job_processes` finds none, within `WITHIN_S`."""
    deadline = asyncio.get_running_loop().time() + WITHIN_S
    while left := job_processes(task_id):
        assert asyncio.get_running_loop().time() < deadline, left
        await asyncio.sleep(0.1)


async def test_true_succeeds_with_every_stage_timed(h: Harness) -> None:
    await h.launch("ok", make_spec("true"))
    events = [e.event for e in await h.events("ok")]
    started = [e.stage for e in events if isinstance(e, DeployStageStarted)]
    completed = [e for e in events if isinstance(e, DeployStageCompleted)]
    assert started == list(DEPLOY_STAGES)
    assert [e.stage for e in completed] == list(DEPLOY_STAGES)
    assert all(isinstance(e.duration_ms, int) and e.duration_ms >= 0 for e in completed)
    assert (await h.types("ok"))[-4:] == [
        "WorkerStarted",
        "TaskRunning",
        "WorkerExited",
        "TaskSucceeded",
    ]
    assert not [j for j in h.jobs() if "runyard-ok-" in j]


ALLREDUCE = """
import os, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # env:// from MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
print(f"rank {rank} of {world} on {os.environ['SLURMD_NODENAME']}: sum {value.item():.0f}")
assert value.item() == world * (world + 1) / 2
dist.destroy_process_group()
release = os.path.join(os.path.dirname(os.environ["HOME"]), os.environ["RELEASE"])
while not os.path.exists(release):  # the test reads the lines meanwhile
    time.sleep(0.1)
"""


async def test_a_worker_that_ends_while_slurm_is_asked_is_an_exit_not_a_failure_to_start(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`true` may start, end and take its job with it between the runtime's look at the
    worker's files and Slurm's answer about the job: Slurm answers here only once the
    worker's status is written."""
    status = h.runtime.config.scratch_root / "quick" / "run1-a1" / "w0" / "exit_status"

    async def over_once_the_worker_ended(job: str) -> bool:
        while not status.exists():  # noqa: ASYNC110 (a file another process writes)
            await asyncio.sleep(0.05)
        return True

    monkeypatch.setattr(h.runtime, "_job_over", over_once_the_worker_ended)
    await h.launch("quick", make_spec("true"))
    assert (await h.state("quick")).status == "succeeded", await h.types("quick")


async def test_pytorch_ddp_gloo_all_reduce_on_two_nodes_with_lines_while_running(
    h: Harness,
) -> None:
    pytest.importorskip("torch")
    spec = make_spec(
        f"set -o pipefail\npython - <<'EOF'\n{ALLREDUCE}\nEOF",
        workers=2,
        framework="pytorch_ddp",
        env=(RELEASE,),
    )
    await h.launch("ddp", spec, wait=False)
    wanted = {"0:rank 0 of 2 on n1: sum 3", "1:rank 1 of 2 on n2: sum 3"}
    deadline = asyncio.get_running_loop().time() + WITHIN_S
    while not wanted <= set(h.output("ddp")):
        assert asyncio.get_running_loop().time() < deadline, h.output("ddp")
        await asyncio.sleep(0.1)
    # Both lines arrived while the workers still run (they wait for the release file).
    assert (await h.state("ddp")).status == "running"
    for worker in (0, 1):
        release_file(h.runtime, "ddp", worker).touch()
    await asyncio.wait_for(h.app.drain(), WITHIN_S)
    assert (await h.state("ddp")).status == "succeeded"
    seqs = [x.seq for x in h.lines if x.task_id == "ddp" and x.stream == "stdout"]
    assert seqs == [0, 0]


async def test_pytorch_ddp_env_names_the_first_node_and_the_placed_gpus(h: Harness) -> None:
    command = 'echo "$RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT $CUDA_VISIBLE_DEVICES $FOO"'
    spec = make_spec(
        command, workers=2, framework="pytorch_ddp", env=({"name": "FOO", "value": "bar"},)
    )
    await h.launch("env", spec)
    assert (await h.state("env")).status == "succeeded"
    lines = sorted(h.output("env"))
    port = lines[0].split()[3]
    assert lines == [f"0:0 2 127.0.0.1 {port} 0 bar", f"1:1 2 127.0.0.1 {port} 0 bar"]
    # The env files (and the whole deployment folder) are gone with the task.
    assert not (h.runtime.config.scratch_root / "env").exists()


#: Worker 0 listens on the loopback, worker 1 connects to it (DDP's rendezvous); each
#: tries the node's loopback port in argv[1], where the control plane listens.
REACH = """
import os, socket, sys, time
rank = int(os.environ["RUNYARD_WORKER_INDEX"])
if rank == 0:
    server = socket.create_server(("127.0.0.1", 29411))
    server.settimeout(60)
    peer, _ = server.accept()
    print("peer", peer.recv(16).decode())
else:
    for _ in range(600):
        try:
            with socket.create_connection(("127.0.0.1", 29411), timeout=1) as c:
                c.sendall(b"hello")
            break
        except OSError:
            time.sleep(0.1)
    else:
        print("peer unreachable")
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3).close()
    print("node", "reached")
except OSError as exc:
    print("node", type(exc).__name__)
"""


@pytest.mark.parametrize("one_node", [True, False], ids=["one-node", "two-nodes-one-host"])
async def test_workers_on_one_host_share_a_loopback_but_not_the_nodes(
    h: Harness, one_node: bool
) -> None:
    """Sandboxed workers all on one node, or on nodes that are one host (this cluster's
    n1 and n2: one NodeHostName and NodeAddr), are in a network of their own, as local
    ones: they reach each other on 127.0.0.1, and not what listens on the host's
    loopback (the control plane: Postgres, the broker, the gateway). Workers on several
    hosts stay in the nodes' network."""
    if h.runtime.worker_ids is None:
        pytest.skip("workers are sandboxed only when the deployer and slurmd run as root")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        command = f"python - {port} <<'EOF'\n{REACH}\nEOF"
        spec = make_spec(command, workers=2, framework="pytorch_ddp")
        await h.launch("net", spec, one_node=one_node)
        assert (await h.state("net")).status == "succeeded", h.output("net")
    assert sorted(h.output("net")) == [
        "0:node ConnectionRefusedError",
        "0:peer hello",
        "1:node ConnectionRefusedError",
    ]
    placed = {w.node for w in (await h.state("net")).workers}
    assert placed == ({"n1"} if one_node else {"n1", "n2"}), placed
    # The deployment's folder is gone, its holder's pid file with it; no holder is left.
    assert not (h.runtime.config.scratch_root / "net").exists()
    await until_no_job_process("net")


async def test_workers_of_a_job_found_after_a_restart_keep_its_network(h: Harness) -> None:
    """Whether a deployment's workers have a network of their own is decided when its
    batch script is written (here two nodes of one host: yes). A deployer that takes
    the job over after a restart reads it from that script, so the workers it starts
    join the holder the script made instead of running in the nodes' network."""
    from runyard.deployer.runtime import Deployment

    if h.runtime.worker_ids is None:
        pytest.skip("workers are sandboxed only when the deployer and slurmd run as root")
    workers = tuple(WorkerPlacement(index=i, node=f"n{i + 1}", gpus=(0,)) for i in range(2))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        spec = make_spec(f"python - {port} <<'EOF'\n{REACH}\nEOF", workers=2)
        deployment = Deployment("renet", 1, 1, spec, workers)
        await h.runtime.allocate(deployment)
        h.runtime.detach()
        runtime2 = SlurmRuntime(h.runtime.config)
        lines: list[OutputLine] = []

        async def collect(line: OutputLine) -> None:
            lines.append(line)

        async def exited(key: object, worker: int, code: int, at: datetime) -> None:
            pass  # `wait` answers the codes

        try:
            for step in (
                runtime2.allocate,
                runtime2.pull_image,
                runtime2.mount_storage,
                runtime2.init_env,
            ):
                await step(deployment)
            await runtime2.start_workers(deployment, collect, exited)
            codes = await asyncio.wait_for(runtime2.wait(deployment.key), WITHIN_S)
            assert codes == {0: 0, 1: 0}, [x.line for x in lines]
        finally:
            await runtime2.cleanup(deployment.key)
    said = sorted(f"{x.worker}:{x.line}" for x in lines if x.stream == "stdout")
    assert said == [
        "0:node ConnectionRefusedError",
        "0:peer hello",
        "1:node ConnectionRefusedError",
    ]


async def test_a_worker_whose_network_could_not_be_made_fails_saying_so(h: Harness) -> None:
    """The batch script's holder cannot bring its loopback up (here `ip` fails): the
    worker does not run in the node's network instead; it fails with 112 and why."""
    if h.runtime.worker_ids is None:
        pytest.skip("workers are sandboxed only when the deployer and slurmd run as root")
    h.runtime.tools = dataclasses.replace(h.runtime.tools, ip=shutil.which("false") or "false")
    await h.launch("nonet", make_spec("echo ran"))
    failed = (await h.events("nonet"))[-1].event
    assert isinstance(failed, TaskFailed) and failed.exit_code == 112, failed
    said = [x.line for x in h.lines if x.task_id == "nonet"]
    assert "ran" not in said
    assert any("network namespace is missing on n1" in line for line in said), said


async def test_the_env_check_of_workers_on_one_node_runs_in_their_network(
    h: Harness, tmp_path: Path
) -> None:
    """The env check runs in the workers' environment, so a task's code can run in it
    (here a `sitecustomize` on a volume, through PYTHONPATH): it is in the deployment's
    network too, where its all-reduce finds its peer and the node's listeners are out of
    reach."""
    from runyard.deployer.runtime import Deployment, free_port

    if h.runtime.worker_ids is None:
        pytest.skip("workers are sandboxed only when the deployer and slurmd run as root")
    tools = f"/mnt/runyard-test-{tmp_path.name}"
    seed = h.runtime.config.volumes_root / "fs" / "tools"
    seed.mkdir(parents=True)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        (seed / "sitecustomize.py").write_text(
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=3).close()\n"
            "    print('site node reached', flush=True)\n"
            "except OSError as exc:\n"
            "    print('site node', type(exc).__name__, flush=True)\n"
        )
        spec = make_spec(
            "true",
            workers=2,
            framework="pytorch_ddp",
            env=({"name": "PYTHONPATH", "value": tools},),
            mounts=({"file_system": "fs", "volume": "tools", "mount_path": tools},),
        )
        workers = tuple(WorkerPlacement(index=i, node="n1", gpus=(i,)) for i in range(2))
        deployment = Deployment("checknet", 1, 1, spec, workers)
        runtime = h.runtime
        lines: list[OutputLine] = []

        async def collect(line: OutputLine) -> None:
            lines.append(line)

        try:
            for step in (
                runtime.allocate,
                runtime.pull_image,
                runtime.mount_storage,
                runtime.init_env,
            ):
                await step(deployment)
            await runtime.start_env_check(deployment, collect, port=free_port(0))
            codes = await asyncio.wait_for(runtime.wait_env_check(deployment.key), WITHIN_S)
            assert codes == {0: 0, 1: 0}, [x.line for x in lines]
        finally:
            await runtime.cleanup(deployment.key)
            shutil.rmtree(tools, ignore_errors=True)
    for worker in (0, 1):
        said = [x.line for x in lines if x.worker == worker and x.stream == "stdout"]
        assert "site node ConnectionRefusedError" in said, said
        assert any(s.startswith("Bootcheck Finished") for s in said), said


async def test_a_slurm_worker_sees_the_gpus_slurm_gave_its_step(h: Harness) -> None:
    """Slurm, not Runyard's placement, picks which GPUs of a node a job gets
    (`--gres=gpu:<n>`): a worker placed on GPU 3 that Slurm gave GPU 0 (the first free)
    runs with Slurm's CUDA_VISIBLE_DEVICES, the GPUs it may open, not the placement's;
    its `WorkerStarted` records the GPUs it got, for whoever reads the log later."""
    await h.launch("gres", make_spec('echo "gpus=$CUDA_VISIBLE_DEVICES"'), gpus=(3,))
    assert (await h.state("gres")).status == "succeeded"
    assert h.output("gres") == ["0:gpus=0"]
    started = [e.event for e in await h.events("gres") if isinstance(e.event, WorkerStarted)]
    assert [w.gpus for w in started] == [(0,)]
    # Where Slurm gives the placement's own GPUs, the event says nothing more.
    await h.launch("same", make_spec("true"), gpus=(0,))
    started = [e.event for e in await h.events("same") if isinstance(e.event, WorkerStarted)]
    assert [w.gpus for w in started] == [None]


async def test_failing_command_fails_with_its_exit_code(h: Harness) -> None:
    await h.launch("bad", make_spec("echo about to fail >&2; exit 3"))
    failed = (await h.events("bad"))[-1].event
    assert isinstance(failed, TaskFailed)
    assert failed.exit_code == 3 and failed.worker == 0
    assert "0:about to fail" in h.output("bad")
    assert [x.stream for x in h.lines if x.task_id == "bad"] == ["stderr"]


async def test_a_job_cancelled_outside_runyard_says_so_on_the_workers_stderr(h: Harness) -> None:
    """An scancel from outside (or a time limit, a node lost) ends the worker with
    SIGTERM: its exit code alone (143) does not say who; a line on its stderr does."""
    await h.launch("scancelled", make_spec("echo up; sleep 300"), wait=False)
    await h.until_output("scancelled", "0:up")  # the command runs (its shell gets the TERM)
    job = h.runtime.job_id(("scancelled", 1, 1))
    assert job is not None
    h.cluster.run("scancel", job)
    await h.wait_for("scancelled", "TaskFailed")
    await asyncio.wait_for(h.app.drain(), WITHIN_S)
    failed = (await h.events("scancelled"))[-1].event
    assert isinstance(failed, TaskFailed) and failed.exit_code == 143
    said = [x.line for x in h.lines if x.task_id == "scancelled" and x.stream == "stderr"]
    assert any(f"Slurm ended job {job}: CANCELLED" in line for line in said), said


async def test_pipe_without_pipefail_reports_what_the_command_returned(h: Harness) -> None:
    command = "echo x | tee f; false | tee g"
    await h.launch("pipe", make_spec(command))
    assert (await h.state("pipe")).status == "succeeded"
    await h.launch("pipefail", make_spec("set -o pipefail; " + command))
    assert (await h.state("pipefail")).status == "failed"
    exited = [e.event for e in await h.events("pipefail") if isinstance(e.event, WorkerExited)]
    assert exited[0].exit_code == 1


async def test_a_failing_worker_ends_its_peer_and_the_job(h: Harness) -> None:
    command = 'if [ "$RUNYARD_WORKER_INDEX" = 1 ]; then sleep 1; exit 7; fi; sleep 300'
    await h.launch("gang", make_spec(command, workers=2))
    outcome = [e.event for e in await h.events("gang") if isinstance(e.event, TaskFailed)]
    assert len(outcome) == 1 and outcome[0].worker == 1 and outcome[0].exit_code == 7
    exited = {
        e.event.worker: e.event.exit_code
        for e in await h.events("gang")
        if isinstance(e.event, WorkerExited)
    }
    assert exited == {1: 7, 0: 143}  # the peer's sleep got SIGTERM
    assert not [j for j in h.jobs() if "runyard-gang-" in j]
    assert task_processes("gang") == []


async def test_stop_cancels_the_job_and_leaves_no_process(h: Harness) -> None:
    # Each worker leaves a background child and ignores SIGTERM: only SIGKILL ends it.
    command = "sleep 300 & trap '' TERM; sleep 300; wait"
    await h.launch("stopme", make_spec(command, workers=2), wait=False)
    await h.wait_for("stopme", "TaskRunning")
    assert [j for j in h.jobs() if "runyard-stopme-" in j]
    deadline = asyncio.get_running_loop().time() + WITHIN_S
    while len(task_processes("stopme")) < 4:  # both sleeps of both workers
        assert asyncio.get_running_loop().time() < deadline, task_processes("stopme")
        await asyncio.sleep(0.1)
    state = await h.state("stopme")
    stop = decide(state, RequestStop("stopme"), now=state.submitted_at, ids=lambda: "x")
    await h.deliver(await h.append("stopme", stop))
    await asyncio.wait_for(h.app.drain(), WITHIN_S)
    assert (await h.types("stopme"))[-1] == "TaskStopped"
    assert not [j for j in h.jobs() if "runyard-stopme-" in j]
    assert task_processes("stopme") == []
    assert not (h.runtime.config.scratch_root / "stopme").exists()


async def test_missing_image_fails_in_image_pull(h: Harness) -> None:
    await h.launch("noimg", make_spec("true", image="nope:latest"))
    failed = [e.event for e in await h.events("noimg") if isinstance(e.event, DeployStageFailed)]
    assert len(failed) == 1 and failed[0].stage == "image_pull"
    assert "nope:latest" in failed[0].reason and "catalogue" in failed[0].reason
    assert not [j for j in h.jobs() if "runyard-noimg-" in j]


@pytest.mark.parametrize("nodes", [1, 2])
async def test_an_image_without_bin_on_the_nodes_fails_image_pull_naming_them(
    h: Harness, tmp_path: Path, nodes: int
) -> None:
    import dataclasses

    from runyard.deployer.runtime import Deployment, StageFailed

    bare = tmp_path / "bare-image"
    bare.mkdir()
    config = dataclasses.replace(h.runtime.config, images={"bare": bare})
    runtime = SlurmRuntime(config)
    workers = tuple(WorkerPlacement(index=i, node=f"n{i + 1}", gpus=(0,)) for i in range(nodes))
    deployment = Deployment("bare", 1, 1, make_spec("true", image="bare"), workers)
    try:
        await runtime.allocate(deployment)
        with pytest.raises(StageFailed) as failed:
            await runtime.pull_image(deployment)
        assert f"maps to {bare}, which has no bin/ directory on node(s)" in failed.value.reason
        assert all(f"n{i + 1}" in failed.value.reason for i in range(nodes))
    finally:
        await runtime.cleanup(deployment.key)
    assert not [j for j in h.jobs() if "runyard-bare-" in j]


async def test_stages_ask_slurm_to_submit_the_job_and_nothing_that_runs_on_a_node(
    h: Harness,
) -> None:
    """Until the gate opens, a deployment costs one sbatch: the batch script reports that
    it runs and checks the image itself (no srun from here), and the nodes' addresses
    are asked once for every deployment. Slurm is asked about a job (`scontrol show
    job`, `squeue`) only when a report is late, which a loaded machine may make it."""
    from runyard.deployer.runtime import Deployment

    runtime = h.runtime
    spec = make_spec("true", workers=2, framework="pytorch_ddp")
    workers = tuple(WorkerPlacement(index=i, node=f"n{i + 1}", gpus=(0,)) for i in range(2))
    deployments = [Deployment(f"few{i}", 1, 1, spec, workers) for i in range(2)]
    try:
        for deployment in deployments:
            for step in (
                runtime.allocate,
                runtime.pull_image,
                runtime.mount_storage,
                runtime.init_env,
            ):
                await step(deployment)
        calls = dict(runtime.slurm_calls)
        assert calls.pop("sbatch") == 2
        assert calls.pop("scontrol show node") == 1
        assert set(calls) <= {"scontrol show job", "squeue"}, calls
    finally:
        for deployment in deployments:
            await runtime.cleanup(deployment.key)
    assert not [j for j in h.jobs() if "runyard-few" in j]


async def test_a_node_slurm_does_not_know_fails_resource_allocation_with_slurms_words(
    h: Harness,
) -> None:
    submitted = decide(
        None,
        Submit("ghost", "acme", "alice", make_spec("true")),
        now=datetime.now(UTC),
        ids=lambda: "x",
    )
    await h.append("ghost", submitted)
    placed = TaskPlaced(
        run=1, attempt=1, pool="slurm", workers=(WorkerPlacement(index=0, node="n9", gpus=(0,)),)
    )
    await h.deliver(await h.append("ghost", [placed]))
    await asyncio.wait_for(h.app.drain(), WITHIN_S)
    failed = [e.event for e in await h.events("ghost") if isinstance(e.event, DeployStageFailed)]
    assert len(failed) == 1 and failed[0].stage == "resource_allocation"
    assert "Slurm refused the job" in failed[0].reason
    # the node by name, and how to fix it (sbatch names none)
    assert "node n9 of pool slurm is not a node of this Slurm cluster" in failed[0].reason
    assert "add the node to slurm.conf" in failed[0].reason


def second_deployer(h: Harness) -> tuple[DeployerApp, SlurmRuntime]:
    """A new deployer process, as far as the test can tell: its own app and runtime."""
    runtime = SlurmRuntime(h.runtime.config)

    async def sink(line: OutputLine) -> None:
        h.lines.append(line)

    return DeployerApp(h.store, runtime, on_output=sink, stop_grace_s=2.0), runtime


async def test_a_restarted_deployer_adopts_the_running_job_and_records_the_exit(
    h: Harness,
) -> None:
    command = f"echo before; {WAIT_FOR_RELEASE}; echo after; exit 4"
    spec = make_spec(command, env=(RELEASE,))
    await h.launch("crash", spec, wait=False)
    await h.wait_for("crash", "TaskRunning")
    job = h.runtime.job_id(("crash", 1, 1))
    while "0:before" not in h.output("crash"):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.5)  # the published offsets are saved at least once a second
    h.app.detach()  # the deployer dies; its job does not
    assert [j for j in h.jobs() if j.startswith(f"{job} ")]

    app2, runtime2 = second_deployer(h)
    try:
        assert await app2.reconcile() == ["crash"]
        assert runtime2.job_id(("crash", 1, 1)) == job  # adopted, not submitted again
        release_file(runtime2, "crash", 0).touch()
        await asyncio.wait_for(app2.drain(), WITHIN_S)
    finally:
        await asyncio.wait_for(app2.close(), 60)
    events = [e.event for e in await h.events("crash")]
    failed = [e for e in events if isinstance(e, TaskFailed)]
    assert len(failed) == 1 and failed[0].exit_code == 4
    assert sum(isinstance(e, WorkerStarted) for e in events) == 1
    assert h.output("crash") == ["0:before", "0:after"]  # each line once
    assert not [j for j in h.jobs() if "runyard-crash-" in j]


async def test_allocate_after_a_restart_takes_the_job_already_submitted(h: Harness) -> None:
    from runyard.deployer.runtime import Deployment

    spec = make_spec("true")
    workers = (WorkerPlacement(index=0, node="n2", gpus=(0,)),)
    deployment = Deployment("twice", 1, 1, spec, workers)
    await h.runtime.allocate(deployment)
    job = h.runtime.job_id(deployment.key)
    h.runtime.detach()
    runtime2 = SlurmRuntime(h.runtime.config)
    await runtime2.allocate(deployment)
    assert runtime2.job_id(deployment.key) == job
    # A deployer that died between sbatch's answer and saving the id: found by name.
    runtime2.detach()
    (h.runtime.config.scratch_root / "twice" / "run1-a1" / "state.json.slurm").unlink()
    runtime3 = SlurmRuntime(h.runtime.config)
    try:
        await runtime3.allocate(deployment)
        assert runtime3.job_id(deployment.key) == job
        assert len([j for j in h.jobs() if "runyard-twice-" in j]) == 1
    finally:
        await runtime3.cleanup(deployment.key)
    assert not [j for j in h.jobs() if "runyard-twice-" in j]


async def test_allocate_replaces_a_job_whose_batch_script_reports_nothing(h: Harness) -> None:
    """A job an older deployer submitted (its batch script writes no reports) is not
    waited on for reports that never come: its workers never started, so it is
    cancelled and a new job runs the deployment."""
    from runyard.deployer.runtime import Deployment

    workers = (WorkerPlacement(index=0, node="n2", gpus=(0,)),)
    deployment = Deployment("older", 1, 1, make_spec("true"), workers)
    await h.runtime.allocate(deployment)
    job = h.runtime.job_id(deployment.key)
    h.runtime.detach()
    script = h.runtime.config.scratch_root / "older" / "run1-a1" / "job.sh"
    script.write_text(
        "".join(line + "\n" for line in script.read_text().splitlines() if "report" not in line)
    )
    runtime2 = SlurmRuntime(h.runtime.config)
    try:
        await runtime2.allocate(deployment)
        await runtime2.pull_image(deployment)
        replaced = runtime2.job_id(deployment.key)
        assert replaced is not None and replaced != job
        older = [j.split()[0] for j in h.jobs() if "runyard-older-" in j]
        assert older == [replaced], "the older job is gone, the new one runs"
    finally:
        await runtime2.cleanup(deployment.key)
    assert not [j for j in h.jobs() if "runyard-older-" in j]


STUCK = """
import time

def wait_for_all_reduce():
    print("waiting", flush=True)
    time.sleep(300)

wait_for_all_reduce()
"""


async def test_capture_stacks_dumps_every_worker_on_its_node(h: Harness) -> None:
    await h.launch("hang", make_spec(f"python - <<'EOF'\n{STUCK}\nEOF", workers=2), wait=False)
    while sorted(h.output("hang")) != ["0:waiting", "1:waiting"]:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    stacks = await h.runtime.capture_stacks(("hang", 1, 1), native=False)
    assert [s.worker for s in stacks] == [0, 1]
    for worker in stacks:
        assert worker.processes, worker
        frames = [f.name for p in worker.processes for t in p.threads for f in t.frames]
        assert "wait_for_all_reduce" in frames, worker
    assert await h.runtime.capture_stacks(("other", 1, 1)) == ()
    await h.runtime.stop(("hang", 1, 1), grace_s=1)
    await asyncio.wait_for(h.app.drain(), WITHIN_S)
    assert task_processes("hang") == []


async def test_the_env_check_runs_in_every_worker_before_the_gate_opens(h: Harness) -> None:
    from runyard.deployer.runtime import Deployment, free_port

    spec = make_spec("echo launched", workers=2, framework="pytorch_ddp")
    workers = tuple(WorkerPlacement(index=i, node=f"n{i + 1}", gpus=(0,)) for i in range(2))
    deployment = Deployment("check", 1, 1, spec, workers)
    runtime = h.runtime
    for step in (runtime.allocate, runtime.pull_image, runtime.mount_storage, runtime.init_env):
        await step(deployment)
    lines: list[OutputLine] = []

    async def collect(line: OutputLine) -> None:
        lines.append(line)

    try:
        await runtime.start_env_check(deployment, collect, port=free_port(0))
        codes = await asyncio.wait_for(runtime.wait_env_check(deployment.key), WITHIN_S)
        assert codes == {0: 0, 1: 0}, [x.line for x in lines]
        await runtime.end_env_check(deployment.key)
        for worker in (0, 1):
            said = [x.line for x in lines if x.worker == worker and x.stream == "stdout"]
            assert any(s.startswith("Bootcheck Finished") for s in said), said
        assert not (
            runtime.config.scratch_root / "check" / "run1-a1" / "w0" / "stdout.log"
        ).exists()
        exits: list[int] = []

        async def on_exit(key: Any, worker: int, code: int, at: datetime) -> None:
            exits.append(code)

        await runtime.start_workers(deployment, collect, on_exit)
        assert await asyncio.wait_for(runtime.wait(deployment.key), WITHIN_S) == {0: 0, 1: 0}
        assert sorted(x.line for x in lines if x.line == "launched") == ["launched"] * 2
    finally:
        await runtime.cleanup(deployment.key)
    assert not [j for j in h.jobs() if "runyard-check-" in j]


async def test_each_pool_runs_on_its_own_runtime(
    dsn: str, tmp_path: Path, slurm_cluster: SlurmCluster
) -> None:
    """runtime.yaml's `pools:` sends pool `slurm` to Slurm; pool `dev` stays local."""
    from runyard.deployer.pools import PoolRuntimes, build_runtimes

    raw = {
        "local": {"images": {"python": sys.prefix}, "grace_s": 2, "namespaces": False},
        "pools": {
            "slurm": {
                "runtime": "slurm",
                "partition": slurm_cluster.partition,
                "slurm_conf": str(slurm_cluster.conf),
                "grace_s": 2,
            }
        },
    }
    runtime = build_runtimes(raw, data_dir=tmp_path, base_dir=tmp_path, keep_output=False)
    assert isinstance(runtime, PoolRuntimes) and isinstance(runtime, Runtime)
    assert isinstance(runtime.by_pool["slurm"], SlurmRuntime)
    assert isinstance(runtime.by_pool["slurm"], Runtime)
    store = await PostgresEventStore.connect(dsn, default_mapper())
    lines: list[OutputLine] = []

    async def sink(line: OutputLine) -> None:
        lines.append(line)

    app = DeployerApp(store, runtime, on_output=sink, stop_grace_s=2.0)
    try:
        slurm = runtime.by_pool["slurm"]
        assert isinstance(slurm, SlurmRuntime)
        h = Harness(store, app, slurm, slurm_cluster)
        h.lines = lines
        command = 'echo "${SLURM_JOB_ID:-none}"'
        await h.launch("on-slurm", make_spec(command))
        local_spec = make_spec(command).model_copy(update={"pool": "dev"})
        await h.launch("on-local", local_spec)
        assert (await h.state("on-slurm")).status == "succeeded"
        assert (await h.state("on-local")).status == "succeeded"
        (slurm_line,) = h.output("on-slurm")
        assert slurm_line.removeprefix("0:").isdigit()  # a step of a Slurm job
        assert h.output("on-local") == ["0:none"]  # a process of this machine
        assert runtime.deployments() == []
        assert (tmp_path / "slurm" / "slurm").is_dir()  # the pool's own scratch root
    finally:
        await asyncio.wait_for(app.close(), 60)
        await store.close()


async def test_a_job_slurm_keeps_pending_fails_resource_allocation_with_slurms_reason(
    h: Harness,
) -> None:
    import dataclasses

    from runyard.deployer.runtime import Deployment, StageFailed

    config = dataclasses.replace(h.runtime.config, allocate_timeout_s=3.0)
    runtime = SlurmRuntime(config)
    workers = (WorkerPlacement(index=0, node="n2", gpus=(0,)),)
    deployment = Deployment("drained", 1, 1, make_spec("true"), workers)
    h.cluster.run("scontrol", "update", "nodename=n2", "state=drain", "reason=runyard test")
    try:
        with pytest.raises(StageFailed) as failed:
            await runtime.allocate(deployment)
        assert "still PENDING after 3 s" in failed.value.reason
        assert "ReqNodeNotAvail" in failed.value.reason or "Resources" in failed.value.reason
        await runtime.cleanup(deployment.key)
        assert not [j for j in h.jobs() if "runyard-drained-" in j]
    finally:
        h.cluster.run("scontrol", "update", "nodename=n2", "state=resume")
        h.cluster.wait_idle()


async def test_volumes_are_bound_at_their_mount_paths_and_read_only_ones_refuse_writes(
    h: Harness, tmp_path: Path
) -> None:
    if not h.runtime.worker_namespaces:
        pytest.skip("volumes are bound only when the deployer runs as root with util-linux")
    mark = tmp_path.name
    ckpt, data = f"/mnt/runyard-test-{mark}/ckpt", f"/mnt/runyard-test-{mark}/data"
    seed = h.runtime.config.volumes_root / "fs" / "data"
    seed.mkdir(parents=True)
    (seed / "in.txt").write_text("seed\n")
    command = (
        f"cat {data}/in.txt && echo kept > {ckpt}/out.txt && "
        f"if echo no > {data}/no.txt; then echo WROTE; else echo refused; fi"
    )
    spec = make_spec(
        command,
        mounts=(
            {"file_system": "fs", "volume": "ckpt", "mount_path": ckpt},
            {"file_system": "fs", "volume": "data", "mount_path": data, "read_only": True},
        ),
    )
    try:
        await h.launch("vol", spec)
        assert (await h.state("vol")).status == "succeeded", h.output("vol")
        assert "0:seed" in h.output("vol") and "0:refused" in h.output("vol")
        host = h.runtime.config.volumes_root / "fs"
        assert (host / "ckpt" / "out.txt").read_text() == "kept\n"
        assert not (host / "data" / "no.txt").exists()
        assert not os.path.ismount(ckpt)  # bound only in the worker's own namespace
    finally:
        shutil.rmtree(f"/mnt/runyard-test-{mark}", ignore_errors=True)


async def test_a_stop_while_slurm_keeps_the_job_pending_cancels_it_and_fails_the_stage(
    h: Harness,
) -> None:
    from runyard.deployer.runtime import Deployment, StageFailed

    workers = (WorkerPlacement(index=0, node="n2", gpus=(0,)),)
    deployment = Deployment("waiting", 1, 1, make_spec("true"), workers)
    h.cluster.run("scontrol", "update", "nodename=n2", "state=drain", "reason=runyard test")
    try:
        allocating = asyncio.create_task(h.runtime.allocate(deployment))
        deadline = asyncio.get_running_loop().time() + WITHIN_S
        while not [j for j in h.jobs() if "runyard-waiting-" in j and "PENDING" in j]:
            assert asyncio.get_running_loop().time() < deadline, h.jobs()
            await asyncio.sleep(0.1)
        await h.runtime.stop(deployment.key, grace_s=1)
        with pytest.raises(StageFailed) as failed:
            await asyncio.wait_for(allocating, WITHIN_S)
        assert "ended CANCELLED before it ran" in failed.value.reason
        await h.runtime.cleanup(deployment.key)
        assert not [j for j in h.jobs() if "runyard-waiting-" in j]
    finally:
        h.cluster.run("scontrol", "update", "nodename=n2", "state=resume")
        h.cluster.wait_idle()


async def test_a_restarted_deployer_with_a_runtime_per_pool_adopts_the_slurm_job(
    dsn: str, tmp_path: Path, slurm_cluster: SlurmCluster
) -> None:
    from runyard.deployer.pools import PoolRuntimes, build_runtimes

    raw = {
        "local": {"images": {"python": sys.prefix}, "namespaces": False},
        "pools": {"slurm": {"runtime": "slurm", "slurm_conf": str(slurm_cluster.conf)}},
    }
    command = f"echo up; {WAIT_FOR_RELEASE}; exit 5"
    spec = make_spec(command, env=(RELEASE,))
    store = await PostgresEventStore.connect(dsn, default_mapper())
    lines: list[OutputLine] = []

    async def sink(line: OutputLine) -> None:
        lines.append(line)

    def deployer() -> tuple[DeployerApp, PoolRuntimes]:
        runtime = build_runtimes(raw, data_dir=tmp_path, base_dir=tmp_path, keep_output=False)
        assert isinstance(runtime, PoolRuntimes)
        return DeployerApp(store, runtime, on_output=sink, stop_grace_s=2.0), runtime

    app1, runtime1 = deployer()
    slurm1 = runtime1.by_pool["slurm"]
    assert isinstance(slurm1, SlurmRuntime)
    h = Harness(store, app1, slurm1, slurm_cluster)
    h.lines = lines
    app2 = None
    try:
        await h.launch("pooled", spec, wait=False)
        await h.wait_for("pooled", "TaskRunning")
        job = slurm1.job_id(("pooled", 1, 1))
        while "0:up" not in h.output("pooled"):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # its offset saved
        app1.detach()
        app2, runtime2 = deployer()
        assert await app2.reconcile() == ["pooled"]
        slurm2 = runtime2.by_pool["slurm"]
        assert isinstance(slurm2, SlurmRuntime)
        assert slurm2.job_id(("pooled", 1, 1)) == job
        release_file(slurm2, "pooled", 0).touch()
        await asyncio.wait_for(app2.drain(), WITHIN_S)
        failed = [e.event for e in await h.events("pooled") if isinstance(e.event, TaskFailed)]
        assert len(failed) == 1 and failed[0].exit_code == 5
        assert h.output("pooled") == ["0:up"]
    finally:
        if app2 is not None:
            await asyncio.wait_for(app2.close(), 60)
        await store.close()
    assert not [j for j in h.jobs() if "runyard-pooled-" in j]


async def test_workers_get_no_variable_of_the_deployer(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEPLOYER_ONLY_SECRET", "s3cret")
    await h.launch("clean", make_spec('echo "${DEPLOYER_ONLY_SECRET:-unset} $RUNYARD_TASK_ID"'))
    assert h.output("clean") == ["0:unset clean"]


async def test_a_worker_whose_wrapper_is_killed_is_recorded_with_an_unknown_exit(
    h: Harness,
) -> None:
    """No status file and the job over: Slurm's word is not taken for the command's, and
    nothing of the worker is left (its PID namespace went with the wrapper)."""
    from runyard.deployer.runtime import UNKNOWN_EXIT_CODE

    if not h.runtime.worker_namespaces:
        pytest.skip("workers have a PID namespace only when the deployer runs as root")
    command = "echo before; sleep 300 & setsid sleep 300 & wait"
    await h.launch("lost", make_spec(command), wait=False)
    await h.wait_for("lost", "TaskRunning")
    while "0:before" not in h.output("lost"):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    (outer,) = h.runtime.pids(("lost", 1, 1)).values()  # unshare, outside the namespace
    wrapper = int(Path(f"/proc/{outer}/task/{outer}/children").read_text().split()[0])
    os.kill(wrapper, 9)  # the wrapper dies without writing a status
    await asyncio.wait_for(h.app.drain(), WITHIN_S)
    exited = [e.event for e in await h.events("lost") if isinstance(e.event, WorkerExited)]
    assert [e.exit_code for e in exited] == [UNKNOWN_EXIT_CODE]
    assert (await h.state("lost")).status == "failed"
    assert task_processes("lost") == []
    assert not [j for j in h.jobs() if "runyard-lost-" in j]


async def test_a_worker_runs_unprivileged_and_sees_only_its_own_scratch(h: Harness) -> None:
    """With worker namespaces (root), the launch command runs as the worker user with no
    capabilities, of the control plane's folders sees only its own scratch, and cannot
    talk to Slurm (munge's socket is hidden: no credential, so no sbatch or squeue of
    its own past Runyard's queue)."""
    if h.runtime.worker_ids is None:
        pytest.skip("workers run as the worker user only when the deployer runs as root")
    root = h.runtime.config.scratch_root
    root.mkdir(parents=True, exist_ok=True)
    (root / "other-task").mkdir(exist_ok=True)
    munge = shutil.which("munge") or "/usr/bin/munge"
    command = (
        'echo "uid=$(id -u) $(grep CapEff /proc/self/status | tr -d "\\t")"; '
        f"test -e {root}/other-task && echo SEEN || echo hidden; "
        'touch "$HOME/mine" "$TMPDIR/mine" mine && echo writes; '
        f"{munge} -n >/dev/null 2>&1 && echo munge-reached || echo munge-refused"
    )
    # munge, as every Slurm client, asks the socket for a credential: it works here.
    minted = await asyncio.create_subprocess_exec(munge, "-n", stdout=asyncio.subprocess.DEVNULL)
    assert await minted.wait() == 0
    await h.launch("user", make_spec(command))
    assert (await h.state("user")).status == "succeeded", h.output("user")
    uid = h.runtime.worker_ids[0]
    assert h.output("user") == [
        f"0:uid={uid} CapEff:0000000000000000",
        "0:hidden",
        "0:writes",
        "0:munge-refused",
    ]


async def test_a_job_sbatch_submitted_but_reported_as_failed_is_cancelled(
    h: Harness, tmp_path: Path
) -> None:
    """sbatch may fail after slurmctld took the job (its answer lost: `Socket timed out
    on send/recv operation`). The stage fails, and the job Slurm holds anyway must not
    keep the nodes' GPUs, waiting for a gate no deployer will open."""
    from runyard.deployer.runtime import Deployment, StageFailed

    lost = tmp_path / "sbatch-answer-lost"
    lost.write_text(
        "#!/bin/bash\n"
        f'{shlex.quote(h.runtime.bin["sbatch"])} "$@" > /dev/null || exit\n'
        # The job runs before the error comes back (what a slow answer allows).
        'for a in "$@"; do case $a in --chdir=*) cd "${a#--chdir=}";; esac; done\n'
        "for _ in $(seq 600); do [ -e started ] && break; sleep 0.1; done\n"
        'echo "sbatch: error: Batch job submission failed: Socket timed out on send/recv '
        'operation" >&2\n'
        "exit 1\n"
    )
    lost.chmod(0o755)
    h.runtime.bin["sbatch"] = str(lost)
    workers = (WorkerPlacement(index=0, node="n2", gpus=(0,)),)
    deployment = Deployment("lost", 1, 1, make_spec("true"), workers)
    with pytest.raises(StageFailed) as failed:
        await h.runtime.allocate(deployment)
    assert "Socket timed out" in failed.value.reason
    await h.runtime.cleanup(deployment.key)
    deadline = asyncio.get_running_loop().time() + WITHIN_S
    while [j for j in h.jobs() if "runyard-lost-" in j]:
        assert asyncio.get_running_loop().time() < deadline, h.jobs()
        await asyncio.sleep(0.2)


async def test_a_job_whose_deployment_folder_is_gone_ends_instead_of_waiting_for_its_gate(
    h: Harness,
) -> None:
    """A job no deployer will open the gate of (its deployment cleaned up without it, e.g.
    taken by slurmctld only after sbatch's error) ends by itself, freeing its nodes."""
    from runyard.deployer.runtime import Deployment

    workers = (WorkerPlacement(index=0, node="n2", gpus=(0,)),)
    deployment = Deployment("gone", 1, 1, make_spec("true"), workers)
    await h.runtime.allocate(deployment)
    assert [j for j in h.jobs() if "runyard-gone-" in j]
    h.runtime.detach()
    folder = h.runtime.config.scratch_root / "gone" / "run1-a1"
    (folder / "job.sh").unlink()  # first: Slurm may still write job.log while it goes
    shutil.rmtree(folder, ignore_errors=True)
    deadline = asyncio.get_running_loop().time() + WITHIN_S
    while [j for j in h.jobs() if "runyard-gone-" in j and "COMPLET" not in j]:
        assert asyncio.get_running_loop().time() < deadline, h.jobs()
        await asyncio.sleep(0.2)
    await until_no_job_process("gone")  # the holder of its network too


async def test_a_mount_path_through_a_folder_a_worker_can_change_is_refused_on_the_node(
    h: Harness, tmp_path: Path
) -> None:
    """A worker links a path in a world-writable folder of a node to another folder (here a
    stand-in for /usr/bin, whose programs the root wrapper runs next); a task mounts a
    volume there: the worker's mount setup refuses the path where the bind would be made
    (exit 112, the reason on its stderr) and nothing is bound over the link's target."""
    if not h.runtime.worker_namespaces or h.runtime.worker_ids is None:
        pytest.skip("volumes are bound only when the deployer runs as root with util-linux")
    uid, gid, _ = h.runtime.worker_ids
    base = Path(f"/mnt/runyard-test-{tmp_path.name}")
    victim, changeable = base / "victim", base / "open"
    victim.mkdir(parents=True)
    (victim / "original").write_text("host file\n")
    changeable.mkdir()
    changeable.chmod(0o1777)
    link = changeable / "link"
    link.symlink_to(victim)
    os.lchown(link, uid, gid)
    spec = make_spec(
        f"ls {victim}",
        mounts=({"file_system": "fs", "volume": "out", "mount_path": str(link)},),
    )
    try:
        await h.launch("linked", spec)
        state = await h.state("linked")
        assert state.status == "failed", h.output("linked")
        exited = [e.event for e in await h.events("linked") if isinstance(e.event, WorkerExited)]
        assert [e.exit_code for e in exited] == [112]
        said = " ".join(h.output("linked"))
        assert f"mount path {link} cannot be used" in said and str(changeable) in said, said
        assert "original" not in said
    finally:
        shutil.rmtree(base, ignore_errors=True)


#: Puts a key in the user keyring by the raw system call (x86-64 and arm64 numbers);
#: prints the answer and errno.
KEYRING = """
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
add_key = 248 if platform.machine() == "x86_64" else 217
user = ctypes.c_int(-4)  # KEY_SPEC_USER_KEYRING
got = libc.syscall(add_key, b"user", b"runyard-test-key", b"secret", 6, user)
print("keyring", "ok" if got >= 0 else "refused", ctypes.get_errno())
"""


async def test_a_slurm_worker_is_sandboxed_as_a_local_one(h: Harness) -> None:
    """On a node whose slurmd runs as root, a worker gets what a sandboxed local worker
    gets: no kernel keyring (one uid for every task's workers) and no user namespace,
    output files of its own
    (`echo x > /dev/stderr` works), the device nodes of only the GPUs Slurm gave its step
    (the others covered; test nodes where real ones are, /dev, named by `gpu_devices`),
    and a /dev/shm of `worker_shm_bytes`."""
    if h.runtime.worker_ids is None:
        pytest.skip("workers are sandboxed only when the deployer and slurmd run as root")
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("the worker's filter knows x86-64 and arm64")
    pattern = f"/dev/runyard-test-{uuid.uuid4().hex[:8]}-gpu{{gpu}}"
    shm = 4 * 2**20
    h.runtime.config = dataclasses.replace(
        h.runtime.config, gpu_devices=pattern, worker_shm_bytes=shm
    )
    nodes = [Path(pattern.format(gpu=n)) for n in range(8)]  # the test cluster's 8
    probe = "".join(
        f'if [ -c {node} ] && head -c 1 {node} >/dev/null 2>&1; then echo "gpu{n}=yes";'
        f' else echo "gpu{n}=no"; fi\n'
        for n, node in enumerate(nodes)
    )
    command = (
        f"{shlex.quote(sys.executable)} -c {shlex.quote(KEYRING)}\n"
        f"{userns_probe()}\n"
        "echo err > /dev/stderr || echo stderr=refused\n"
        f"{probe}"
        "echo \"shm=$(df -B1 --output=size /dev/shm | tail -1 | tr -d ' ')\"\n"
        'echo "slurm=${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-none}}"\n'
    )
    try:
        for node in nodes:
            os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 5))  # like /dev/zero
            node.chmod(0o666)
        await h.launch("sandbox", make_spec(command))
        assert (await h.state("sandbox")).status == "succeeded", h.output("sandbox")
    finally:
        for node in nodes:
            node.unlink(missing_ok=True)
    out = h.output("sandbox")
    given = next(x for x in out if x.startswith("0:slurm=")).removeprefix("0:slurm=")
    assert given != "none", out  # the test cluster gives each job its GPUs
    gpus = [f"0:gpu{n}={'yes' if str(n) in given.split(',') else 'no'}" for n in range(8)]
    assert sorted(out) == sorted(
        [
            "0:keyring refused 1",
            *(f"0:{line}" for line in NO_USERNS),
            "0:err",
            *gpus,
            f"0:shm={shm}",
            f"0:slurm={given}",
        ]
    )


def loops_of(folder: Path) -> list[str]:
    """The loop devices whose file lies in `folder` (losetup: `/dev/loopN: []: (<file>)`)."""
    losetup = shutil.which("losetup") or "/usr/sbin/losetup"
    out = subprocess.run([losetup, "-a"], capture_output=True, text=True, check=False).stdout
    return [line for line in out.splitlines() if f"({folder}/" in line]


async def test_a_slurm_worker_cannot_write_past_its_system_disk(h: Harness) -> None:
    """R-13 on a Slurm node: a sandboxed worker's home, /tmp and working folder lie on a
    system disk of its own (`worker_disk_bytes`), made on its node in its namespace:
    writing past it fails in the worker, the scratch's file system gets none of what it
    wrote, and the disk (its loop device) goes with the worker."""
    if h.runtime.disk_bytes is None:
        pytest.skip("system disks need a root deployer and slurmd, loop devices and mkfs.ext4")
    disk = 16 * 2**20
    h.runtime.disk_bytes = disk
    h.runtime.config = dataclasses.replace(h.runtime.config, worker_disk_bytes=disk)
    command = (
        'try() { if head -c "$2" /dev/zero > "$1" 2>/dev/null; then echo "$3=yes";'
        ' else echo "$3=no"; fi; }\n'
        'try "$HOME/small" 1M small_disk\n'
        'try "$HOME/big" 64M big_disk\n'
        'for where in "$HOME" /tmp /var/tmp "$PWD"; do\n'
        '  echo "size=$(df -B1 --output=size "$where" | tail -1 | tr -d " ")"\n'
        "done\n"
        f"echo ready\n{WAIT_FOR_RELEASE}\n"
    )
    await h.launch("disk", make_spec(command, env=(RELEASE,)), wait=False)
    await h.until_output("disk", "0:ready")
    root = h.runtime.config.scratch_root / "disk" / "run1-a1"
    assert loops_of(root), "the worker's disk is a loop device of a file of its deployment"
    assert not os.path.ismount(root / "w0" / "disk"), "mounted in the worker's namespace only"
    out = h.output("disk")
    sizes = {line for line in out if line.startswith("0:size=")}
    assert len(sizes) == 1, out  # home, /tmp, /var/tmp and the working folder: one disk
    assert 0 < int(sizes.pop().removeprefix("0:size=")) <= disk
    assert out[:2] == ["0:small_disk=yes", "0:big_disk=no"], out
    home = root / "w0" / "disk" / "home"  # what the deployer left there: not the disk
    assert not (home / "small").exists() and not (home / "big").exists()
    assert list(root.glob("w0.disk*")) == [], "the disk's file is unlinked once mounted"
    release_file(h.runtime, "disk", 0).touch()
    await asyncio.wait_for(h.app.drain(), WITHIN_S)
    assert (await h.state("disk")).status == "succeeded", h.output("disk")
    deadline = asyncio.get_running_loop().time() + 10
    while loops_of(root):
        assert asyncio.get_running_loop().time() < deadline, loops_of(root)
        await asyncio.sleep(0.1)


async def test_a_worker_gets_the_cpus_and_memory_of_its_spec_from_slurm(h: Harness) -> None:
    """R-02 on Slurm: the job asks for the CPUs and memory of the workers' specs as the
    placement records them (per node, what its workers add up to), and each worker's
    step for its own (a step gets one CPU by default, whatever the job holds)."""
    command = (
        'echo "cpus=${SLURM_CPUS_PER_TASK:-none} mem=${SLURM_MEM_PER_NODE:-none}"\n'
        f"{WAIT_FOR_RELEASE}"
    )
    await h.launch(
        "sized", make_spec(command, workers=3, env=(RELEASE,)), wait=False, cpus=5, memory_gib=3
    )
    for n in range(3):
        await h.until_output("sized", f"{n}:cpus=5 mem=6144")
    # Each step has its spec's CPUs; the job's memory is per node: 6 GiB, what n1's two
    # workers add up to (each step's own 3 GiB is its srun's `--mem`).
    root = h.runtime.config.scratch_root / "sized" / "run1-a1"
    job = h.cluster.run("scontrol", "show", "job", "-o", h.runtime._jobs[("sized", 1, 1)])
    assert " NumCPUs=20 " in job and " MinMemoryNode=6G " in job, job  # 10 CPUs a node
    script = (root / "job.sh").read_text()
    assert script.count("--cpus-per-task=5 --mem=3G") == 3, script
    for n in range(3):
        release_file(h.runtime, "sized", n).touch()
    await asyncio.wait_for(h.app.drain(), WITHIN_S)
    assert (await h.state("sized")).status == "succeeded", h.output("sized")
