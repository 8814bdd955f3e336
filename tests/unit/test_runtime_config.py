"""runtime.yaml's `local:` section read into the local runtime's settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from runyard.deployer.runtime import LocalRuntimeConfig


def _read(raw: dict[str, object], tmp_path: Path) -> LocalRuntimeConfig:
    return LocalRuntimeConfig.from_mapping(raw, data_dir=tmp_path, base_dir=tmp_path)


def test_deploys_at_once_defaults_to_16_and_takes_a_setting(tmp_path: Path) -> None:
    assert _read({}, tmp_path).deploys_at_once == 16
    assert _read({"deploys_at_once": 4}, tmp_path).deploys_at_once == 4


@pytest.mark.parametrize("bad", [0, -1, "many", None])
def test_deploys_at_once_below_one_is_refused_with_the_fix(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValueError, match=r"local\.deploys_at_once .*whole number >= 1"):
        _read({"deploys_at_once": bad}, tmp_path)


def test_gpu_nodes_are_found_by_their_index_and_nothing_else(tmp_path: Path) -> None:
    from runyard.deployer.runtime import gpu_nodes

    for name in ("nvidia0", "nvidia1", "nvidia10", "nvidiactl", "nvidia-uvm", "nvidia-caps"):
        (tmp_path / name).touch()
    (tmp_path / "card3.node").touch()
    (tmp_path / "card4").touch()
    assert gpu_nodes(f"{tmp_path}/nvidia{{gpu}}") == {
        0: tmp_path / "nvidia0",
        1: tmp_path / "nvidia1",
        10: tmp_path / "nvidia10",
    }
    assert gpu_nodes(f"{tmp_path}/card{{gpu}}.node") == {3: tmp_path / "card3.node"}
    assert gpu_nodes(f"{tmp_path}/missing/nvidia{{gpu}}") == {}


def test_workers_run_at_nice_10_unless_set(tmp_path: Path) -> None:
    assert _read({}, tmp_path).worker_nice == 10
    assert _read({"worker_nice": 0}, tmp_path).worker_nice == 0
    assert _read({"worker_nice": 19}, tmp_path).worker_nice == 19


@pytest.mark.parametrize("bad", [-1, 20, "low", True, 1.5])
def test_a_nice_value_outside_0_to_19_is_refused_with_the_fix(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValueError, match=r"worker_nice is .*whole number from 0 .* to 19"):
        _read({"worker_nice": bad}, tmp_path)


def test_workers_are_held_to_their_specs_cpus_and_memory_unless_turned_off(
    tmp_path: Path,
) -> None:
    assert _read({}, tmp_path).worker_limits is True
    assert _read({"worker_limits": False}, tmp_path).worker_limits is False


@pytest.mark.parametrize("bad", ["no", 0, None])
def test_worker_limits_other_than_true_or_false_is_refused(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValueError, match=r"worker_limits is .*: use true or false"):
        _read({"worker_limits": bad}, tmp_path)
