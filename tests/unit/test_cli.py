"""The `runyard` CLI against a real gateway (uvicorn on a free port, real Postgres)."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import uvicorn
from runyard.api.auth import create_token
from runyard.cli.main import DEFAULT_URL, app, config_dir, make_client, print_task, token_files
from runyard.contracts import Event, Metadata, NewEvent, default_mapper
from runyard.contracts.task_events import DEPLOY_STAGES, TaskPlaced, WorkerPlacement
from runyard.domain.task import (
    Command,
    CompleteStage,
    ExitWorker,
    StartStage,
    StartWorker,
    decide,
    evolve,
    fold,
)
from runyard.eventstore import PostgresEventStore
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app
from runyard.stack.ports import free_port
from typer.testing import CliRunner, Result

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Served:
    url: str
    token: str
    gateway: Gateway


@pytest.fixture
async def served(served_gateway: Served) -> tuple[str, str]:
    """A gateway over the repo's config on a free port: (url, alice's token)."""
    return served_gateway.url, served_gateway.token


@pytest.fixture
async def served_gateway(dsn: str) -> AsyncIterator[Served]:
    """A gateway over the repo's config on a free port, with alice's token and its store;
    the log service and the scheduler's HTTP face answer beside it (their routes)."""
    from runyard.eventstore import PostgresEventStore
    from runyard.scheduler.http import http_app

    from tests.integration.test_gateway_routing import log_service, serving

    endpoints: dict[str, str] = {}
    scheduler_store = await PostgresEventStore.connect(dsn, default_mapper())
    scheduler = http_app(scheduler_store, role=lambda: "active")
    async with (
        log_service(dsn, Path(tempfile.mkdtemp(prefix="runyard-cli-exports-")), endpoints),
        serving("scheduler", scheduler, endpoints),
    ):
        gateway = await Gateway.connect(dsn, REPO / "infra/config", endpoints=endpoints)
        token = await create_token(gateway.db, "t1", "alice", "member")
        port = free_port()
        app = create_app(gateway, endpoints)
        config = uvicorn.Config(app, port=port, log_level="warning", lifespan="off")
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        for _ in range(500):
            if server.started:
                break
            await asyncio.sleep(0.02)
        yield Served(f"http://127.0.0.1:{port}", token, gateway)
        server.should_exit = True
        await task
        await app.state.owners.aclose()
        await gateway.close()
    await scheduler_store.close()


#: No user config folder: a token saved by `runyard login` on this machine is not used.
NO_CONFIG = "/nonexistent/runyard-tests"


async def cli(
    url: str, token: str | None, *args: str, env: dict[str, str] | None = None, stdin: str = ""
) -> Result:
    base = {"RUNYARD_URL": url, "RUNYARD_TOKEN": token or "", "XDG_CONFIG_HOME": NO_CONFIG}
    return await asyncio.to_thread(
        CliRunner().invoke, app, list(args), env={**base, **(env or {})}, input=stdin
    )


async def test_submit_then_events_show_actor_and_correlation(served: tuple[str, str]) -> None:
    url, token = served
    submitted = await cli(url, token, "submit", "-f", str(REPO / "examples/hello.yaml"), "--json")
    assert submitted.exit_code == 0, submitted.output
    task_id = json.loads(submitted.stdout)["task_id"]
    timeline = await cli(url, token, "events", task_id, "--json")
    assert timeline.exit_code == 0, timeline.output
    first = json.loads(timeline.stdout)[0]
    assert (first["type"], first["actor"]) == ("TaskSubmitted", "user:t1/alice")
    assert first["correlation_id"]
    table = await cli(url, token, "events", task_id)
    assert "TaskSubmitted" in table.stdout and first["correlation_id"] in table.stdout
    shown = await cli(url, token, "show", task_id)
    assert "status=new" in shown.stdout
    stopped = await cli(url, token, "stop", task_id)
    assert "status=stopped" in stopped.stdout
    watched = await cli(url, token, "watch", task_id)
    assert watched.exit_code == 0 and "TaskStopped" in watched.stdout
    listed = await cli(url, token, "ls", "--json")
    assert [t["task_id"] for t in json.loads(listed.stdout)["items"]] == [task_id]


