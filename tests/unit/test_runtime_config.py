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
