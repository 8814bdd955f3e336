"""An env variable's value written as a number or boolean in a task file or a `--set`
(`value: 3`, `value: 1.50`, `value: true`): `runyard` sends it as the text it is
written as, and a real gateway (uvicorn on a free port, real Postgres) takes it;
other fields keep their types."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_cli import REPO, Served, cli
from tests.unit.test_cli import served_gateway as served_gateway  # the fixture

pytestmark = pytest.mark.integration

SPEC = (REPO / "examples/hello.yaml").read_text()
ENV = (
    "env:\n"
    "  - {name: RANKS, value: 3}\n"
    "  - {name: LR, value: 1.50}\n"
    "  - {name: DEBUG, value: true}\n"
    "  - {name: MODE, value: fast}\n"
    "fault_tolerance: {auto_restart: true, max_restarts: 2}\n"
)


def env_of(task: dict[str, object]) -> dict[str, str]:
    spec = task["spec"]
    assert isinstance(spec, dict)
    return {item["name"]: item["value"] for item in spec["env"]}


async def test_env_values_written_as_numbers_or_booleans_are_sent_as_text(
    served_gateway: Served, tmp_path: Path
) -> None:
    url, token = served_gateway.url, served_gateway.token
    spec = tmp_path / "task.yaml"
    spec.write_text(SPEC + ENV)
    submitted = await cli(url, token, "submit", "-f", str(spec), "--json")
    assert submitted.exit_code == 0, submitted.output
    task = json.loads(submitted.stdout)
    assert env_of(task) == {"RANKS": "3", "LR": "1.50", "DEBUG": "true", "MODE": "fast"}
    assert task["spec"]["fault_tolerance"]["auto_restart"] is True  # not an env value
    assert task["spec"]["fault_tolerance"]["max_restarts"] == 2

    plain = tmp_path / "plain.yaml"
    plain.write_text(SPEC)
    setting = "env=[{name: WORKERS, value: 8}, {name: AMP, value: false}]"
    set_ = await cli(url, token, "submit", "-f", str(plain), "--set", setting, "--json")
    assert set_.exit_code == 0, set_.output
    assert env_of(json.loads(set_.stdout)) == {"WORKERS": "8", "AMP": "false"}

    group = tmp_path / "group.yaml"
    group.write_text(
        "template:\n"
        + "".join(f"  {line}\n" for line in SPEC.splitlines() if not line.startswith("#"))
        + "  env: [{name: SEED, value: 1}]\n"
        "items:\n  - {name: a}\n  - {name: b, env: [{name: SEED, value: 2}]}\n"
    )
    created = await cli(url, token, "group", "create", "-f", str(group), "--json")
    assert created.exit_code == 0, created.output
    seeds = []
    for row in json.loads(created.stdout)["tasks"]:
        shown = await cli(url, token, "show", row["task_id"], "--json")
        assert shown.exit_code == 0, shown.output
        seeds.append(env_of(json.loads(shown.stdout))["SEED"])
    assert sorted(seeds) == ["1", "2"]
