"""The audit chain end to end (R-62): every event leads back to a request.

One task goes through what fault tolerance does on its own (a crash and a
restart, a resume seen in the log, a hang with its stacks and a restart) and
then a person's stop, all through the gateway with the request ids the
client sends. Every event of the database must keep the chain (`audit.py`;
conftest checks the same after every e2e test), and each event of the task
must lead back to the submission's request, or, for the stop, the stop's.
The checker itself is shown to catch each kind of break.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from tests.e2e.audit import Stored, chain_breaks, read_all, root_of
from tests.e2e.conftest import Platform
from tests.e2e.test_fault_tolerance import (
    HANG_TIMEOUT_S,
    feishu,
    ft_log,
    ft_platform,
    ft_shared,
    of,
    wait_events,
)

# fixtures shared with the fault-tolerance tests (this module's one test has its platform)
__all__ = ["feishu", "ft_platform", "ft_shared"]

pytestmark = [pytest.mark.slow, pytest.mark.integration]

#: Attempt 1 crashes; 2 loads its checkpoint and hangs; 3 loads it and works until stopped.
CRASH_HANG_WORK = """\
echo "saved checkpoint at step 50"
if [ "$RUNYARD_ATTEMPT" = 1 ]; then echo 'RuntimeError: injected crash' >&2; exit 1; fi
echo "Loading checkpoint from /mnt/ckpt/step_50.pt (step 50)"
if [ "$RUNYARD_ATTEMPT" = 2 ]; then exec sleep 100000; fi
for i in $(seq 1 120); do echo "step $((50 + i))"; sleep 0.5; done
"""

#: What fault tolerance appends: each must name its cause and keep the submission's id.
FT_EVENTS = ("HangDetected", "TaskRestartScheduled", "ResumeObserved")


@pytest.mark.processes
async def test_every_event_of_a_task_leads_back_to_its_submission_or_its_stop(
    ft_platform: Platform,
) -> None:
    submit_id, stop_id = f"submit-{uuid.uuid4()}", f"stop-{uuid.uuid4()}"
    body = {
        "pool": "dev-a100",
        "worker_spec": "1gpu",
        "image": "bash-only",
        "name": "audited",
        "command": CRASH_HANG_WORK,
        "fault_tolerance": {
            "auto_restart": True,
            "max_restarts": 2,
            "hang_timeout_s": HANG_TIMEOUT_S,
        },
    }
    created = await ft_platform.http.post(
        "/v1/tasks", json=body, headers={"X-Request-Id": submit_id}
    )
    assert created.status_code == 201, created.text
    task_id = created.json()["task_id"]
    await wait_events(
        ft_platform,
        task_id,
        lambda es: len(of(es, "ResumeObserved")) == 2 and len(of(es, "TaskRestartScheduled")) == 2,
        within=HANG_TIMEOUT_S + 30,
    )
    await ft_platform.wait_for(task_id, lambda t: t["attempt"] == 3 and t["status"] == "running")
    stopped = await ft_platform.http.post(
        f"/v1/tasks/{task_id}/stop", headers={"X-Request-Id": stop_id}
    )
    assert stopped.status_code == 200, stopped.text
    await ft_platform.wait_status(task_id, "stopped", within=20)
    await wait_events(ft_platform, task_id, lambda es: bool(of(es, "ResourcesReleased")), within=10)
    restarts = [e["reason"] for e in of(await ft_platform.events(task_id), "TaskRestartScheduled")]
    assert restarts == ["failure", "hang"]
    assert (await ft_log(ft_platform, task_id))["counts"]["hangs"] == 1

    deadline = time.monotonic() + 5  # the last reactions (stop, release) settle
    while True:
        events = await read_all(ft_platform.ctx.dsn)
        if not chain_breaks(events) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert chain_breaks(events) == []
    by_id = {e.event_id: e for e in events}
    mine = [e for e in events if e.stream_id == f"task-{task_id}"]
    roots = {e.type: root_of(e, by_id).causation_id for e in mine}
    assert roots["TaskSubmitted"] == submit_id
    assert roots["TaskStopRequested"] == roots["TaskStopped"] == stop_id
    for kind in (*FT_EVENTS, "WorkerExited", "TaskRunning", "TaskPlaced"):
        found = [e for e in mine if e.type == kind]
        assert found, f"no {kind}"
        for event in found:
            assert event.correlation_id == submit_id, f"{kind}: {event}"
            assert event.causation_id in by_id, f"{kind} names no event as its cause"
    hang = next(e for e in mine if e.type == "HangDetected")
    assert by_id[hang.causation_id or ""].type == "TaskRunning"
    after_hang = [e for e in mine if e.causation_id == hang.event_id]
    assert {e.type for e in after_hang} >= {"TaskRestartScheduled"}
    pool = [e for e in events if e.stream_id == "pool-dev-a100" and e.type.startswith("Workers")]
    assert {root_of(e, by_id).causation_id for e in pool} <= {submit_id, stop_id}


def _event(
    event_id: str, causation: str | None, correlation: str | None, actor: str = "service:x"
) -> Stored:
    return Stored(event_id, "task-t", "SomethingHappened", actor, causation, correlation)


def test_the_checker_catches_each_kind_of_break() -> None:
    request = _event("e1", "req-1", "req-1", actor="user:acme/alice")
    good = [request, _event("e2", "e1", "req-1"), _event("e3", "e2", "req-1")]
    assert chain_breaks(good) == []
    config = _event("p1", "config:pools/dev", "config:pools/dev", actor="service:scheduler")
    assert chain_breaks([config, _event("p2", "p1", "config:pools/dev")]) == []

    no_ids = chain_breaks([*good, _event("e4", None, None)])
    assert len(no_ids) == 1 and "no causation id or correlation id" in no_ids[0]
    lost = chain_breaks([*good, _event("e4", "e3", "e4")])
    assert len(lost) == 1 and "differs from its cause's" in lost[0]
    orphan = chain_breaks([*good, _event("e4", "made-up", "made-up")])
    assert len(orphan) == 1 and "neither a person's request, the configuration nor" in orphan[0]
    split = chain_breaks([_event("e1", "req-1", "req-2", actor="user:acme/alice")])
    assert len(split) == 1 and "not its request id" in split[0]
