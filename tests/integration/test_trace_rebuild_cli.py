"""`runyard trace` and `runyard rebuild` against a served gateway: the commands an SRE
types, their output and their refusals."""

from __future__ import annotations

import json

import pytest
from runyard.api.auth import create_token

from tests.unit.test_cli import REPO, Served, cli, served_gateway  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


async def test_trace_prints_a_task_or_an_event_as_a_tree(served_gateway: Served) -> None:  # noqa: F811
    url, token = served_gateway.url, served_gateway.token
    submitted = await cli(url, token, "submit", "-f", str(REPO / "examples/hello.yaml"), "--json")
    task_id = json.loads(submitted.stdout)["task_id"]
    events = json.loads((await cli(url, token, "events", task_id, "--json")).stdout)

    shown = await cli(url, token, "trace", task_id)
    assert shown.exit_code == 0, shown.output
    assert f"trace of task {task_id}" in shown.stdout and "TaskSubmitted" in shown.stdout
    of_event = await cli(url, token, "trace", events[0]["event_id"], "--json")
    assert of_event.exit_code == 0, of_event.output
    answer = json.loads(of_event.stdout)
    assert answer["of"] == {"event_id": events[0]["event_id"]}
    assert answer["tree"][0]["type"] == "TaskSubmitted"
    forced = await cli(url, token, "trace", events[0]["event_id"], "--event", "--limit", "1")
    assert (
        forced.exit_code == 0 and "truncated" not in forced.stdout
    ) or "1 events" in forced.stdout
    missing = await cli(url, token, "trace", "nope")
    assert missing.exit_code != 0 and "task_not_found" in missing.output


async def test_rebuild_shows_progress_and_0_differences(served_gateway: Served) -> None:  # noqa: F811
    url = served_gateway.url
    await cli(url, served_gateway.token, "submit", "-f", str(REPO / "examples/hello.yaml"))
    refused = await cli(url, served_gateway.token, "rebuild", "task_list")
    assert refused.exit_code != 0 and "auth.operator_only" in refused.output
    sre = await create_token(served_gateway.gateway.db, "ops", "sam", "sre")
    await served_gateway.gateway.projector.catch_up()

    rebuilt = await cli(url, sre, "rebuild", "task_list", "--diff", "--step", "1")
    assert rebuilt.exit_code == 0, rebuilt.output
    assert "rebuild task_list: position 1 of" in rebuilt.stderr  # one line per step
    assert "0 differences (healthy" in rebuilt.stdout
    swapped = await cli(url, sre, "rebuild", "task_list", "--swap", "--json")
    assert json.loads(swapped.stdout)["repaired"] == 0
    unknown = await cli(url, sre, "rebuild", "nope")
    assert unknown.exit_code == 2 and "task_list" in unknown.output
