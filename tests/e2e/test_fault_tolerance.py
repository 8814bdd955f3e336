"""Fault tolerance end to end, through the gateway's HTTP API.

The whole platform runs as in `runyard up`, each service in its own process by
default (conftest.py): scheduler, deployer with the local runtime (real worker
processes), fault-tolerance service reading the real logs topic, gateway.
Short knobs come from settings and the test's config copy, never from changed
defaults: the deployer's `max_restart_delay_s` (runtime.yaml
`deployer:`) so a restart follows in about a second, and the FT service's
`faulttolerance_resume_wait_s` so the "no checkpoint loaded" warning comes soon.
The tests share the module's platforms (one per layout, `SHARED_PLATFORM`), each
with tasks of its own.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from runyard.deployer.runtime import group_members
from runyard.deployer.stacks import py_spy_binary

from tests.e2e.conftest import (
    Platform,
    SharedPlatform,
    platform_for_test,
    shared_for_module,
)
from tests.feishu_fake import FeishuFake
from tests.unit.test_cli import cli
from tests.unit.test_faulttolerance_slowdown import SEED_LINES, seed_ms

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SHARED_PLATFORM = True

CKPT = [{"file_system": "fs-main", "volume": "checkpoints", "mount_path": "/mnt/ckpt"}]
RESUME_WAIT_S = 2.0
HANG_TIMEOUT_S = 10  # the spec's minimum


FEISHU_BOT = "ft-alerts"


@pytest.fixture(scope="module")
async def feishu() -> AsyncIterator[FeishuFake]:
    fake = FeishuFake(bots={FEISHU_BOT: None})
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


def ft_options(feishu: FeishuFake) -> dict[str, Any]:
    """`running_platform`'s options for restarts after at most 0.5 s, a short resume
    wait, and alerts allowed to the fake Feishu bot (sent without waiting for a group
    window)."""

    def short_restarts(config: Path) -> None:
        runtime = yaml.safe_load((config / "runtime.yaml").read_text())
        runtime["deployer"] = {**(runtime.get("deployer") or {}), "max_restart_delay_s": 0.5}
        (config / "runtime.yaml").write_text(yaml.safe_dump(runtime))
        origins = {"webhook_origins": [f"http://127.0.0.1:{feishu.port}"]}
        (config / "notification.yaml").write_text(yaml.safe_dump(origins))

    return {
        "configure": short_restarts,
        "faulttolerance_resume_wait_s": RESUME_WAIT_S,
        "notification_group_window_s": 0.1,
        "notification_poll_s": 0.1,
    }


@pytest.fixture(scope="module")
async def ft_shared(
    postgres_url: str,
    kafka_bootstrap: str,
    tmp_path_factory: pytest.TempPathFactory,
    feishu: FeishuFake,
) -> AsyncIterator[SharedPlatform]:
    """The module's platforms (`ft_options`), shared by its tests: each has tasks of
    its own and waits for what it needs of them."""
    async with shared_for_module(
        postgres_url, kafka_bootstrap, tmp_path_factory, "ft", **ft_options(feishu)
    ) as shared:
        yield shared


@pytest.fixture
async def ft_platform(
    ft_shared: SharedPlatform, request: pytest.FixtureRequest
) -> AsyncIterator[Platform]:
    """The platform of `ft_options` in this test's layout."""
    async with platform_for_test(ft_shared, request) as running:
        yield running


async def ft_log(platform: Platform, task_id: str) -> dict[str, Any]:
    answer = await platform.http.get(f"/v1/tasks/{task_id}/ft-log")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def wait_events(
    platform: Platform,
    task_id: str,
    done: Callable[[list[dict[str, Any]]], bool],
    within: float,
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + within
    while True:
        platform.check_alive()
        events = await platform.events(task_id)
        if done(events):
            return events
        if time.monotonic() > deadline:
            raise AssertionError(f"{task_id} after {within}s: {[e['type'] for e in events]}")
        await asyncio.sleep(0.1)


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == kind]


