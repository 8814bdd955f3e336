"""The support bundle (`GET /v1/tasks/{id}/bundle`, `runyard bundle`) on a real Postgres.

The task is submitted through the HTTP API (so its creator-only value is in the
secret store), then driven by the domain's commands and a real fault-tolerance
service (as in test_faulttolerance_api.py): attempt 1 crashes with a traceback,
attempt 2 hangs (stacks captured), attempt 3 exits non-zero with no restart
left. Worker lines go through the log store's ingest. The bundle is unpacked
and read as a person in support would.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from runyard.api.auth import create_token
from runyard.api.security import TokenAuthenticator
from runyard.api.service import service_app
from runyard.contracts import Metadata, NewEvent
from runyard.contracts.spec import TaskSpec
from runyard.contracts.task_events import (
    DEPLOY_STAGES,
    AlertDelivered,
    DeployStageCompleted,
    DeployStageStarted,
    TaskPlaced,
    WorkerPlacement,
)
from runyard.domain.task import CompleteStage, ExitWorker, StartStage
from runyard.faulttolerance.app import FaultToleranceApp
from runyard.faulttolerance.http import faulttolerance_router
from runyard.faulttolerance.reports import StackReportStore
from runyard.gateway import bundle
from runyard.gateway.app import Gateway
from runyard.gateway.bundle import MAX_BUNDLE_BYTES, TAIL_LINES
from runyard.gateway.http import create_app
from runyard.logs import LogStore

from tests.integration.test_faulttolerance_api import fake_capture
from tests.integration.test_faulttolerance_service import Clock, CommandsToDeployer, Harness
from tests.integration.test_gateway import config_dir
from tests.integration.test_gateway_routing import log_service, serving
from tests.log_records import log_record
from tests.unit.test_cli import cli

pytestmark = pytest.mark.integration

SECRET = "hf_Zq81-secret-value-of-alice"
REQUEST_ID = "req-bundle-1"
HOOK = "https://open.feishu.cn/open-apis/bot/v2/hook/0f1e2d3c-5a6b-4c7d-8e9f-a0b1c2d3e4f5"
SPEC = {
    "name": "llama-sft",
    "pool": "pool-a",
    "worker_spec": "1gpu",
    "worker_count": 2,
    "framework": "pytorch_ddp",
    "image": "pytorch:2.3-cuda12",
    "command": "torchrun train.py",
    "env": f"HF_TOKEN={SECRET};RUN_ID=exp-001",
    "creator_only": ["HF_TOKEN"],
    "output_dirs": ["/mnt/shared/ckpt"],
    "fault_tolerance": {"auto_restart": True, "max_restarts": 2, "hang_timeout_s": 10},
    "alerts": [{"webhook_url": HOOK}],
}
OOM = [
    "Traceback (most recent call last):",
    '  File "train.py", line 12, in <module>',
    "    loss = model(batch)",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
]


@dataclass
class Api:
    gateway: Gateway
    http: httpx.AsyncClient
    tokens: dict[str, str]
    h: Harness
    logs: LogStore
    app: Any

    async def call(self, who: str, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}", **kw.pop("headers", {})}
        return await self.http.request(method, path, headers=headers, **kw)

    async def bundle(self, who: str, task_id: str) -> httpx.Response:
        return await self.call(who, "GET", f"/v1/tasks/{task_id}/bundle")

    async def submit(self, **changes: Any) -> str:
        headers = {"X-Request-Id": REQUEST_ID}
        answer = await self.call(
            "alice", "POST", "/v1/tasks", json={**SPEC, **changes}, headers=headers
        )
        assert answer.status_code == 201, answer.text
        return str(answer.json()["task_id"])

    async def print_lines(
        self, task_id: str, attempt: int, worker: int, texts: list[str], start: datetime
    ) -> None:
        """Lines as the deployer publishes them (numbered per worker and stream)."""
        await self.logs.ingest(
            [
                log_record(
                    start + timedelta(milliseconds=i),
                    task_id,
                    text,
                    attempt=attempt,
                    worker=worker,
                    seq=i,
                )
                for i, text in enumerate(texts)
            ]
        )


@pytest.fixture
async def api(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Api]:
    monkeypatch.setenv("RUNYARD_HOME", str(tmp_path / "home"))
    gateway = await Gateway.connect(dsn, config_dir(tmp_path))
    tokens = {
        "alice": await create_token(gateway.db, "acme", "alice", "member"),
        "bob": await create_token(gateway.db, "acme", "bob", "member"),
        "carol": await create_token(gateway.db, "other", "carol", "member"),
        "sre": await create_token(gateway.db, "ops", "sam", "sre"),
    }
    reports = StackReportStore(gateway.db)
    await reports.migrate()
    clock = Clock()
    ft = FaultToleranceApp(
        gateway.store,
        reports=reports,
        deployer=CommandsToDeployer(gateway.store, capture=fake_capture),
        clock=clock,
    )
    # the owners of the bundle's parts, each on a port of its own
    endpoints: dict[str, str] = {}
    ft_router = faulttolerance_router(ft, reports, TokenAuthenticator(gateway.db))
    app = create_app(gateway, endpoints)
    transport = httpx.ASGITransport(app=app)
    async with (
        log_service(dsn, tmp_path / "home" / "exports", endpoints) as logs,
        serving("faulttolerance", service_app("faulttolerance", routers=[ft_router]), endpoints),
        httpx.AsyncClient(transport=transport, base_url="http://gw") as client,
    ):
        harness = Harness(gateway.store, ft, clock, reports)
        yield Api(gateway, client, tokens, harness, logs.store, app)
    await ft.drain()
    await app.state.owners.aclose()
    await gateway.close()


#: What the harness needs of the spec to start the workers: their count.
TWO_WORKERS = TaskSpec(
    name="t", pool="pool-a", worker_spec="1gpu", worker_count=2, image="i", command="c"
)


async def start_attempt(api: Api, task_id: str, attempt: int) -> None:
    """Place (first attempt), run the deploy stages, start every worker."""
    h = api.h
    if attempt == 1:
        placed = tuple(
            WorkerPlacement(index=i, node=f"pool-a-node-{i}", gpus=(0,)) for i in range(2)
        )
        await h.append(task_id, TaskPlaced(run=1, attempt=1, pool="pool-a", workers=placed))
    for stage in DEPLOY_STAGES:
        await h.act(task_id, StartStage(task_id, stage), CompleteStage(task_id, stage))
    h.workers[(task_id, 1, attempt)] = dict.fromkeys(range(2), 4242)
    await h.start_workers(task_id, TWO_WORKERS, attempt)


async def crashed_hung_failed(api: Api) -> str:
    """A task that crashed (restart 1), hung (restart 2), then failed with none left."""
    task_id = await api.submit()
    t0 = datetime.now(UTC) - timedelta(minutes=20)
    await start_attempt(api, task_id, 1)
    steps = [f"step {i} loss=2.{i % 10}" for i in range(600)]
    await api.print_lines(task_id, 1, 0, [*steps, f"using token {SECRET} for the hub", *OOM], t0)
    await api.print_lines(task_id, 1, 1, ["step 0 loss=2.0", f"alerts go to {HOOK}"], t0)
    await api.h.act(task_id, ExitWorker(task_id, 1, 1, 0, 1))

    await start_attempt(api, task_id, 2)
    await api.h.lines(task_id, 0, ["step 600"], attempt=2)
    await api.print_lines(task_id, 2, 0, ["step 600"], t0 + timedelta(minutes=5))
    api.h.clock.advance(11)
    await api.h.tick(task_id)

    await start_attempt(api, task_id, 3)
    await api.print_lines(task_id, 3, 0, ["resuming", "step 601"], t0 + timedelta(minutes=10))
    await api.print_lines(task_id, 3, 1, ["step 601", "exiting"], t0 + timedelta(minutes=10))
    await api.h.act(task_id, ExitWorker(task_id, 1, 3, 1, 2))
    return task_id


def unpack(body: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


async def test_a_failed_task_tells_its_story(api: Api) -> None:
    task_id = await crashed_hung_failed(api)
    answer = await api.bundle("alice", task_id)  # the creator
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/zip"
    assert f"runyard-bundle-{task_id}.zip" in answer.headers["content-disposition"]
    files = unpack(answer.content)
    names = list(files)
    assert names[0] == "summary.md"
    for name in (
        "task.json",
        "spec.json",
        "first-error.json",
        "ft-log.txt",
        "env-check.json",
        "slowdowns.txt",
        "platform.json",
        "events.jsonl",
    ):
        assert name in names
    assert [n for n in names if n.startswith("stacks/")], names

    # no secret value anywhere: not the creator-only value, the webhook, the caller's token
    for name, data in files.items():
        assert SECRET.encode() not in data, name
        assert b"0f1e2d3c-5a6b-4c7d-8e9f-a0b1c2d3e4f5" not in data, name
        assert api.tokens["alice"].encode() not in data, name

    summary = files["summary.md"].decode()
    assert f"# Support bundle of task {task_id}" in summary
    assert "- Name: llama-sft" in summary and "- Tenant: acme; creator: alice" in summary
    assert "- State: failed" in summary
    assert "Layer: **training_code** (rule `training.cuda_oom`)" in summary
    assert "torch.OutOfMemoryError: CUDA out of memory" in summary
    assert "Where: run 1, attempt 1, worker 0" in summary
    assert "| 2 | 0 | 0 | 0 | 1 | 0 |" in summary  # restarts 2, hangs 1
    assert "restart scheduled after failure: attempt 2" in summary
    assert "restart scheduled after hang: attempt 3" in summary
    assert "attempt 2: hang detected" in summary
    assert "run 1 failed in attempt 3: worker 1 exited with code 2" in summary
    assert "- Reason: worker 1 exited with code 2" in summary
    assert "| 1 | 1 | image_pull |" in summary  # deploy stage timings
    assert "- output: /mnt/shared/ckpt" in summary
    assert "pool-a-node-0, pool-a-node-1" in summary

    task = json.loads(files["task.json"])
    assert task["status"] == "failed"
    assert task["counters"]["restarts"] == 2 and task["counters"]["hangs"] == 1
    spec = json.loads(files["spec.json"])
    env = {v["name"]: v for v in spec["env"]}
    assert env["HF_TOKEN"]["value"] == "******" and env["HF_TOKEN"]["secret_ref"] is None
    assert env["RUN_ID"]["value"] == "exp-001"
    assert spec["alerts"][0]["webhook_url"] == "https://open.feishu.cn/******"

    stream = await api.gateway.store.read_stream(f"task-{task_id}")
    events = [json.loads(line) for line in files["events.jsonl"].splitlines()]
    assert [(e["position"], e["event_id"], e["type"]) for e in events] == [
        (r.global_position, str(r.event_id), r.type) for r in stream
    ]
    assert events[0]["correlation_id"] == REQUEST_ID == events[0]["causation_id"]
    assert events[0]["actor"] == "user:acme/alice"
    hang = next(e for e in events if e["type"] == "HangDetected")
    assert hang["causation_id"] and "trace_context" in hang
    by_id = {e["event_id"]: e for e in events}
    assert by_id[hang["causation_id"]]["type"] == "TaskRunning"

    first = json.loads(files["first-error.json"])
    assert first["layer"] == "training_code" and first["line"]["attempt"] == 1
    ft_log = files["ft-log.txt"].decode()
    assert "Restart 2 scheduled after hang" in ft_log and "Hang detected" in ft_log

    # tails: the failing attempt (1, the first error's), the one that hung (2) and the
    # last one (3)
    tail = files["logs/run-1-attempt-1/worker-0.log"].decode().splitlines()
    assert len(tail) == TAIL_LINES
    total = 600 + 1 + len(OOM)
    assert tail[0].startswith(f"{total - TAIL_LINES + 1} ") and tail[-1].startswith(f"{total} ")
    assert tail[-1].endswith(OOM[-1])
    assert any(line.endswith("using token [redacted] for the hub") for line in tail)
    other = files["logs/run-1-attempt-1/worker-1.log"].decode().splitlines()
    assert other[-1].endswith("| alerts go to https://open.feishu.cn[redacted]")
    assert "logs/run-1-attempt-3/worker-1.log" in names
    assert (
        files["logs/run-1-attempt-3/worker-1.log"].decode().splitlines()[-1].endswith("| exiting")
    )
    hung = files["logs/run-1-attempt-2/worker-0.log"].decode().splitlines()
    assert len(hung) == 1 and hung[0].endswith("| step 600")
    tails = [n for n in names if n.startswith("logs/")]
    assert tails == [  # worker 1 printed nothing in attempt 2
        "logs/run-1-attempt-1/worker-0.log",
        "logs/run-1-attempt-1/worker-1.log",
        "logs/run-1-attempt-2/worker-0.log",
        "logs/run-1-attempt-3/worker-0.log",
        "logs/run-1-attempt-3/worker-1.log",
    ]

    platform = json.loads(files["platform.json"])
    assert platform["runtime"] == "local" and platform["image"] == "pytorch:2.3-cuda12"
    assert platform["pool"]["pool_id"] == "pool-a"
    assert platform["image_catalogue"]["name"] == "pytorch:2.3-cuda12"  # the catalogue's entry
    assert platform["nodes"] == ["pool-a-node-0", "pool-a-node-1"]
    assert platform["runyard"]


async def test_control_characters_are_escaped_in_the_summary(api: Api) -> None:
    task_id = await api.submit(name="evil\x1b[2J\rname")
    answer = await api.bundle("alice", task_id)
    assert answer.status_code == 200, answer.text
    summary = unpack(answer.content)["summary.md"].decode()
    assert "- Name: evil\\x1b[2J\\rname" in summary
    assert "\x1b" not in summary and "\r" not in summary


async def test_other_tenants_get_404_and_sre_reads_every_tenant(api: Api) -> None:
    task_id = await api.submit()
    hidden = await api.bundle("carol", task_id)
    assert hidden.status_code == 404 and hidden.json()["code"] == "task_not_found"
    missing = await api.bundle("alice", "no-such-task")
    assert missing.status_code == 404
    for who in ("bob", "sre"):
        answer = await api.bundle(who, task_id)
        assert answer.status_code == 200, (who, answer.text)
        spec = json.loads(unpack(answer.content)["spec.json"])
        assert {v["name"]: v["value"] for v in spec["env"]}["HF_TOKEN"] == "******"
    unauthenticated = await api.http.get(f"/v1/tasks/{task_id}/bundle")
    assert unauthenticated.status_code == 401


async def test_the_console_task_page_downloads_the_same_bundle(api: Api) -> None:
    """Someone who never opens a terminal saves the bundle from the task's page: the
    same zip as the API's, as the signed-in user (the session's token redacted too);
    another tenant's member gets the 404 page, a signed-out browser the sign-in."""
    task_id = await api.submit()

    async def signed_in(client: httpx.AsyncClient, who: str) -> httpx.AsyncClient:
        answer = await client.post("/console/sign-in", data={"token": api.tokens[who]})
        assert answer.status_code == 303
        return client

    async with httpx.AsyncClient(transport=api.http._transport, base_url="http://gw") as alice:
        await signed_in(alice, "alice")
        page = (await alice.get(f"/console/tasks/{task_id}")).text
        assert f'href="/console/tasks/{task_id}/bundle"' in page
        answer = await alice.get(f"/console/tasks/{task_id}/bundle")
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == "application/zip"
        assert f"runyard-bundle-{task_id}.zip" in answer.headers["content-disposition"]
        members = unpack(answer.content)
        assert task_id in members["summary.md"].decode()
        spec = json.loads(members["spec.json"])
        assert {v["name"]: v["value"] for v in spec["env"]}["HF_TOKEN"] == "******"
        assert all(api.tokens["alice"].encode() not in body for body in members.values())
        assert set(members) == set(unpack((await api.bundle("alice", task_id)).content))
    async with httpx.AsyncClient(transport=api.http._transport, base_url="http://gw") as carol:
        await signed_in(carol, "carol")
        other = await carol.get(f"/console/tasks/{task_id}/bundle")
        assert other.status_code == 404 and "task_not_found" in other.text
    async with httpx.AsyncClient(transport=api.http._transport, base_url="http://gw") as nobody:
        assert (await nobody.get(f"/console/tasks/{task_id}/bundle")).status_code == 303


