"""Node truth from Slurm: a node Slurm drains or marks down is faulty in its pool.

A real slurmctld and two slurmd (n1, n2), a real Postgres with the pool's stream;
`SlurmNodeWatch.check` looks at sinfo and appends through the admin decisions.
Skipped, with the reason, where Slurm cannot run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from runyard.contracts import Metadata, NewEvent, default_mapper
from runyard.contracts.pool_events import NodeMarkedFaulty, NodeMarkedHealthy
from runyard.eventstore import PostgresEventStore
from runyard.scheduler import admin
from runyard.scheduler.config import parse_pools, pool_stream
from runyard.scheduler.domain import fold_pool
from runyard.scheduler.slurm_nodes import SlurmNodeWatch, slurm_pools
from runyard.stack.slurm import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

POOL = "slurm-a"


@pytest.fixture
async def store(dsn: str) -> AsyncIterator[PostgresEventStore]:
    store = await PostgresEventStore.connect(dsn, default_mapper())
    (config,) = parse_pools(
        {
            "pools": [
                {
                    "id": POOL,
                    "zone": "z",
                    "specs": [{"name": "1gpu", "gpus": 1, "cpus": 1, "memory_gib": 1}],
                    "nodes": [{"name": "n1", "gpus": 8}, {"name": "n2", "gpus": 8}],
                }
            ]
        }
    )
    meta = Metadata(actor="service:scheduler")
    events = [NewEvent(e, meta, datetime.now(UTC)) for _, e in config.registration()]
    await store.append(pool_stream(POOL), events, 0)
    try:
        yield store
    finally:
        await store.close()


async def health(store: PostgresEventStore) -> dict[str, tuple[str, str | None]]:
    state = fold_pool(r.event for r in await store.read_stream(pool_stream(POOL)))
    return {name: (node.health, node.fault) for name, node in state.nodes.items()}


@pytest.mark.parametrize(("slurm_state", "said"), [("drain", "DRAIN"), ("down", "DOWN")])
async def test_a_node_slurm_takes_out_is_faulty_until_slurm_resumes_it(
    store: PostgresEventStore, slurm_cluster: SlurmCluster, slurm_state: str, said: str
) -> None:
    watch = SlurmNodeWatch(
        store, POOL, slurm_conf=slurm_cluster.conf, partition=slurm_cluster.partition
    )
    assert await watch.check() == []
    slurm_cluster.run(
        "scontrol", "update", "nodename=n2", f"state={slurm_state}", "reason=bad dimm"
    )
    try:
        changes = await watch.check()
        assert [(c.node, c.to) for c in changes] == [("n2", "faulty")]
        found = await health(store)
        assert found["n1"] == ("healthy", None)
        assert found["n2"][0] == "faulty"
        assert found["n2"][1] is not None
        assert said in found["n2"][1] and "bad dimm" in found["n2"][1]
        assert await watch.check() == []  # recorded once
    finally:
        slurm_cluster.run("scontrol", "update", "nodename=n2", "state=resume")
        slurm_cluster.wait_idle()
    assert [(c.node, c.to) for c in await watch.check()] == [("n2", "healthy")]
    assert (await health(store))["n2"] == ("healthy", None)
    types = [type(r.event) for r in await store.read_stream(pool_stream(POOL))]
    assert types.count(NodeMarkedFaulty) == 1 and types.count(NodeMarkedHealthy) == 1


async def test_a_fault_an_operator_marked_is_not_healed_by_slurms_word(
    store: PostgresEventStore, slurm_cluster: SlurmCluster
) -> None:
    await admin.mark_node_faulty(store, POOL, "n1", "GPU 3 fell off the bus")
    watch = SlurmNodeWatch(store, POOL, slurm_conf=slurm_cluster.conf)
    assert await watch.check() == []  # Slurm says idle; the operator's fault stays
    assert (await health(store))["n1"] == ("faulty", "GPU 3 fell off the bus")


def test_slurm_pools_are_read_from_runtime_yaml() -> None:
    raw = {
        "pools": {
            "a": {"runtime": "slurm", "slurm_conf": "/etc/slurm/x.conf", "partition": "gpu"},
            "b": {"runtime": "local"},
        }
    }
    assert slurm_pools(raw) == {"a": (Path("/etc/slurm/x.conf"), "gpu")}
    assert slurm_pools({}) == {}