async def test_set_changes_fields_of_a_submission_and_a_clone(served: tuple[str, str]) -> None:
    url, token = served
    hello = str(REPO / "examples/hello.yaml")
    sets = ["--set", "worker_count=2", "--set", "framework=pytorch_ddp"]
    sets += ["--set", "command=echo rank $RANK: ok", "--set", "fault_tolerance.max_restarts=1"]
    submitted = await cli(url, token, "submit", "-f", hello, *sets, "--json")
    assert submitted.exit_code == 0, submitted.output
    spec = json.loads(submitted.stdout)["spec"]
    assert (spec["worker_count"], spec["framework"]) == (2, "pytorch_ddp")
    assert spec["command"] == "echo rank $RANK: ok"
    assert spec["fault_tolerance"]["max_restarts"] == 1

    task_id = json.loads(submitted.stdout)["task_id"]
    nested = ["--set", "fault_tolerance.auto_restart=true", "--set", "tags=[a, b]"]
    cloned = await cli(url, token, "clone", task_id, *nested, "--json")
    assert cloned.exit_code == 0, cloned.output
    spec = json.loads(cloned.stdout)["spec"]
    assert spec["fault_tolerance"]["auto_restart"] is True
    assert spec["fault_tolerance"]["max_restarts"] == 1  # the task's, kept
    assert spec["tags"] == ["a", "b"] and spec["worker_count"] == 2

    refused = await cli(url, token, "clone", task_id, "--set", "pool")
    assert refused.exit_code == 2
    assert "--set pool: expected FIELD=VALUE" in refused.output and "hint:" in refused.output


async def test_an_sre_lists_another_tenants_tasks_and_groups(served_gateway: Served) -> None:
    url, token = served_gateway.url, served_gateway.token
    hello = str(REPO / "examples/hello.yaml")
    submitted = await cli(url, token, "submit", "-f", hello, "--json")
    task_id = json.loads(submitted.stdout)["task_id"]
    sre = await create_token(served_gateway.gateway.db, "ops", "sam", "sre")
    listed = await cli(url, sre, "ls", "--tenant", "t1", "--json")
    assert listed.exit_code == 0, listed.output
    assert [t["task_id"] for t in json.loads(listed.stdout)["items"]] == [task_id]
    own = await cli(url, sre, "ls", "--json")
    assert json.loads(own.stdout)["items"] == []
    groups = await cli(url, sre, "group", "ls", "--tenant", "t1", "--json")
    assert groups.exit_code == 0 and json.loads(groups.stdout)["items"] == [], groups.output
    refused = await cli(url, token, "ls", "--tenant", "ops")
    assert refused.exit_code == 3, refused.output  # not allowed


async def test_refusals_print_the_hint_with_exit_codes(served: tuple[str, str]) -> None:
    url, token = served
    submitted = await cli(url, token, "submit", "-f", str(REPO / "examples/hello.yaml"), "--json")
    task_id = json.loads(submitted.stdout)["task_id"]
    await cli(url, token, "stop", task_id)
    refused = await cli(url, token, "rerun", task_id, "--image", "nope:1")
    assert refused.exit_code == 1
    assert "image.not_found" in refused.stderr and "hint:" in refused.stderr
    rerun = await cli(url, token, "rerun", task_id, "--command", "echo again", "--json")
    assert json.loads(rerun.stdout)["run"] == 2
    assert (await cli(url, None, "ls")).exit_code == 3
    assert (await cli(url, "wrong", "ls")).exit_code == 3
    assert (await cli(f"http://127.0.0.1:{free_port()}", token, "ls")).exit_code == 4
    assert (await cli(url, token, "show", "nope")).exit_code == 1


async def test_with_json_a_refusal_is_the_apis_error_object_on_stdout(
    served: tuple[str, str],
) -> None:
    """A script that asked for `--json` reads a refusal as JSON too, with the same
    exit codes: the API's error object (code, field, message, hint)."""
    url, token = served
    missing = await cli(url, token, "show", "0" * 32, "--json")
    assert missing.exit_code == 1, missing.output
    error = json.loads(missing.stdout)
    assert error["code"] == "task_not_found" and error["field"] == "task_id"
    assert "runyard ls" in error["hint"] and "0" * 32 in error["message"]
    assert "error" not in missing.stderr
    denied = await cli(url, "wrong", "ls", "--json")
    assert denied.exit_code == 3 and json.loads(denied.stdout)["code"].startswith("auth."), (
        denied.output
    )
    away = await cli(f"http://127.0.0.1:{free_port()}", token, "ls", "--json")
    assert away.exit_code == 4 and json.loads(away.stdout)["code"] == "client.unreachable"
    assert "runyard up" in json.loads(away.stdout)["hint"]
    plain = await cli(url, token, "show", "0" * 32)  # without --json: text on stderr
    assert plain.stdout == "" and "task_not_found (task_id)" in plain.stderr