async def test_a_secret_the_redaction_cannot_reach_refuses_the_bundle(api: Api) -> None:
    """A value redaction cannot touch (a number in the events equal to the secret) is
    found by the scan of the finished archive: the bundle is refused, nothing sent."""
    number = "7340032917"
    task_id = await api.submit(env=f"HF_TOKEN={number}")
    meta = Metadata(actor="service:deployer")
    stream = f"task-{task_id}"
    now = datetime.now(UTC)
    placed = TaskPlaced(
        run=1,
        attempt=1,
        pool="pool-a",
        workers=(
            WorkerPlacement(index=0, node="n-0", gpus=(0,)),
            WorkerPlacement(index=1, node="n-1", gpus=(0,)),
        ),
    )
    await api.gateway.store.append(stream, [NewEvent(placed, meta, now)], 1)
    started = DeployStageStarted(run=1, attempt=1, stage="image_pull")
    done = DeployStageCompleted(run=1, attempt=1, stage="image_pull", duration_ms=int(number))
    await api.gateway.store.append(
        stream, [NewEvent(started, meta, now), NewEvent(done, meta, now)], 2
    )
    answer = await api.bundle("alice", task_id)
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert body["code"] == "bundle.secret_found"
    assert "nothing was written" in body["message"] and body["hint"]


