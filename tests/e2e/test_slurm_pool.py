"""A pool run by Slurm, through the gateway: tasks run as Slurm jobs, Slurm's word
on a node reaches the pool, fault tolerance works on its workers, and a deployer
killed with SIGKILL takes its running jobs back when it is started again.

The platform's config gets a pool `slurm-e2e` whose nodes are the test cluster's
(n1, n2; `runyard.stack.slurm`) and, in runtime.yaml, `runtime: slurm` for it.
The tests share the module's platforms (one per layout, `SHARED_PLATFORM`), each
with tasks of its own; the deployer's kill has a platform of its own. Skipped,
with the reason, where Slurm cannot run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from runyard.deployer.stacks import py_spy_binary
from runyard.messaging import KafkaSettings
from runyard.stack.slurm import SlurmCluster
from runyard.stack.up import wait_ready

from tests.e2e.conftest import (
    Platform,
    SharedPlatform,
    platform_for_test,
    restarts_capped,
    running_platform,
    shared_for_module,
)
from tests.e2e.test_fault_tolerance import (
    CKPT,
    HANG_TIMEOUT_S,
    HANGING,
    RESUME_WAIT_S,
    crash_once,
    ft_log,
    of,
    wait_events,
)
from tests.e2e.test_tasks import ALLREDUCE

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.slurm]

SHARED_PLATFORM = True

POOL = "slurm-e2e"


def slurm_pool(cluster: SlurmCluster) -> Any:
    def configure(config: Path) -> None:
        cluster.add_pool(config, POOL)
        restarts_capped(0.5)(config)

    return configure


@pytest.fixture(scope="module")
async def slurm_shared(
    postgres_url: str,
    kafka_bootstrap: str,
    tmp_path_factory: pytest.TempPathFactory,
    _slurm_session: SlurmCluster,
) -> AsyncIterator[SharedPlatform]:
    """The platforms of the module's tests but the deployer's kill (one per layout), with
    the Slurm pool and the fault-tolerance service's short resume wait."""
    async with shared_for_module(
        postgres_url,
        kafka_bootstrap,
        tmp_path_factory,
        "slurm",
        configure=slurm_pool(_slurm_session),
        faulttolerance_resume_wait_s=RESUME_WAIT_S,
    ) as shared:
        yield shared


@pytest.fixture
async def on_slurm(
    slurm_shared: SharedPlatform, slurm_cluster: SlurmCluster, request: pytest.FixtureRequest
) -> AsyncIterator[Platform]:
    """The module's platform in this test's layout, on the cluster with every node idle."""
    async with platform_for_test(slurm_shared, request) as running:
        yield running


async def schedulable(platform: Platform) -> int:
    """GPUs of the pool's healthy, uncordoned nodes, as the gateway shows them."""
    answer = await platform.http.get(f"/v1/pools/{POOL}/capacity")
    assert answer.status_code == 200, answer.text
    return int(answer.json()["schedulable_gpus"])