async def test_ddp_warnings_pools_capacity_and_groups(served: tuple[str, str]) -> None:
    url, token = served
    ddp = await cli(url, token, "submit", "-f", str(REPO / "examples/ddp.yaml"), "--json")
    assert ddp.exit_code == 0, ddp.output
    assert json.loads(ddp.stdout)["spec"]["env"][1]["value"] == "replace-me"
    pools = await cli(url, token, "pools", "--json")
    assert "dev-a100" in {p["pool_id"] for p in json.loads(pools.stdout)}
    capacity = await cli(url, token, "capacity", "dev-a100")
    assert capacity.exit_code == 0 and "8gpu" in capacity.stdout
    group = await cli(
        url, token, "group", "create", "-f", str(REPO / "examples/group.yaml"), "--json"
    )
    assert group.exit_code == 0, group.output
    group_id = json.loads(group.stdout)["group_id"]
    listed = await cli(url, token, "group", "ls", group_id)
    assert "sweep-lr-0.01" in listed.stdout and "new: 2" in listed.stdout


# --- show: attempts and counters ---------------------------------------------------------


async def drive(store: PostgresEventStore, task_id: str, *commands: Command) -> None:
    """Decide and append as the platform's services would (no service runs here)."""
    events = await store.read_stream(f"task-{task_id}")
    state = fold(events, task_id=task_id)
    now = datetime.now(UTC)
    new: list[Event] = []
    for command in commands:
        for event in decide(state, command, now=now, ids=lambda: "x"):
            state = evolve(state, (event, now))
            new.append(event)
    meta = Metadata(actor="service:test")
    await store.append(f"task-{task_id}", [NewEvent(e, meta, now) for e in new], len(events))


async def start_attempt(store: PostgresEventStore, task_id: str, attempt: int) -> None:
    stages = [c for s in DEPLOY_STAGES for c in (StartStage(task_id, s), CompleteStage(task_id, s))]
    await drive(store, task_id, *stages, StartWorker(task_id, 1, attempt, 0))


async def test_show_prints_the_attempt_counters_and_stages_of_each_attempt(
    served_gateway: Served, tmp_path: Path
) -> None:
    url, token, store = served_gateway.url, served_gateway.token, served_gateway.gateway.store
    spec = tmp_path / "restart.yaml"
    spec.write_text(
        (REPO / "examples/hello.yaml").read_text()
        + "fault_tolerance: {auto_restart: true, max_restarts: 2}\n"
    )
    submitted = await cli(url, token, "submit", "-f", str(spec), "--json")
    assert submitted.exit_code == 0, submitted.output
    task_id = json.loads(submitted.stdout)["task_id"]
    placed = TaskPlaced(
        run=1, attempt=1, pool="dev-a100", workers=(WorkerPlacement(index=0, node="n", gpus=(0,)),)
    )
    version = await store.stream_version(f"task-{task_id}")
    meta = Metadata(actor="service:test")
    await store.append(f"task-{task_id}", [NewEvent(placed, meta, datetime.now(UTC))], version)
    await start_attempt(store, task_id, 1)
    await drive(store, task_id, ExitWorker(task_id, 1, 1, 0, 1))  # fails: restart as attempt 2
    await start_attempt(store, task_id, 2)

    shown = await cli(url, token, "show", task_id)
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert "status=running  run=1  attempt=2" in lines[0]
    assert lines[1] == (
        "this run: restarts=1/2 reschedules=0 requeues=0 preemptions=0 hangs=0 slowdowns=0"
    )
    header = lines.index("run\tattempt\tstage\tresult\tstarted\tduration ms\treason")
    rows = [line.split("\t") for line in lines[header + 1 :]]
    per_attempt = [(r[0], r[1], r[2], r[3]) for r in rows]
    assert per_attempt == [
        ("1", str(attempt), stage, "completed") for attempt in (1, 2) for stage in DEPLOY_STAGES
    ]