async def placed_task(api: Api) -> str:
    """A submitted task whose first attempt was placed (two workers)."""
    task_id = await api.submit()
    placed = TaskPlaced(
        run=1,
        attempt=1,
        pool="pool-a",
        workers=tuple(WorkerPlacement(index=i, node=f"n-{i}", gpus=(0,)) for i in range(2)),
    )
    meta = Metadata(actor="service:scheduler")
    await api.gateway.store.append(
        f"task-{task_id}", [NewEvent(placed, meta, datetime.now(UTC))], 1
    )
    return task_id


async def test_tails_over_the_budget_are_named_not_written(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_id = await placed_task(api)
    t0 = datetime.now(UTC) - timedelta(minutes=5)
    for worker in range(3):
        await api.print_lines(task_id, 1, worker, [f"w{worker} line {i}" for i in range(10)], t0)
    # each tail is 10 lines of 9 bytes, plus the number, time and stream of each
    monkeypatch.setattr(bundle, "MAX_TAIL_BYTES", 2 * 10 * (9 + bundle.TAIL_LINE_OVERHEAD))
    answer = await api.bundle("alice", task_id)
    assert answer.status_code == 200, answer.text
    files = unpack(answer.content)
    tails = sorted(n for n in files if n.startswith("logs/"))
    assert tails == [f"logs/run-1-attempt-1/worker-{w}.log" for w in (0, 1)]
    summary = files["summary.md"].decode()
    assert "- run 1 attempt 1 worker 2: no tail (the tails are over" in summary


async def test_a_bundle_over_the_size_limit_is_refused(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_id = await placed_task(api)
    monkeypatch.setattr(bundle, "MAX_BUNDLE_BYTES", 2048)
    answer = await api.bundle("alice", task_id)
    assert answer.status_code == 422, answer.text
    assert answer.json()["code"] == "bundle.too_large"


async def test_a_big_task_fits_the_limit(api: Api) -> None:
    """100,000 log lines and 20,000 events, written straight into the tables."""
    task_id = await api.submit()
    stream = f"task-{task_id}"
    placed = TaskPlaced(
        run=1,
        attempt=1,
        pool="pool-a",
        workers=tuple(WorkerPlacement(index=i, node=f"n-{i}", gpus=(0,)) for i in range(2)),
    )
    meta = Metadata(actor="service:notification", causation_id="c", correlation_id="r")
    now = datetime.now(UTC)
    await api.gateway.store.append(stream, [NewEvent(placed, meta, now)], 1)
    version = 2
    for _ in range(20):
        alerts = [
            NewEvent(
                AlertDelivered(alert=f"slowdown {i}", channel="feishu:sub-1", attempt=1), meta, now
            )
            for i in range(1000)
        ]
        await api.gateway.store.append(stream, alerts, version)
        version += len(alerts)
    start = datetime.now(UTC) - timedelta(hours=1)
    await api.logs.ensure_partitions({start.date(), (start + timedelta(hours=1)).date()})
    await api.gateway.db.execute(
        """INSERT INTO log_lines (at, task_id, run, attempt, worker, stream, seq, dedupe, line)
           SELECT $2::timestamptz + n * interval '1 millisecond', $1, 1, 1, n % 4, 'stdout',
                  n / 4, gen_random_uuid(), 'step ' || n || ' loss=' || (n % 97) || ' tok/s=912'
           FROM generate_series(0, 99999) AS n""",
        task_id,
        start,
    )

    answer = await api.bundle("alice", task_id)
    assert answer.status_code == 200, answer.text
    body = answer.content
    assert len(body) == int(answer.headers["content-length"]) <= MAX_BUNDLE_BYTES
    files = unpack(body)
    assert len(files["events.jsonl"].splitlines()) == 20_002
    for worker in range(4):
        tail = files[f"logs/run-1-attempt-1/worker-{worker}.log"].decode().splitlines()
        assert len(tail) == TAIL_LINES
        assert tail[0].startswith(f"{25_000 - TAIL_LINES + 1} ")
        assert tail[-1].startswith("25000 ")
        assert tail[-1].endswith(f"step {99_996 + worker} loss={(99_996 + worker) % 97} tok/s=912")
    assert "events.jsonl: 20002 events" in files["summary.md"].decode()


# --- the command line ---------------------------------------------------------------


@pytest.fixture
async def served(api: Api) -> AsyncIterator[str]:
    async with serving("gateway", api.app, {}) as url:
        yield url


async def test_cli_writes_the_bundle(
    api: Api, served: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_id = await crashed_hung_failed(api)
    target = tmp_path / "out" / "b.zip"
    target.parent.mkdir()
    done = await cli(served, api.tokens["alice"], "bundle", task_id, "-o", str(target), "--json")
    assert done.exit_code == 0, done.output
    answer = json.loads(done.stdout)
    assert answer == {"path": str(target.resolve()), "bytes": target.stat().st_size}
    assert "gathering the bundle" in done.stderr
    files = unpack(target.read_bytes())
    assert "torch.OutOfMemoryError" in files["summary.md"].decode()
    assert not list(target.parent.glob("*.part"))

    monkeypatch.chdir(tmp_path)
    plain = await cli(served, api.tokens["alice"], "bundle", task_id)
    assert plain.exit_code == 0, plain.output
    assert (tmp_path / f"runyard-bundle-{task_id}.zip").is_file()
    assert f"runyard-bundle-{task_id}.zip" in plain.stdout

    refused = await cli(served, api.tokens["carol"], "bundle", task_id, "-o", str(tmp_path / "c"))
    assert refused.exit_code == 1
    assert "task_not_found" in refused.stderr
    assert not (tmp_path / "c").exists() and not (tmp_path / "c.part").exists()

    missing = tmp_path / "no-such-folder" / "b.zip"
    bad = await cli(served, api.tokens["alice"], "bundle", task_id, "-o", str(missing))
    assert bad.exit_code == 2, bad.output
    assert f"error: cannot write {missing}: " in bad.stderr
    assert "gathering the bundle" not in bad.stderr  # refused before the gateway is asked