def crash_once(mark: str, *, load: bool) -> str:
    """Attempt 1 saves step 50 and crashes; attempt 2 (maybe) loads it and finishes."""
    ckpt = f"/mnt/ckpt/{mark}/step_50.pt"
    resume = f'echo "Loading checkpoint from {ckpt} (step 50)"; cat {ckpt}; ' if load else ""
    return (
        f"mkdir -p /mnt/ckpt/{mark}; "
        f'if [ "$RUNYARD_ATTEMPT" = 1 ]; then '
        f"echo 'step 50 saved' > {ckpt}; echo 'saved checkpoint at step 50'; "
        "echo 'CUDA error: an illegal memory access was encountered' >&2; exit 1; fi; "
        f"{resume}echo 'training resumed'; sleep 1; echo done"
    )


async def test_a_crash_restarts_once_and_resumes_from_the_checkpoint(
    ft_platform: Platform,
) -> None:
    mark = uuid.uuid4().hex[:12]
    created = await ft_platform.submit(
        name="resume",
        command=crash_once(mark, load=True),
        mounts=CKPT,
        output_dirs=["/mnt/ckpt"],
        fault_tolerance={"auto_restart": True, "max_restarts": 1},
    )
    task_id = created["task_id"]
    await ft_platform.wait_status(task_id, "succeeded", within=25)
    events = await wait_events(
        ft_platform, task_id, lambda es: bool(of(es, "ResumeObserved")), within=5
    )
    (restart,) = of(events, "TaskRestartScheduled")
    assert (restart["reason"], restart["attempt"]) == ("failure", 2), restart
    (resumed,) = of(events, "ResumeObserved")
    assert resumed["attempt"] == 2
    assert resumed["step"] == 50
    assert resumed["path"] == f"/mnt/ckpt/{mark}/step_50.pt"
    assert not of(events, "ResumeNotObserved")

    body = await ft_log(ft_platform, task_id)
    assert body["counts"] == {"restarts": 1, "reschedules": 0, "hangs": 0, "slowdowns": 0}
    texts = [line["text"] for line in body["lines"]]
    assert texts[0].startswith("Restart 1 scheduled after failure: attempt 2 in ")
    assert texts[1] == (
        f"Resume observed at step 50 from /mnt/ckpt/{mark}/step_50.pt: "
        f"Loading checkpoint from /mnt/ckpt/{mark}/step_50.pt (step 50)"
    )


async def test_a_restart_shows_when_the_replaced_attempts_workers_ended(
    ft_platform: Platform,
) -> None:
    """Worker 0 crashes while worker 1 of that attempt still runs: `runyard events`
    shows worker 1's exit as attempt 1's, after the restart and before attempt 2 is
    deployed on the same GPUs; attempt 2 succeeds, and the GPUs are released once,
    after every exit."""
    command = (
        'if [ "$RUNYARD_ATTEMPT" = 1 ]; then '
        'if [ "$RUNYARD_WORKER_INDEX" = 0 ]; then exit 3; fi; sleep 60; fi; echo done'
    )
    created = await ft_platform.submit(
        name="peers",
        command=command,
        worker_count=2,
        framework="pytorch_ddp",
        fault_tolerance={"auto_restart": True, "max_restarts": 1},
    )
    task_id = created["task_id"]
    await ft_platform.wait_status(task_id, "succeeded", within=40)
    await wait_events(ft_platform, task_id, lambda es: bool(of(es, "ResourcesReleased")), 15)
    url, token = str(ft_platform.http.base_url).rstrip("/"), ft_platform.token
    shown = await cli(url, token, "events", task_id, "--json")
    assert shown.exit_code == 0, shown.output
    timeline = json.loads(shown.stdout)
    types = [e["type"] for e in timeline]
    exits = [(i, e["data"]) for i, e in enumerate(timeline) if e["type"] == "WorkerExited"]
    old = [(d["worker"], d["exit_code"]) for _, d in exits if d["attempt"] == 1]
    assert old[0] == (0, 3) and [worker for worker, _ in old] == [0, 1], old
    new = sorted((d["worker"], d["exit_code"]) for _, d in exits if d["attempt"] == 2)
    assert new == [(0, 0), (1, 0)]
    last_old = max(i for i, d in exits if d["attempt"] == 1)
    redeployed = next(
        i
        for i, e in enumerate(timeline)
        if e["type"] == "DeployStageStarted" and e["data"]["attempt"] == 2
    )
    assert types.index("TaskRestartScheduled") < last_old < redeployed
    assert types.count("ResourcesReleased") == 1
    assert types.index("ResourcesReleased") > max(i for i, _ in exits)
    table = await cli(url, token, "events", task_id)
    assert table.exit_code == 0, table.output
    # the table names the attempt of every event of a restarted history, so the old
    # attempt's exit after the restart is not read as the new one's
    assert "attempt=1 worker=1 exit_code=" in table.stdout, table.stdout
    assert "attempt=2 worker=1 exit_code=0" in table.stdout, table.stdout


