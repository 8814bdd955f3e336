"""A pool run by Slurm, through the gateway: tasks run as Slurm jobs, and Slurm's
word on a node reaches the pool.

The platform's config gets a pool `slurm-e2e` whose nodes are the test cluster's
(n1, n2; `runyard.stack.slurm`) and, in runtime.yaml, `runtime: slurm` for it.
Skipped, with the reason, where Slurm cannot run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from runyard.messaging import KafkaSettings
from runyard.stack.slurm import SlurmCluster

from tests.e2e.conftest import Platform, running_platform

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.slurm]

POOL = "slurm-e2e"


def slurm_pool(cluster: SlurmCluster) -> Any:
    def configure(config: Path) -> None:
        pools = yaml.safe_load((config / "pools.yaml").read_text())
        pools["pools"].append(
            {
                "id": POOL,
                "zone": "cn-north-1",
                "gpu_model": "A100-80G",
                "specs": [{"name": "1gpu", "gpus": 1, "cpus": 1, "memory_gib": 8}],
                "nodes": [{"name": n, "gpus": cluster.gpus_per_node} for n in cluster.nodes],
            }
        )
        (config / "pools.yaml").write_text(yaml.safe_dump(pools))
        runtime = yaml.safe_load((config / "runtime.yaml").read_text())
        runtime["pools"] = {
            POOL: {
                "runtime": "slurm",
                "partition": cluster.partition,
                "slurm_conf": str(cluster.conf),
                "grace_s": 2,
            }
        }
        runtime["deployer"] = {**(runtime.get("deployer") or {}), "max_restart_delay_s": 0.5}
        (config / "runtime.yaml").write_text(yaml.safe_dump(runtime))

    return configure


@pytest.fixture
async def on_slurm(
    dsn: str, kafka: KafkaSettings, tmp_path: Path, slurm_cluster: SlurmCluster
) -> AsyncIterator[Platform]:
    async with running_platform(
        dsn, kafka, tmp_path, configure=slurm_pool(slurm_cluster)
    ) as running:
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
    created = await on_slurm.submit(
        pool=POOL,
        worker_count=2,
        framework="pytorch_ddp",
        command='test -n "$SLURM_JOB_ID" && echo "rank $RANK on $SLURMD_NODENAME"',
    )
    task = await on_slurm.wait_status(created["task_id"], "succeeded", within=120)
    assert [s["stage"] for s in task["stages"] if s["result"] == "completed"] == [
        "resource_allocation",
        "image_pull",
        "storage_mount",
        "env_init",
    ]
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