async def until_schedulable(platform: Platform, wanted: int, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while (found := await schedulable(platform)) != wanted:
        assert time.monotonic() < deadline, f"schedulable GPUs {found}, wanted {wanted}"
        platform.check_alive()
        await asyncio.sleep(0.5)


async def test_a_task_of_a_slurm_pool_runs_as_a_slurm_job(
    on_slurm: Platform, slurm_cluster: SlurmCluster
) -> None:
    pytest.importorskip("torch")
    # A gloo all-reduce of two ranks on the two nodes, with only the injected env.
    created = await on_slurm.submit(
        pool=POOL,
        image="pytorch:2.3-cuda12",
        worker_count=2,
        framework="pytorch_ddp",
        command='test -n "$SLURM_JOB_ID" && echo "rank $RANK on $SLURMD_NODENAME"\n'
        f"set -o pipefail\npython - <<'EOF'\n{ALLREDUCE}\nEOF",
    )
    task_id = created["task_id"]
    task = await on_slurm.wait_status(task_id, "succeeded", within=120)
    assert [s["stage"] for s in task["stages"] if s["result"] == "completed"] == [
        "resource_allocation",
        "image_pull",
        "storage_mount",
        "env_init",
    ]
    wanted = {f"rank {r} of 2: all_reduce sum 3" for r in (0, 1)}
    lines: set[str] = set()
    deadline = time.monotonic() + 30
    while not wanted <= lines and time.monotonic() < deadline:
        answer = await on_slurm.http.get(f"/v1/tasks/{task_id}/logs", params={"limit": 100})
        assert answer.status_code == 200, answer.text
        lines = {line["line"] for line in answer.json()["lines"]}
        await asyncio.sleep(0.3)
    assert wanted <= lines, sorted(lines)
    # each rank in its Slurm job's step, on a node of the cluster
    ranks = {line.rsplit(" ", 1)[0] for line in lines if " on n" in line}
    assert ranks == {"rank 0 on", "rank 1 on"}
    # A task of the local pools still runs on this machine (not in a Slurm job).
    local = await on_slurm.submit(command='test -z "$SLURM_JOB_ID"')
    await on_slurm.wait_status(local["task_id"], "succeeded", within=60)


async def test_a_node_slurm_drains_leaves_the_pools_capacity_until_resumed(
    on_slurm: Platform, slurm_cluster: SlurmCluster
) -> None:
    full = len(slurm_cluster.nodes) * slurm_cluster.gpus_per_node
    await until_schedulable(on_slurm, full)
    slurm_cluster.run("scontrol", "update", "nodename=n2", "state=drain", "reason=e2e")
    try:
        await until_schedulable(on_slurm, full - slurm_cluster.gpus_per_node)
    finally:
        slurm_cluster.run("scontrol", "update", "nodename=n2", "state=resume")
    await until_schedulable(on_slurm, full)


async def test_a_node_slurm_drains_under_a_running_task_moves_it_to_the_other_node(
    on_slurm: Platform, slurm_cluster: SlurmCluster
) -> None:
    created = await on_slurm.submit(
        pool=POOL,
        command='echo "on $SLURMD_NODENAME attempt $RUNYARD_ATTEMPT"; '
        'if [ "$RUNYARD_ATTEMPT" = 1 ]; then sleep 300; fi',
    )
    task_id = created["task_id"]
    await on_slurm.wait_status(task_id, "running", within=120)
    (placed,) = [e for e in await on_slurm.events(task_id) if e["type"] == "TaskPlaced"]
    node = placed["data"]["workers"][0]["node"]
    slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=e2e")
    try:
        await on_slurm.wait_status(task_id, "succeeded", within=120)
    finally:
        slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=resume")
    events = await on_slurm.events(task_id)
    types = [e["type"] for e in events]
    assert "TaskRescheduleRequested" in types
    second = [e for e in events if e["type"] == "TaskPlaced"][-1]
    assert second["data"]["attempt"] == 2
    assert second["data"]["workers"][0]["node"] != node


@pytest.fixture
async def ft_on_slurm(on_slurm: Platform) -> Platform:
    """`on_slurm` (it has the fault-tolerance service's short resume wait)."""
    return on_slurm


async def test_a_crash_on_slurm_restarts_once_and_resumes_from_the_checkpoint(
    ft_on_slurm: Platform,
) -> None:
    mark = uuid.uuid4().hex[:12]
    created = await ft_on_slurm.submit(
        pool=POOL,
        name="resume",
        command=crash_once(mark, load=True),
        mounts=CKPT,
        output_dirs=["/mnt/ckpt"],
        fault_tolerance={"auto_restart": True, "max_restarts": 1},
    )
    task_id = created["task_id"]
    await ft_on_slurm.wait_status(task_id, "succeeded", within=90)
    events = await wait_events(
        ft_on_slurm, task_id, lambda es: bool(of(es, "ResumeObserved")), within=30
    )
    (restart,) = of(events, "TaskRestartScheduled")
    assert (restart["reason"], restart["attempt"]) == ("failure", 2), restart
    (resumed,) = of(events, "ResumeObserved")
    assert (resumed["attempt"], resumed["step"]) == (2, 50)
    assert resumed["path"] == f"/mnt/ckpt/{mark}/step_50.pt"
    assert not of(events, "ResumeNotObserved")
    assert [e["exit_code"] for e in of(events, "WorkerExited")] == [1, 0]
    body = await ft_log(ft_on_slurm, task_id)
    assert body["counts"] == {"restarts": 1, "reschedules": 0, "hangs": 0, "slowdowns": 0}


@pytest.mark.skipif(py_spy_binary() is None, reason="py-spy is not installed")
@pytest.mark.processes  # fault tolerance, deployer and gateway apart: stacks by command
async def test_a_hang_on_slurm_is_detected_its_stacks_captured_on_the_node_and_restarted(
    ft_on_slurm: Platform, slurm_cluster: SlurmCluster
) -> None:
    created = await ft_on_slurm.submit(
        pool=POOL,
        name="hang",
        image="pytorch:2.3-cuda12",
        command=HANGING,
        worker_count=2,
        framework="pytorch_ddp",
        fault_tolerance={
            "auto_restart": True,
            "max_restarts": 1,
            "hang_timeout_s": HANG_TIMEOUT_S,
        },
    )
    task_id = created["task_id"]
    await ft_on_slurm.wait_status(task_id, "running", within=90)
    events = await wait_events(
        ft_on_slurm,
        task_id,
        lambda es: bool(of(es, "TaskRestartScheduled")),
        within=HANG_TIMEOUT_S + 60,
    )
    (hang,) = of(events, "HangDetected")
    assert hang["attempt"] == 1
    (captured,) = of(events, "StacksCaptured")
    assert captured["workers"] == [0, 1]
    (restart,) = of(events, "TaskRestartScheduled")
    assert (restart["reason"], restart["attempt"]) == ("hang", 2)
    types = [e["type"] for e in events]
    assert types.index("HangDetected") < types.index("StacksCaptured")
    assert types.index("StacksCaptured") < types.index("TaskRestartScheduled")
    answer = await ft_on_slurm.http.get(f"/v1/tasks/{task_id}/stacks/{captured['report_id']}")
    assert answer.status_code == 200, answer.text
    report = answer.json()
    assert set(report["frames_by_worker"]) == {"0", "1"}
    for worker in ("0", "1"):
        assert any(f.startswith("wait_for_allreduce") for f in report["frames_by_worker"][worker])

    # the restarted attempt runs as a Slurm job of its own; a stop ends it
    await ft_on_slurm.wait_for(
        task_id, lambda t: t["attempt"] == 2 and t["status"] == "running", within=90
    )
    await ft_on_slurm.http.post(f"/v1/tasks/{task_id}/stop")
    await ft_on_slurm.wait_status(task_id, "stopped", within=60)
    assert not jobs_of(slurm_cluster, task_id)


def jobs_of(cluster: SlurmCluster, task_id: str) -> list[str]:
    """Ids of the Slurm jobs of a task that Slurm still holds (any state but over)."""
    out = cluster.run("squeue", "-h", "-t", "all", "-o", "%i %j %T")
    over = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL"}
    return [
        job
        for job, name, state in (line.split() for line in out.splitlines())
        if name.startswith(f"runyard-{task_id}-") and state not in over
    ]


@pytest.mark.processes
async def test_a_deployer_killed_while_slurm_jobs_run_adopts_them_and_records_their_exits(
    dsn: str,
    kafka: KafkaSettings,
    tmp_path: Path,
    slurm_cluster: SlurmCluster,
    slurm_shared: SharedPlatform,
) -> None:
    """kill -9 of the deployer's process while two Slurm jobs run; the supervisor starts
    it again; it takes both jobs back by their recorded ids (no second sbatch) and the
    tasks end with the exit status of their commands, which end only once the new
    deployer answers (each waits for a file in its working directory)."""
    await slurm_shared.close()  # its deployer is the only one on the cluster
    async with running_platform(
        dsn,
        kafka,
        tmp_path,
        layout="processes",
        configure=slurm_pool(slurm_cluster),
        restart=True,
    ) as platform:
        assert platform.supervisor is not None
        # The release file: in the worker's scratch folder, beside its home (its working
        # folder is on its system disk, which the host does not see).
        wait = 'while [ ! -e "$(dirname "$HOME")/release" ]; do sleep 0.1; done; '
        failing = (await platform.submit(pool=POOL, command=wait + "exit 3"))["task_id"]
        passing = (await platform.submit(pool=POOL, command=wait + "echo fine"))["task_id"]
        for task_id in (failing, passing):
            await platform.wait_status(task_id, "running", within=90)
        jobs = {task_id: jobs_of(slurm_cluster, task_id) for task_id in (failing, passing)}
        assert all(len(ids) == 1 for ids in jobs.values()), jobs

        deployer = platform.supervisor.children["deployer"]
        assert deployer.process is not None
        os.kill(deployer.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not (deployer.restarts == 1 and deployer.running):
            assert time.monotonic() < deadline, "the supervisor did not start the deployer again"
            await asyncio.sleep(0.2)
        await wait_ready(platform.ctx.endpoints, ["deployer"], within_s=60)
        assert {t: jobs_of(slurm_cluster, t) for t in jobs} == jobs  # still running
        for task_id in jobs:
            scratch = platform.ctx.data_dir / "slurm" / POOL / task_id / "run1-a1" / "w0"
            (scratch / "release").touch()

        done = await platform.wait_status(failing, "failed", within=90)
        await platform.wait_status(passing, "succeeded", within=90)
        for task_id, code in ((failing, 3), (passing, 0)):
            events = await platform.events(task_id)
            assert [e["exit_code"] for e in of(events, "WorkerExited")] == [code], task_id
            assert len(of(events, "TaskPlaced")) == 1
        assert done["last_failure_reason"] == "worker 0 exited with code 3"
        # No job was submitted since: the next job id follows the adopted ones.
        probe = slurm_cluster.run(
            "sbatch", "--parsable", "--output=/dev/null", "--wrap", "true"
        ).strip()
        slurm_cluster.run("scancel", probe, check=False)
        assert int(probe.split(";")[0]) == max(int(j) for ids in jobs.values() for j in ids) + 1
        assert not jobs_of(slurm_cluster, failing) and not jobs_of(slurm_cluster, passing)
        others = {n: c.restarts for n, c in platform.supervisor.children.items() if c.restarts}
        assert others == {"deployer": 1}, others