async def test_a_restart_that_loads_no_checkpoint_is_a_warning(ft_platform: Platform) -> None:
    mark = uuid.uuid4().hex[:12]
    created = await ft_platform.submit(
        name="scratch",
        command=crash_once(mark, load=False) + "; sleep 5",
        mounts=CKPT,
        output_dirs=["/mnt/ckpt"],
        fault_tolerance={"auto_restart": True, "max_restarts": 1},
    )
    task_id = created["task_id"]
    started = time.monotonic()
    events = await wait_events(
        ft_platform, task_id, lambda es: bool(of(es, "ResumeNotObserved")), within=20
    )
    (missing,) = of(events, "ResumeNotObserved")
    assert missing["attempt"] == 2
    assert RESUME_WAIT_S <= missing["waited_s"] < RESUME_WAIT_S + 3
    assert "TaskSucceeded" not in [e["type"] for e in events], "the warning came on time"
    assert time.monotonic() - started < 20
    body = await ft_log(ft_platform, task_id)
    (warning,) = [line for line in body["lines"] if line["kind"] == "resume"]
    assert warning["level"] == "warning"
    assert warning["text"].startswith("No checkpoint load seen in the logs within")
    assert warning["text"].endswith("the training may have started from scratch")
    await ft_platform.wait_status(task_id, "succeeded", within=15)


HANGING = """python -u - <<'EOF'
import time

def wait_for_allreduce():
    time.sleep(100000)

print("step 1 done", flush=True)
wait_for_allreduce()
EOF"""


