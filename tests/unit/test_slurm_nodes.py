"""The rule that turns Slurm's word on nodes into pool health (no Slurm needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from runyard.scheduler.domain.pool import NodeState
from runyard.scheduler.slurm_nodes import SlurmNode, slurm_node_changes
from runyard.stack.slurm import SlurmCluster


def node(name: str, fault: str | None = None) -> NodeState:
    found = NodeState.new(name)
    found.fault = fault
    return found


@pytest.mark.parametrize(
    ("state", "in_service"),
    [
        ("idle", True),
        ("mixed", True),
        ("allocated", True),
        ("completing", True),
        ("drained", False),
        ("draining", False),
        ("down*", False),
        ("down", False),
        ("idle*", False),  # not responding
        ("fail", False),
    ],
)
def test_which_slurm_states_are_in_service(state: str, in_service: bool) -> None:
    assert SlurmNode("n1", state).in_service is in_service


def test_a_node_slurm_takes_out_becomes_faulty_with_slurms_reason() -> None:
    nodes = {"n1": node("n1"), "n2": node("n2")}
    slurm = {"n1": SlurmNode("n1", "idle"), "n2": SlurmNode("n2", "drained", "bad dimm")}
    (change,) = slurm_node_changes(nodes, slurm)
    assert (change.node, change.to) == ("n2", "faulty")
    assert change.reason == "Slurm: node n2 is DRAINED (bad dimm)"


def test_only_faults_from_slurm_are_healed_and_nodes_not_in_the_pool_are_left_alone() -> None:
    nodes = {
        "a": node("a", "Slurm: node a is DOWN"),
        "b": node("b", "GPU 3 fell off the bus"),
        "d": node("d", "Slurm: node d is DRAINED"),
    }
    slurm = {
        "a": SlurmNode("a", "idle"),
        "b": SlurmNode("b", "idle"),
        "d": SlurmNode("d", "down*"),
        "elsewhere": SlurmNode("elsewhere", "down"),
    }
    changes = slurm_node_changes(nodes, slurm)
    assert [(c.node, c.to) for c in changes] == [("a", "healthy")]


def test_a_pool_node_slurm_does_not_list_is_faulty_with_the_fix_until_it_is_listed() -> None:
    nodes = {"a": node("a"), "ghost": node("ghost"), "gone": node("gone", "GPU 3 fell off")}
    slurm = {"a": SlurmNode("a", "idle")}
    (change,) = slurm_node_changes(nodes, slurm)
    assert (change.node, change.to) == ("ghost", "faulty")
    assert change.reason.startswith("Slurm: node ghost is not in Slurm's configuration: add it")
    (in_partition,) = slurm_node_changes(nodes, slurm, partition="gpu")
    assert "node ghost is not in partition gpu: add it to partition gpu" in in_partition.reason
    # Once faulty it is not marked again; listed and in service, it is healed.
    nodes["ghost"].fault = change.reason
    assert slurm_node_changes(nodes, slurm) == []
    slurm["ghost"] = SlurmNode("ghost", "idle")
    assert [(c.node, c.to) for c in slurm_node_changes(nodes, slurm)] == [("ghost", "healthy")]
    # An empty listing is no answer: nothing is marked.
    assert slurm_node_changes({"a": node("a")}, {}) == []


def test_the_test_cluster_config_names_its_nodes_ports_and_fake_gpus(tmp_path: Path) -> None:
    cluster = SlurmCluster(tmp_path / "slurm", nodes=("x1", "x2"), gpus_per_node=4)
    cluster.write_config()
    conf = cluster.conf.read_text()
    for name in ("x1", "x2"):
        assert f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port=" in conf
    assert "Gres=gpu:4" in conf and "OverSubscribe=FORCE" in conf
    assert "batch_sched_delay=0" in conf
    gres = (tmp_path / "slurm" / "gres.conf").read_text()
    assert "nvidia[0-3]" in gres
    assert (tmp_path / "slurm" / "fakedev" / "nvidia3").resolve() == Path("/dev/null")
    assert cluster.env()["SLURM_CONF"] == str(cluster.conf)
