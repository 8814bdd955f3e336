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


def test_only_faults_from_slurm_are_healed_and_unknown_nodes_are_left_alone() -> None:
    nodes = {
        "a": node("a", "Slurm: node a is DOWN"),
        "b": node("b", "GPU 3 fell off the bus"),
        "c": node("c"),
        "d": node("d", "Slurm: node d is DRAINED"),
    }
    slurm = {"a": SlurmNode("a", "idle"), "b": SlurmNode("b", "idle"), "d": SlurmNode("d", "down*")}
    changes = slurm_node_changes(nodes, slurm)
    assert [(c.node, c.to) for c in changes] == [("a", "healthy")]


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