@pytest.mark.skipif(py_spy_binary() is None, reason="py-spy is not installed")
@pytest.mark.processes  # fault tolerance, deployer and gateway apart: stacks by command
async def test_a_hang_is_detected_its_stacks_captured_and_the_task_restarted(
    ft_platform: Platform,
) -> None:
    created = await ft_platform.submit(
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
    await ft_platform.wait_status(task_id, "running", within=15)
    running_at = time.monotonic()
    events = await wait_events(
        ft_platform,
        task_id,
        lambda es: bool(of(es, "TaskRestartScheduled")),
        within=HANG_TIMEOUT_S + 10,
    )
    assert time.monotonic() - running_at < HANG_TIMEOUT_S + 5, "detected within the time + 5 s"
    (hang,) = of(events, "HangDetected")
    assert hang["attempt"] == 1 and HANG_TIMEOUT_S <= hang["idle_s"] < HANG_TIMEOUT_S + 3
    (captured,) = of(events, "StacksCaptured")
    assert captured["workers"] == [0, 1]
    (restart,) = of(events, "TaskRestartScheduled")
    assert (restart["reason"], restart["attempt"]) == ("hang", 2)
    types = [e["type"] for e in events]
    assert types.index("HangDetected") < types.index("StacksCaptured")
    assert types.index("StacksCaptured") < types.index("TaskRestartScheduled")

    answer = await ft_platform.http.get(f"/v1/tasks/{task_id}/stacks/{captured['report_id']}")
    assert answer.status_code == 200, answer.text
    report = answer.json()
    assert set(report["frames_by_worker"]) == {"0", "1"}
    for worker in ("0", "1"):
        assert any(f.startswith("wait_for_allreduce") for f in report["frames_by_worker"][worker])
        raw = [
            frame["name"]
            for proc in report["workers"][worker]
            for thread in proc["threads"]
            for frame in thread["frames"]
        ]
        assert "wait_for_allreduce" in raw and "<module>" in raw
    assert any(name.startswith("wait_for_allreduce") for name in report["functions"])
    assert report["summary"]
    listed = (await ft_platform.http.get(f"/v1/tasks/{task_id}/stacks")).json()["reports"]
    assert captured["report_id"] in [r["report_id"] for r in listed]

    # the restarted attempt runs (and would hang again: no restart is left)
    await ft_platform.wait_for(task_id, lambda t: t["attempt"] == 2 and t["status"] == "running")
    body = await ft_log(ft_platform, task_id)
    assert body["counts"]["hangs"] == 1 and body["counts"]["restarts"] == 1
    kinds = [line["kind"] for line in body["lines"]]
    assert kinds[:3] == ["hang", "stacks", "restart"]
    assert body["lines"][2]["text"].startswith("Restart 1 scheduled after hang: attempt 2 in ")
    await ft_platform.http.post(f"/v1/tasks/{task_id}/stop")


async def test_stacks_on_demand_and_ft_log_through_the_cli(ft_platform: Platform) -> None:
    created = await ft_platform.submit(
        name="busy",
        image="pytorch:2.3-cuda12",
        command=HANGING,
        worker_count=2,
        framework="pytorch_ddp",
    )
    task_id = created["task_id"]
    await ft_platform.wait_status(task_id, "running", within=15)
    url, token = str(ft_platform.http.base_url).rstrip("/"), ft_platform.token
    if py_spy_binary() is not None:
        await asyncio.sleep(1.0)  # let the interpreter reach the function
        shown = await cli(url, token, "stacks", task_id, "--capture")
        assert shown.exit_code == 0, shown.output
        assert "worker 0: wait_for_allreduce" in shown.stdout
        assert "worker 1: wait_for_allreduce" in shown.stdout
        events = await ft_platform.events(task_id)
        (captured,) = [e for e in events if e["type"] == "StacksCaptured"]
        assert captured["actor"] == "user:e2e/alice"
        again = await cli(url, token, "stacks", task_id, "--json")
        assert json.loads(again.stdout)["report_id"] == captured["data"]["report_id"]
    other = await ft_platform.http.get("/v1/tasks/nope/ft-log")
    assert other.status_code == 404
    await ft_platform.http.post(f"/v1/tasks/{task_id}/stop")
    await ft_platform.wait_status(task_id, "stopped", within=15)
    refused = await ft_platform.http.post(f"/v1/tasks/{task_id}/stacks")
    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "stacks.not_running"


async def test_a_faulty_node_reschedules_and_ft_log_counts_it(ft_platform: Platform) -> None:
    created = await ft_platform.submit(
        name="moving",
        command='echo "on $RUNYARD_NODE attempt $RUNYARD_ATTEMPT"; '
        'if [ "$RUNYARD_ATTEMPT" = 1 ]; then sleep 60; fi',
    )
    task_id = created["task_id"]
    await ft_platform.wait_status(task_id, "running", within=15)
    events = await ft_platform.events(task_id)
    (placed,) = of(events, "TaskPlaced")
    node = placed["workers"][0]["node"]
    marked = await ft_platform.http.post(
        f"/v1/admin/pools/dev-a100/nodes/{node}/fault", json={"reason": "GPU 3 fell off"}
    )
    assert marked.status_code == 200, marked.text
    await ft_platform.wait_status(task_id, "succeeded", within=20)
    url, token = str(ft_platform.http.base_url).rstrip("/"), ft_platform.token
    shown = await cli(url, token, "ft-log", task_id)
    assert shown.exit_code == 0, shown.output
    assert "restarts=1 reschedules=1 hangs=0 slowdowns=0" in shown.stdout
    assert f"Reschedule 1 requested: node {node} is faulty: GPU 3 fell off" in shown.stdout
    assert "Restart 1 scheduled after hardware fault: attempt 2 on healthy nodes" in shown.stdout
    as_json = json.loads((await cli(url, token, "ft-log", task_id, "--json")).stdout)
    assert as_json["counts"] == {"restarts": 1, "reschedules": 1, "hangs": 0, "slowdowns": 0}


def megatron_line(iteration: str, ms: str) -> str:
    """A Megatron-LM training log line (bash printf arguments)."""
    return (
        f"printf ' iteration %8d/    1000 | consumed samples: %8d | elapsed time per "
        f"iteration (ms): %.1f | learning rate: 3.000E-04 | global batch size:     8 | "
        f"lm loss: 2.345E+00 | loss scale: 1.0 |\\n' {iteration} $(({iteration} * 8)) {ms}"
    )


def tqdm_line(iteration: str, seconds: str) -> str:
    """A transformers Trainer (LLaMA-Factory) progress bar (bash printf arguments)."""
    return (
        f"printf '%3d%%|▍         | %d/1000 [01:23<45:06, %5.2fs/it]\\n' "
        f"$(({iteration} / 10)) {iteration} {seconds}"
    )


def seed_log_command(line: Any, unit: float) -> str:
    """Prints the seed's resumed log (iterations 3-92) at once, then exits 0."""
    cases = " ".join(f"{it}) t={seed_ms(it) / unit:g};;" for it in range(83, 93))
    return (
        "echo 'resuming from iteration 2'; "
        f"for i in {{3..92}}; do t={3101 / unit:g}; case $i in {cases} esac; "
        f"{line('$i', '$t')}; done"
    )


@pytest.mark.parametrize(
    ("form", "expected"),
    [
        ("megatron", SEED_LINES),
        (
            "llamafactory",
            [
                line.replace("9465.00", "9466.00").replace("3101.00", "3100.00")
                for line in SEED_LINES
            ],
        ),
    ],
)
async def test_a_log_printed_at_once_gives_one_slowdown_line_per_slow_window(
    ft_platform: Platform, form: str, expected: list[str]
) -> None:
    """The seed's example (a run resumed at iteration 3): 83-87 and 88-92 are slow. The
    script prints its whole log and exits at once: every line still counts."""
    if form == "megatron":
        command = seed_log_command(megatron_line, 1.0)
    else:  # tqdm shows seconds to 2 decimals: 3.10, 9.00 ... 17.32 (83-87: 9.47 -> 9466 ms)
        command = seed_log_command(tqdm_line, 1000.0)
    created = await ft_platform.submit(
        name=f"slow-{form}", command=command, fault_tolerance={"slowdown_detection": True}
    )
    task_id = created["task_id"]
    await ft_platform.wait_status(task_id, "succeeded", within=20)
    events = await wait_events(
        ft_platform, task_id, lambda es: len(of(es, "SlowdownDetected")) >= 2, within=20
    )
    assert [e["message"] for e in of(events, "SlowdownDetected")] == expected
    body = await ft_log(ft_platform, task_id)
    slow = [line for line in body["lines"] if line["kind"] == "slowdown"]
    assert [line["text"] for line in slow] == expected
    assert body["counts"]["slowdowns"] == 2


@pytest.mark.skipif(py_spy_binary() is None, reason="py-spy is not installed")
async def test_a_hang_with_no_restart_left_fails_the_task_and_alerts(
    ft_platform: Platform, feishu: FeishuFake
) -> None:
    created = await ft_platform.submit(
        name="hang-twice",
        image="pytorch:2.3-cuda12",
        command=HANGING,
        fault_tolerance={
            "auto_restart": True,
            "max_restarts": 1,
            "hang_timeout_s": HANG_TIMEOUT_S,
        },
        alerts=[{"webhook_url": feishu.url(FEISHU_BOT), "alerts": ["failed"]}],
    )
    task_id = created["task_id"]
    await ft_platform.wait_for(task_id, lambda t: t["attempt"] == 2 and t["status"] == "running")
    running = await ft_platform.task(task_id)
    pids = ft_platform.worker_pids((task_id, f"{task_id}-run{running['run']}", 2))
    assert pids, "the second attempt's workers run"
    failed = await ft_platform.wait_status(task_id, "failed", within=HANG_TIMEOUT_S + 20)
    assert failed["last_failure_reason"] == "hang, no restarts left"

    events = await wait_events(
        ft_platform, task_id, lambda es: bool(of(es, "ResourcesReleased")), within=10
    )
    assert [h["attempt"] for h in of(events, "HangDetected")] == [1, 2]
    assert len(of(events, "TaskRestartScheduled")) == 1
    (fail,) = of(events, "TaskFailed")
    assert (fail["attempt"], fail["reason"]) == (2, "hang, no restarts left")
    left = {i: group_members(pid) for i, pid in pids.items()}
    assert not any(left.values()), f"worker processes left: {left}"

    body = await ft_log(ft_platform, task_id)
    assert body["status"] == "failed"
    assert body["counts"]["hangs"] == 2 and body["counts"]["restarts"] == 1
    assert body["lines"][-1]["text"] == (
        "Task failed: hang, no restarts left (1 of 1 restarts used)"
    )

    deadline = time.monotonic() + 15
    while not feishu.accepted(FEISHU_BOT):
        assert time.monotonic() < deadline, f"no alert: {feishu.received}"
        await asyncio.sleep(0.1)
    (card,) = feishu.accepted(FEISHU_BOT)
    assert "hang, no restarts left" in card.text
    await wait_events(ft_platform, task_id, lambda es: bool(of(es, "AlertDelivered")), within=10)