async def test_diff_prints_only_what_differs_and_names_unset_values(
    served_gateway: Served,
) -> None:
    """`runyard diff` across a placement: no row whose two sides are the same (no
    `null null`), a value absent on one side is `(unset)`; `--json` is the API's answer."""
    url, token, store = served_gateway.url, served_gateway.token, served_gateway.gateway.store
    submitted = await cli(url, token, "submit", "-f", str(REPO / "examples/hello.yaml"), "--json")
    assert submitted.exit_code == 0, submitted.output
    task_id = json.loads(submitted.stdout)["task_id"]
    stream = f"task-{task_id}"
    placed = TaskPlaced(
        run=1, attempt=1, pool="dev-a100", workers=(WorkerPlacement(index=0, node="n", gpus=(0,)),)
    )
    version = await store.stream_version(stream)
    meta = Metadata(actor="service:test")
    await store.append(stream, [NewEvent(placed, meta, datetime.now(UTC))], version)
    positions = [e.global_position for e in await store.read_stream(stream)]
    between = ("diff", task_id, "--from", str(positions[0]), "--to", str(positions[-1]))

    piped = await cli(url, token, *between)
    assert piped.exit_code == 0, piped.output
    lines = piped.stdout.splitlines()
    header = lines.index("field\tfrom\tto")
    end = next(i for i in range(header + 1, len(lines)) if lines[i].count("\t") != 2)
    rows = [line.split("\t") for line in lines[header + 1 : end]]
    assert rows and all(len(r) == 3 and r[1] != r[2] for r in rows), rows
    fields = {r[0]: (r[1], r[2]) for r in rows}
    assert fields["placement.pool"] == ("(unset)", "dev-a100"), fields
    assert fields["placement.workers.0.node"] == ("(unset)", "n"), fields
    assert "placement" not in fields and "null" not in piped.stdout, piped.stdout

    as_json = await cli(url, token, *between, "--json")
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
        answer = await http.get(
            f"{url}/v1/tasks/{task_id}/replay/diff",
            params={"from": positions[0], "to": positions[-1]},
        )
    assert json.loads(as_json.stdout) == answer.json()


async def test_an_unknown_image_offers_the_closest_and_images_lists_them(
    served: tuple[str, str], tmp_path: Path
) -> None:
    """`image.not_found` names the zone's closest training images and `runyard images
    --zone Z`, which lists the zone's images (whole lines on a pipe, or --json)."""
    url, token = served
    spec = tmp_path / "typo.yaml"
    hello = (REPO / "examples/hello.yaml").read_text()
    spec.write_text(hello.replace("image: pytorch:2.3-cuda12", "image: pytorch:2.3-cuda13"))
    refused = await cli(url, token, "submit", "-f", str(spec))
    assert refused.exit_code == 1 and "image.not_found" in refused.stderr, refused.output
    hint = " ".join(refused.stderr.split())
    assert "closest to it: pytorch:2.3-cuda12, pytorch:2.1-cuda11, bash-only;" in hint, hint
    zone = hint.split("`runyard images --zone ")[1].split("`")[0]

    listed = await cli(url, token, "images", "--zone", zone)
    assert listed.exit_code == 0, listed.output
    assert "pytorch:2.3-cuda12\tcn-north-1\ttraining, dev_machine" in listed.stdout.splitlines()
    as_json = await cli(url, token, "images", "--zone", "cn-east-1", "--json")
    assert [i["name"] for i in json.loads(as_json.stdout)] == ["pytorch:2.1-cuda11", "bash-only"]


@pytest.mark.parametrize(
    ("fault_tolerance", "last"),
    [
        ({"auto_restart": True, "max_restarts": 2}, "slowdowns=0"),
        ({"auto_restart": False, "max_restarts": 2}, "slowdowns=0 auto_restart=off"),
        ({}, "slowdowns=0 auto_restart=off"),
    ],
)
def test_show_says_when_auto_restart_is_off(
    fault_tolerance: dict[str, object], last: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """With auto restart off the restart limit does not restart a crash: `show` says so."""
    spec = {"pool": "dev-a100", "fault_tolerance": fault_tolerance}
    task = {"task_id": "t", "name": "n", "status": "running", "run": 1, "creator": "alice"}
    print_task({**task, "spec": spec, "counters": {"restarts": 0}, "stages": []})
    counters = capsys.readouterr().out.splitlines()[1]
    assert counters.startswith("this run: restarts=0") and counters.endswith(last), counters


@pytest.mark.parametrize(
    ("status", "line"),
    [
        ("stopped", "stop: stopped by bob (member)"),
        ("running", "stop: requested (stopped by bob (member)); ending its workers"),
    ],
)
def test_show_tells_a_stop_asked_from_a_stop_done(
    status: str, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    task = {"task_id": "t", "name": "n", "status": status, "run": 1, "creator": "alice"}
    task |= {"spec": {"pool": "p"}, "stop_reason": "stopped by bob (member)", "stages": []}
    print_task(task)
    assert line in capsys.readouterr().out.splitlines()


# --- the token: login, config folder, precedence ----------------------------------------


async def test_login_checks_the_token_then_saves_it_for_the_owner_only(
    served: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, token = served
    monkeypatch.chdir(tmp_path)  # no ./.runyard/token here
    config = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    saved = tmp_path / "config/runyard/token"

    refused = await cli(url, None, "login", env=config, stdin="ry_not-a-token\n")
    assert refused.exit_code == 3 and not saved.exists()
    assert (await cli(url, None, "login", env=config, stdin="\n")).exit_code == 2
    assert (await cli(url, None, "ls", env=config)).exit_code == 3

    logged_in = await cli(url, None, "login", env=config, stdin=f"{token}\n")
    assert logged_in.exit_code == 0, logged_in.output
    assert saved.read_text() == f"{token}\n"
    assert saved.stat().st_mode & 0o777 == 0o600
    assert saved.parent.stat().st_mode & 0o777 == 0o700
    assert token not in logged_in.output
    assert (await cli(url, None, "ls", env=config)).exit_code == 0

    (tmp_path / ".runyard").mkdir()
    (tmp_path / ".runyard/token").write_text("ry_stale-dev-token\n")
    assert (await cli(url, None, "ls", env=config)).exit_code == 3  # ./.runyard/token first
    assert (await cli(url, token, "ls", env=config)).exit_code == 0  # RUNYARD_TOKEN before it
    again = await cli(url, None, "login", env=config, stdin=f"{token}\n")
    assert "note: .runyard/token (in this folder) comes first" in again.stdout


def test_the_config_folder_follows_xdg_and_ignores_a_relative_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert config_dir() == tmp_path / "runyard"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")
    assert config_dir() == Path.home() / ".config/runyard"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert config_dir() == Path.home() / ".config/runyard"
    assert token_files() == [Path(".runyard/token"), Path.home() / ".config/runyard/token"]


# --- show: where a queued task waits, who stopped it -----------------------------------------


async def test_show_prints_the_queue_place_from_the_scheduler_and_who_stopped(
    served_gateway: Served,
) -> None:
    from runyard.scheduler.app import SchedulerApp
    from runyard.scheduler.config import load_pools_file

    url, token, store = served_gateway.url, served_gateway.token, served_gateway.gateway.store
    scheduler = SchedulerApp(store, load_pools_file(REPO / "infra/config/pools.yaml"))
    await scheduler.start()
    for n in range(4):  # nothing can start: every task waits
        await scheduler.cordon_node("dev-a100", f"dev-a100-node-{n}")
    hello = str(REPO / "examples/hello.yaml")
    ids = []
    for _ in range(2):
        submitted = await cli(url, token, "submit", "-f", hello, "--json")
        ids.append(json.loads(submitted.stdout)["task_id"])
        for event in await store.read_stream(f"task-{ids[-1]}"):
            await scheduler.handle(event)

    shown = await cli(url, token, "show", ids[1])
    queued = next(line for line in shown.stdout.splitlines() if line.startswith("queued: "))
    assert queued.endswith("; 1 task ahead (position 1)"), queued
    assert "even if idle" in queued

    bob = await create_token(served_gateway.gateway.db, "t1", "bob", "member")
    assert (await cli(url, bob, "stop", ids[0])).exit_code == 0
    for event in await store.read_stream(f"task-{ids[0]}"):
        await scheduler.handle(event)
    stopped = await cli(url, token, "show", ids[0])
    assert "stop: stopped by bob (member)" in stopped.stdout.splitlines()
    moved = await cli(url, token, "show", ids[1])
    assert "; first in queue (position 0)" in moved.stdout


@pytest.mark.parametrize("module", ["audit", "deadletters", "projections", "whatif", "trace"])
def test_any_module_of_the_cli_may_be_imported_first(module: str) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", f"import runyard.cli.{module}"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


async def test_stacks_json_of_a_task_without_reports_prints_the_empty_list(dsn: str) -> None:
    """`runyard stacks ID --json` prints JSON also when the task has no report yet (as
    `runyard ls --json` of no tasks): the API's answer, exit status 0; the text form
    still says so with a hint and exits 1."""
    from runyard.api.security import TokenAuthenticator
    from runyard.api.service import service_app
    from runyard.faulttolerance.app import FaultToleranceApp
    from runyard.faulttolerance.http import faulttolerance_router
    from runyard.faulttolerance.reports import StackReportStore
    from runyard.stack.serve import migrate_service

    from tests.integration.test_faulttolerance_service import (
        Clock,
        CommandsToDeployer,
        Harness,
        spec,
    )
    from tests.integration.test_gateway_routing import serving

    await migrate_service("gateway", dsn, grants=False)  # the tokens table
    store = await PostgresEventStore.connect(dsn, default_mapper())
    try:
        token = await create_token(store.pool, "acme", "alice", "member")
        reports = StackReportStore(store.pool)
        await reports.migrate()
        clock = Clock()
        ft = FaultToleranceApp(
            store, reports=reports, deployer=CommandsToDeployer(store), clock=clock
        )
        await Harness(store, ft, clock, reports).launch("quiet", spec())
        router = faulttolerance_router(ft, reports, TokenAuthenticator(store.pool))
        face = service_app("faulttolerance", routers=[router])
        async with serving("faulttolerance", face, {}) as url:
            as_json = await cli(url, token, "stacks", "quiet", "--json")
            assert as_json.exit_code == 0, as_json.output
            assert json.loads(as_json.stdout) == {"task_id": "quiet", "reports": []}
            text = await cli(url, token, "stacks", "quiet")
            assert text.exit_code == 1 and "no stack report" in text.stderr
            missing = await cli(url, token, "stacks", "nope", "--json")
            assert missing.exit_code == 1 and json.loads(missing.stdout)["code"] == "task_not_found"
        await ft.drain()
    finally:
        await store.close()


async def test_an_unreachable_gateway_is_named_and_an_empty_url_is_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A mistyped URL shows in the error; `RUNYARD_URL=` (set, empty) is the default
    gateway, not a URL without a scheme."""
    away = f"http://127.0.0.1:{free_port()}"
    refused = await cli(away, "a-token", "ls")
    assert refused.exit_code == 4
    assert f"cannot reach the gateway at {away}: ConnectError" in refused.stderr
    monkeypatch.setenv("RUNYARD_URL", "")
    with make_client(None, "a-token") as http:
        assert str(http.base_url).rstrip("/") == DEFAULT_URL


async def test_an_id_pasted_with_a_hash_or_a_query_is_that_id_not_another_route(
    served: tuple[str, str],
) -> None:
    """`ID#` or `ID?run=1` (from a link, a chat) is sent as one path segment: each command
    says that task does not exist, none reads another route's answer as its own."""
    url, token = served
    submitted = await cli(url, token, "submit", "-f", str(REPO / "examples/hello.yaml"), "--json")
    task_id = json.loads(submitted.stdout)["task_id"]
    for odd in (f"{task_id}#", f"{task_id}?run=1"):
        for args in (
            ["logs", odd],
            ["trace", odd],
            ["diff", odd, "--from", "1", "--to", "1"],
            ["show", odd, "--at", "1"],
            ["watch", odd],
        ):
            result = await cli(url, token, *args)
            assert result.exit_code == 1, (args, result.output)
            assert f"task '{odd}' does not exist" in result.stderr, (args, result.output)


async def test_an_id_with_a_percent_or_dots_is_that_id_and_one_with_a_slash_is_refused(
    served: tuple[str, str],
) -> None:
    """`a%2Fb` is sent as itself (`a%252Fb`), to the gateway and through it to the log
    service, which read it as that id (it reached the log service as `a/b`, another
    route); `.` and `..` are ids too, not the path's dot segments (`show .` read the task
    list as a task: a traceback). A `/` cannot be sent in a path (the gateway reads
    `%2F` as one): refused before anything is sent, exit 2, not another route's answer."""
    url, token = served
    submitted = await cli(url, token, "submit", "-f", str(REPO / "examples/hello.yaml"), "--json")
    task_id = json.loads(submitted.stdout)["task_id"]
    commands = (
        ["show"], ["events"], ["stop"], ["logs"], ["logs", "--first-error"], ["trace"],
        ["watch"], ["show", "--at", "1"], ["rerun"], ["clone"],
    )  # fmt: skip
    for odd in ("a%2Fb", f"{task_id}%2Fevents", "%2e%2e", "a%25b", ".", ".."):
        for command, *options in commands:
            result = await cli(url, token, command, odd, *options)
            assert result.exit_code == 1, (command, odd, result.output)
            assert f"task '{odd}' does not exist" in result.stderr, (command, odd, result.output)
    for odd in (f"{task_id}/events", "a/b", f"x/../{task_id}"):
        for command, *options in (*commands, ["group", "show"], ["capacity"]):
            args = [command, *options[:1], odd, *options[1:]] if command == "group" else None
            result = await cli(url, token, *(args or [command, odd, *options]))
            assert result.exit_code == 2, (command, odd, result.output)
            said = " ".join(result.stderr.split())
            assert f"error client.invalid_id: '{odd}' is no id: an id has no '/'" in said, said


async def test_a_gateway_url_that_is_no_url_is_a_usage_error_not_a_traceback() -> None:
    refused = await cli("http://[::1", "a-token", "ls")
    assert refused.exit_code == 2, refused.output
    assert "the gateway URL 'http://[::1' is not a URL" in refused.stderr


async def test_yes_no_on_off_of_a_task_file_and_a_set_are_text_where_text_goes(
    served: tuple[str, str], tmp_path: Path
) -> None:
    """YAML 1.1 read `value: no` as false and `010` as 8: the gateway refused the env
    value and the tag ("Input should be a valid string"). They are text now; a boolean
    field given `off` or `yes` still gets its boolean, a key `on:` is named as such."""
    url, token = served
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        (REPO / "examples/hello.yaml").read_text()
        + "env:\n  - {name: DEBUG, value: no}\n  - {name: MODE, value: 010}\n"
        + "  - {name: AT, value: 1:30}\n"
        + "description: off\nrdma: off\nfault_tolerance: {auto_restart: yes, env_check: On}\n"
    )
    spec.write_text(spec.read_text().replace("tags: [example]", "tags: [example, on, No]"))
    submitted = await cli(url, token, "submit", "-f", str(spec), "--json")
    assert submitted.exit_code == 0, submitted.output
    task = json.loads(submitted.stdout)["spec"]
    env = {v["name"]: v["value"] for v in task["env"]}
    assert env == {"DEBUG": "no", "MODE": "010", "AT": "1:30"}
    assert task["tags"] == ["example", "on", "No"] and task["description"] == "off"
    assert task["rdma"] is False
    assert task["fault_tolerance"]["auto_restart"] is task["fault_tolerance"]["env_check"] is True

    sets = [
        "--set",
        "description=no",
        "--set",
        "tags=[yes, off]",
        "--set",
        "fault_tolerance.env_check=false",
    ]
    changed = await cli(url, token, "submit", "-f", str(spec), *sets, "--json")
    assert changed.exit_code == 0, changed.output
    task = json.loads(changed.stdout)["spec"]
    assert (task["description"], task["tags"]) == ("no", ["yes", "off"])
    assert task["fault_tolerance"]["env_check"] is False

    spec.write_text(spec.read_text() + "on: push\n")
    refused = await cli(url, token, "submit", "-f", str(spec))
    assert refused.exit_code == 1, refused.output
    assert "spec.unknown_field (on)" in refused.stderr, refused.stderr
