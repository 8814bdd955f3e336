"""End-to-end benchmark: trivial tasks through the whole platform.

Runs what `runyard up` runs (outbox relay, gateway, submission, scheduler,
deployer with the local runtime, fault tolerance, logs, notification) in one
of two layouts, `--layout`: `processes` (the default), every service a child
process as `runyard up` supervises them (`runyard.stack.supervisor`, each on a
free port); `one-process`, all in this process (`runyard.stack.up.run_platform`,
what `--profile` profiles). On the embedded stack: a Postgres with its
default durability (DATABASE_URL, or an embedded one started here in a temp
dir) and a Kafka-compatible broker (KAFKA_BOOTSTRAP_SERVERS, or an embedded
Tansu). The config is infra/config copied to a temp dir plus a bench-only
pool `bench` (zone cn-north-1) with a GPU for every task, so capacity never
queues a task: what is measured is the platform, not the pool size.

N tasks (`true`, 1 GPU, image bash-only) are submitted through the gateway's
HTTP API, `--concurrency` requests in flight, after one warm-up task has run
(consumer groups joined). Every figure comes from the events' `occurred_at`:

- tasks_per_s: N / (first TaskSubmitted -> last TaskSucceeded);
- submit_to_running p50/p99: TaskSubmitted -> TaskRunning per task.

Before the burst, `--idle` tasks (20) run one at a time, each submitted once
the one before succeeded: idle_running and idle_succeeded are the p50s of
TaskSubmitted -> TaskRunning and -> TaskSucceeded, what one user alone sees.

It also prints where the time goes between those events (placement, the four
deploy stages, the worker's run), the HTTP submit rate, the resident memory
of each service process (its peak during the burst, and what it holds after
every 1,000 tasks, so growth with finished tasks shows), and with `--profile`
the top functions of a cProfile of this (single) process.

`--runtime slurm` runs the pool `bench` on a Slurm cluster started here
(`runyard.stack.slurm.SlurmCluster`: a slurmctld and four slurmd of 8 fake
GPUs on this host, root and slurm-wlm needed), its tasks as Slurm jobs of the Slurm runtime. In
the same run, once the platform is stopped, the same number of trivial jobs go
through plain `sbatch --wrap true` on the same cluster (the same GPU request,
`--concurrency` sbatch commands in flight), timed from the first sbatch to the
moment squeue shows none of them pending or running (the cluster keeps no
accounting; a job Slurm forgot is over), after `--idle` of them one at a time.
It prints both rates and Runyard's overhead per task (the difference of the
time per task at those rates, and of the idle p50s).

`--quick` runs n=300 and 10 idle tasks. The last line is exactly
`e2e: tasks=<n> tasks_per_s=<x> submit_to_running_p50_ms=<a>
submit_to_running_p99_ms=<b> idle_running_p50_ms=<c> vs_slurm=<r>
idle_succeeded_p50_ms=<d> cpu_ms_per_task=<m> idle_cores=<i> layout=<layout>`
(one line; `<r>` is Runyard's rate over plain sbatch's with `--runtime slurm`,
`na` with the local runtime). The fields up to `vs_slurm` keep their order;
new ones are only ever added at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import math
import os
import pstats
import shutil
import signal
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import yaml
from bench_db import fresh_database
from runyard.api.auth import create_token
from runyard.contracts import default_mapper
from runyard.eventstore import PostgresEventStore
from runyard.messaging import KafkaSettings, Topics
from runyard.stack.context import ServiceContext
from runyard.stack.embedded import EmbeddedKafka, EmbeddedPostgres
from runyard.stack.mounts import unmount_deployments_under
from runyard.stack.ports import free_port
from runyard.stack.serve import SERVICE_NAMES, load_runner
from runyard.stack.slurm import SlurmCluster, slurm_missing
from runyard.stack.supervisor import service_processes
from runyard.stack.tuning import tune_gc
from runyard.stack.up import run_platform, running, wait_ready

REPO = Path(__file__).resolve().parents[1]
POOL = "bench"
#: The Slurm cluster's nodes (`--runtime slurm`), 8 fake GPUs each (a pool's node has
#: at most 8): 32 trivial tasks at once, Runyard's or sbatch's (GPUs are not shared
#: between jobs, cores are).
SLURM_NODES = ("n1", "n2", "n3", "n4")
#: Slurm job states after which the job holds nothing (squeue's %T).
SLURM_OVER = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL"}


#: How long the platform is watched with no task, for its idle CPU.
IDLE_CPU_S = 10.0


def bench_config(target: Path, gpus: int) -> Path:
    """infra/config plus a pool `bench` of 8-GPU nodes with at least `gpus` GPUs."""
    shutil.copytree(REPO / "infra/config", target)
    pools_file = target / "pools.yaml"
    pools = yaml.safe_load(pools_file.read_text())
    pools["pools"].append(
        {
            "id": POOL,
            "zone": "cn-north-1",
            "resource_type": "subscription",
            "gpu_model": "A100-80G",
            "network": "roce",
            "specs": [{"name": "1gpu", "gpus": 1, "cpus": 12, "memory_gib": 120}],
            "nodes": {"prefix": "bench-node-", "count": math.ceil(gpus / 8), "gpus": 8},
        }
    )
    pools_file.write_text(yaml.safe_dump(pools))
    return target


def slurm_config(target: Path, cluster: SlurmCluster) -> Path:
    """infra/config plus a pool `bench` whose nodes are `cluster`'s, run by the Slurm
    runtime (runtime.yaml `pools.bench.runtime: slurm`)."""
    shutil.copytree(REPO / "infra/config", target)
    cluster.add_pool(target, POOL)
    return target


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))
    return ordered[rank]


@contextlib.contextmanager
def infrastructure(
    keep: bool, pg_settings: dict[str, str]
) -> Iterator[tuple[str, str, int | None]]:
    """(server DSN, bootstrap, the embedded Postgres's postmaster pid): from the
    environment (no pid then), else embedded ones here."""
    root = Path(tempfile.mkdtemp(prefix="runyard-bench-e2e-"))
    os.environ.setdefault("XDG_RUNTIME_DIR", str(root))
    postgres = kafka = None
    try:
        dsn = os.environ.get("DATABASE_URL", "")
        if not dsn:
            settings = {"max_connections": "200", **pg_settings}
            postgres = EmbeddedPostgres(root / "pg", settings=settings)
            postgres.start()
            dsn = postgres.dsn
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
        if not bootstrap:
            kafka = EmbeddedKafka(log_path=root / "tansu.log")
            kafka.start()
            bootstrap = kafka.bootstrap
        yield dsn, bootstrap, postgres.postmaster_pid() if postgres is not None else None
    finally:
        if kafka is not None:
            kafka.stop()
        if postgres is not None:
            postgres.stop()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


async def top_statements(db: asyncpg.Pool, limit: int = 15) -> None:
    """With `--statements`: the SQL that took the database's time during the burst."""
    rows = await db.fetch(
        """SELECT calls, total_exec_time AS ms, rows,
                  left(regexp_replace(query, '\\s+', ' ', 'g'), 90) AS q
           FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database
                                                  WHERE datname = current_database())
           ORDER BY total_exec_time DESC LIMIT $1""",
        limit,
    )
    print(f"  {'statements (burst)':34} {'calls':>8} {'ms':>8} {'rows':>8}")
    for r in rows:
        print(f"  {r['calls']:>43} {r['ms']:8.0f} {r['rows']:8}  {r['q']}")


def task_body(i: int) -> dict[str, Any]:
    return {
        "name": f"bench-{i}",
        "pool": POOL,
        "worker_spec": "1gpu",
        "image": "bash-only",
        "command": "true",
    }


async def submit(http: httpx.AsyncClient, i: int) -> str:
    answer = await http.post("/v1/tasks", json=task_body(i))
    if answer.status_code != 201:
        raise SystemExit(f"submission {i} refused: {answer.status_code} {answer.text}")
    task_id: str = answer.json()["task_id"]
    return task_id


class Outcomes:
    """The tasks that ended, read as the events are appended: the store's gap-safe
    reader of the whole log (the relay's), from where it last stopped, so the watch
    costs per new event, not per task watched (a query over every watched stream
    each poll cost the database more as the burst grew, beside the platform)."""

    def __init__(self, store: PostgresEventStore) -> None:
        self.reader = store.all_reader(0)
        self.succeeded: set[str] = set()
        self.failed: dict[str, str] = {}  # stream -> event type

    async def update(self) -> None:
        while events := await self.reader.read_stored(1000):
            for e in events:
                if e.event_type == "TaskSucceeded":
                    self.succeeded.add(e.stream_id)
                elif e.event_type in ("TaskFailed", "TaskStopped"):
                    self.failed[e.stream_id] = e.event_type


async def wait_done(
    db: asyncpg.Pool,
    outcomes: Outcomes,
    streams: list[str],
    run: asyncio.Task[None],
    timeout_s: float,
    *,
    quiet: bool = False,
    memory: MemoryWatch | None = None,
) -> None:
    deadline = time.monotonic() + timeout_s
    last_report = time.monotonic()
    pending = set(streams)
    while True:
        if run.done():
            run.result()
            raise SystemExit("the platform stopped during the run")
        await outcomes.update()
        if bad := [s for s in streams if s in outcomes.failed]:
            failed = await db.fetch(
                """SELECT stream_id, data->>'reason' AS reason FROM events
                   WHERE stream_id = ANY($1) AND event_type = 'TaskFailed' LIMIT 3""",
                bad,
            )
            raise SystemExit(f"{len(bad)} tasks did not succeed, e.g. {[dict(r) for r in failed]}")
        pending -= outcomes.succeeded
        ok = len(streams) - len(pending)
        if memory is not None:
            memory.sample(ok, last=not pending)
        if not pending:
            return
        now = time.monotonic()
        if now > deadline:
            raise SystemExit(f"only {ok} of {len(streams)} tasks succeeded in {timeout_s}s")
        if now - last_report > 5 and not quiet:
            print(f"  ... {ok} of {len(streams)} succeeded", flush=True)
            last_report = now
        await asyncio.sleep(0.05)


async def timeline(db: asyncpg.Pool, streams: list[str]) -> dict[str, dict[str, float]]:
    """Per task: seconds since the epoch of the first event of each type that matters."""
    rows = await db.fetch(
        """SELECT stream_id, event_type, data->>'stage' AS stage,
                  min(extract(epoch FROM occurred_at))::float8 AS at
           FROM events
           WHERE stream_id = ANY($1) AND event_type IN (
               'TaskSubmitted', 'TaskPlaced', 'DeployStageStarted', 'DeployStageCompleted',
               'WorkerStarted', 'TaskRunning', 'WorkerExited', 'TaskSucceeded')
           GROUP BY stream_id, event_type, data->>'stage'""",
        streams,
    )
    out: dict[str, dict[str, float]] = {s: {} for s in streams}
    for r in rows:
        key = r["event_type"] + (f":{r['stage']}" if r["stage"] else "")
        out[r["stream_id"]][key] = r["at"]
    return out


async def consumer_lag(db: asyncpg.Pool, streams: list[str]) -> None:
    """Per consumer: event recorded -> its inbox row (the consumer's transaction began)."""
    rows = await db.fetch(
        """SELECT i.consumer,
                  count(*) AS events,
                  percentile_cont(0.5) WITHIN GROUP (ORDER BY
                      extract(epoch FROM i.processed_at - e.recorded_at)) * 1000 AS p50,
                  percentile_cont(0.99) WITHIN GROUP (ORDER BY
                      extract(epoch FROM i.processed_at - e.recorded_at)) * 1000 AS p99
           FROM inbox i JOIN events e USING (event_id)
           WHERE e.stream_id = ANY($1)
           GROUP BY i.consumer ORDER BY i.consumer""",
        streams,
    )
    events = await db.fetchval("SELECT count(*) FROM events WHERE stream_id = ANY($1)", streams)
    print(f"  {events} task events ({events / len(streams):.1f} per task); consumer lag")
    print(f"  {'(recorded -> handled, ms)':34} {'p50':>8} {'p99':>8} {'events':>8}")
    for r in rows:
        print(f"  {r['consumer']:34} {r['p50']:8.1f} {r['p99']:8.1f} {r['events']:8}")


def report_breakdown(times: dict[str, dict[str, float]]) -> None:
    steps = [
        ("submitted -> placed", "TaskSubmitted", "TaskPlaced"),
        ("placed -> allocation started", "TaskPlaced", "DeployStageStarted:resource_allocation"),
        (
            "resource_allocation",
            "DeployStageStarted:resource_allocation",
            "DeployStageCompleted:resource_allocation",
        ),
        ("image_pull", "DeployStageStarted:image_pull", "DeployStageCompleted:image_pull"),
        (
            "storage_mount",
            "DeployStageStarted:storage_mount",
            "DeployStageCompleted:storage_mount",
        ),
        ("env_init", "DeployStageStarted:env_init", "DeployStageCompleted:env_init"),
        ("env_init done -> running", "DeployStageCompleted:env_init", "TaskRunning"),
        ("running -> worker exited", "TaskRunning", "WorkerExited"),
        ("worker exited -> succeeded", "WorkerExited", "TaskSucceeded"),
    ]
    print(f"  {'step (ms, per task)':34} {'p50':>8} {'p99':>8} {'mean':>8}")
    for label, a, b in steps:
        spans = [(t[b] - t[a]) * 1000 for t in times.values() if a in t and b in t]
        if spans:
            print(
                f"  {label:34} {percentile(spans, 50):8.1f} {percentile(spans, 99):8.1f}"
                f" {statistics.fmean(spans):8.1f}"
            )


def _rss_kib(pid: int) -> int:
    """Resident memory of a process in KiB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def service_rss(layout: str) -> dict[str, int]:
    """KiB resident per service process: the children this process started
    (`python -m runyard.stack.serve <name>`), or this process in one-process."""
    me = os.getpid()
    if layout != "processes":
        return {"one-process": _rss_kib(me)}
    found: dict[str, int] = {}
    for pid, (ppid, argv, _, _) in _processes().items():
        if ppid == me and b"runyard.stack.serve" in argv:
            name = argv[argv.index(b"runyard.stack.serve") + 1].decode()
            found[name] = found.get(name, 0) + _rss_kib(pid)
    return found


TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[int, list[bytes], int, int]]:
    """pid -> (parent pid, argv, CPU ticks used by the process itself: user + system,
    CPU ticks of its children that ended and were waited for)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            found[int(entry.name)] = (
                int(fields[1]),
                argv,
                int(fields[11]) + int(fields[12]),
                int(fields[13]) + int(fields[14]),
            )
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return found


def cpu_ticks(postmaster: int | None, *, platform_here: bool = False) -> dict[str, int]:
    """CPU ticks used so far by each part of the platform: each service process (or
    this process in one-process), the Postgres server (`postmaster` and its backends),
    the broker and any other process this one started. A service's workers (its
    children, running or ended: the launch wrappers, namespace tools and the tasks'
    own programs) count as `workers`; `platform_here`: the services run in this
    process (one-process), so its ended children are workers too."""
    me = os.getpid()
    table = _processes()
    out: dict[str, int] = {}
    for pid, (_, _, ticks, ended) in table.items():
        chain = [pid]
        while chain[-1] in table and chain[-1] not in (me, postmaster, 0, 1):
            chain.append(table[chain[-1]][0])
        top = chain[-1]
        if top == postmaster:
            part = "postgres"
        elif top != me:
            continue
        elif pid == me:
            part = "this process"
            if platform_here:
                out["workers"] = out.get("workers", 0) + ended
        else:
            child = chain[-2]  # this process's child the process descends from
            argv = table[child][1]
            if b"runyard.stack.serve" in argv:
                name = argv[argv.index(b"runyard.stack.serve") + 1].decode()
                part = name if pid == child else "workers"
                if pid == child:
                    out["workers"] = out.get("workers", 0) + ended
            else:
                part = Path(argv[0].decode(errors="replace")).name if pid == child else "workers"
        out[part] = out.get(part, 0) + ticks
    return out


class CpuWatch:
    """CPU used by each part of the platform between `start` and `stop`."""

    def __init__(self, postmaster: int | None, layout: str) -> None:
        self.postmaster = postmaster
        #: In the processes layout this process is only the client: not the platform's.
        self.client = "this process" if layout == "processes" else None
        self._from: dict[str, int] = {}
        self._at = 0.0

    def _ticks(self) -> dict[str, int]:
        return cpu_ticks(self.postmaster, platform_here=self.client is None)

    def start(self) -> None:
        self._from, self._at = self._ticks(), time.monotonic()

    def report(self, label: str, tasks: int = 0) -> float:
        """Print cores used per part (and CPU ms per task); the platform's cores (all
        parts but the benchmark's own client)."""
        wall = time.monotonic() - self._at
        used = {
            part: (ticks - self._from.get(part, 0)) / TICKS_PER_S
            for part, ticks in self._ticks().items()
        }
        total = sum(seconds for part, seconds in used.items() if part != self.client)
        per_task = f" {'ms/task':>8}" if tasks else ""
        print(f"  {f'cpu {label} (cores)':34} {'cores':>8}{per_task}")
        for part, seconds in sorted(used.items(), key=lambda kv: -kv[1]):
            if seconds > 0:
                cells = f" {seconds / tasks * 1000:8.1f}" if tasks else ""
                print(f"  {part:34} {seconds / wall:8.3f}{cells}")
        cells = f" {total / tasks * 1000:8.1f}" if tasks else ""
        print(f"  {'platform (all but the client)':34} {total / wall:8.3f}{cells}")
        return total / wall


@dataclass
class Result:
    tasks_per_s: float
    running_p50_ms: float
    running_p99_ms: float
    idle_running_p50_ms: float
    idle_succeeded_p50_ms: float
    #: CPU cores the whole platform uses with no task (polling, heartbeats, ticks).
    idle_cores: float
    #: CPU ms the whole platform spends per task in the burst.
    cpu_ms_per_task: float


class MemoryWatch:
    """Samples each service's RSS while tasks succeed: the peak, and the RSS when
    the number of succeeded tasks first reaches each multiple of `every`."""

    def __init__(self, layout: str, every: int = 1000) -> None:
        self.layout = layout
        self.every = every
        self.peak: dict[str, int] = {}
        self.at: dict[int, dict[str, int]] = {}

    def sample(self, succeeded: int, *, last: bool = False) -> None:
        now = service_rss(self.layout)
        for name, kib in now.items():
            self.peak[name] = max(self.peak.get(name, 0), kib)
        mark = succeeded // self.every * self.every
        if mark and mark not in self.at:
            self.at[mark] = now
        if last:
            self.at.setdefault(succeeded, now)

    def report(self) -> None:
        marks = sorted(self.at)
        print(f"  {'memory (MiB)':34} {'peak':>8}" + "".join(f" {f'@{m}':>8}" for m in marks))
        for name in sorted(self.peak):
            cells = "".join(f" {self.at[m].get(name, 0) / 1024:8.0f}" for m in marks)
            print(f"  {name:34} {self.peak[name] / 1024:8.0f}{cells}")


async def idle_latency(
    http: httpx.AsyncClient,
    db: asyncpg.Pool,
    outcomes: Outcomes,
    run: asyncio.Task[None],
    count: int,
) -> tuple[float, float]:
    """p50 (ms) of submit -> running and submit -> succeeded, one task at a time."""
    running: list[float] = []
    succeeded: list[float] = []
    times: dict[str, dict[str, float]] = {}
    for i in range(count):
        task_id = await submit(http, 1_000_000 + i)
        await wait_done(db, outcomes, [f"task-{task_id}"], run, 60, quiet=True)
        t = times[f"task-{task_id}"] = (await timeline(db, [f"task-{task_id}"]))[f"task-{task_id}"]
        running.append((t["TaskRunning"] - t["TaskSubmitted"]) * 1000)
        succeeded.append((t["TaskSucceeded"] - t["TaskSubmitted"]) * 1000)
    print(
        f"  idle: {count} tasks one at a time: submit -> running p50"
        f" {percentile(running, 50):.0f} ms, -> succeeded p50 {percentile(succeeded, 50):.0f} ms"
    )
    if times:
        await consumer_lag(db, list(times))
        report_breakdown(times)
    return percentile(running, 50), percentile(succeeded, 50)


async def supervised(ctx: ServiceContext) -> None:
    """Every built service as a child process, until cancelled (then all stopped); a
    child that exits ends the run with an error."""
    async with service_processes(ctx, services()) as supervisor:
        while not (exited := supervisor.exited()):  # noqa: ASYNC110 (its state, polled)
            await asyncio.sleep(0.2)
        raise RuntimeError(f"service processes exited: {exited}")


def services() -> list[str]:
    """The services this checkout has (each runs in either layout)."""
    return [name for name in SERVICE_NAMES if load_runner(name) is not None]


async def bench(
    n: int,
    concurrency: int,
    server_dsn: str,
    bootstrap: str,
    home: Path,
    layout: str,
    idle: int,
    postmaster: int | None,
    cluster: SlurmCluster | None = None,
    statements: bool = False,
) -> Result:
    dsn = await fresh_database(server_dsn)
    kafka = KafkaSettings(bootstrap=bootstrap, topics=Topics(f"b{uuid.uuid4().hex[:8]}."))
    port, grpc_port = free_port(), free_port()
    if cluster is None:
        config = bench_config(home / "config", n + 8)
    else:
        config = slurm_config(home / "config", cluster)
    ctx = ServiceContext(
        dsn=dsn,
        kafka=kafka,
        data_dir=home / "data",
        config_dir=config,
        settings={"http_port": port, "grpc_port": grpc_port},
    )
    memory = MemoryWatch(layout)
    platform = supervised(ctx) if layout == "processes" else run_platform(ctx)
    run = asyncio.create_task(platform, name="platform")
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    db = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    store: PostgresEventStore | None = None
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", timeout=60, limits=limits
        ) as http:
            await wait_ready(ctx.endpoints, services(), within_s=60, alive=running(run))
            store = await PostgresEventStore.connect(dsn, default_mapper(), max_size=1)
            outcomes = Outcomes(store)
            token = await create_token(db, "bench", "bench", "admin")
            http.headers["Authorization"] = f"Bearer {token}"
            warm = await submit(http, -1)
            await wait_done(db, outcomes, [f"task-{warm}"], run, 60)
            print("  platform up, warm-up task done", flush=True)
            idle_running, idle_succeeded = await idle_latency(http, db, outcomes, run, idle)
            cpu = CpuWatch(postmaster, layout)
            cpu.start()
            await asyncio.sleep(IDLE_CPU_S)
            idle_cores = cpu.report(f"idle {IDLE_CPU_S:.0f} s")
            print(f"  submitting {n} tasks", flush=True)
            if statements:
                await db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                await db.execute("SELECT pg_stat_statements_reset()")
            cpu.start()

            gate = asyncio.Semaphore(concurrency)

            async def one(i: int) -> str:
                async with gate:
                    return await submit(http, i)

            started = time.monotonic()
            ids = await asyncio.gather(*(one(i) for i in range(n)))
            submit_s = time.monotonic() - started
            streams = [f"task-{t}" for t in ids]
            await wait_done(db, outcomes, streams, run, max(120.0, n * 1.0), memory=memory)
            wall_s = time.monotonic() - started
            burst_cores = cpu.report("burst", n)
        times = await timeline(db, streams)
        await consumer_lag(db, streams)
        if statements:
            await top_statements(db)
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        if store is not None:
            await store.close()
        await db.close()

    first = min(t["TaskSubmitted"] for t in times.values())
    last = max(t["TaskSucceeded"] for t in times.values())
    latency = [(t["TaskRunning"] - t["TaskSubmitted"]) * 1000 for t in times.values()]
    rate = n / submit_s
    print(f"  submitted {n} over HTTP in {submit_s:.2f}s ({rate:.0f}/s, {concurrency} in flight)")
    print(f"  all succeeded {wall_s:.2f}s after the first request")
    report_breakdown(times)
    memory.report()
    return Result(
        n / (last - first),
        percentile(latency, 50),
        percentile(latency, 99),
        idle_running,
        idle_succeeded,
        idle_cores,
        burst_cores * wall_s / n * 1000,
    )


# -- plain sbatch on the same cluster (--runtime slurm) ------------------------------------


async def sbatch(cluster: SlurmCluster) -> str:
    """`sbatch --wrap true` with the GPU request of a bench task; the job's id."""
    proc = await asyncio.create_subprocess_exec(
        "sbatch",
        "--parsable",
        "--gres=gpu:1",
        "--output=/dev/null",
        f"--partition={cluster.partition}",
        "--wrap",
        "true",
        env=cluster.env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"sbatch failed: {err.decode().strip()}")
    return out.decode().strip().split(";")[0]


async def slurm_left(cluster: SlurmCluster, jobs: set[str]) -> set[str]:
    """The jobs of `jobs` Slurm still holds pending or running; SystemExit when one of
    them ended otherwise than COMPLETED."""
    proc = await asyncio.create_subprocess_exec(
        "squeue",
        "-h",
        "-t",
        "all",
        "-o",
        "%i %T",
        env=cluster.env(),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    left = set()
    for line in out.decode().splitlines():
        job, _, state = line.partition(" ")
        if job not in jobs:
            continue
        if state in SLURM_OVER - {"COMPLETED"}:
            raise SystemExit(f"Slurm job {job} ended {state}")
        if state not in SLURM_OVER:
            left.add(job)
    return left


async def until_over(cluster: SlurmCluster, jobs: set[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while await slurm_left(cluster, jobs):
        if time.monotonic() > deadline:
            raise SystemExit(f"Slurm jobs not over within {timeout_s:.0f} s")
        await asyncio.sleep(0.1)


async def plain_sbatch(
    cluster: SlurmCluster, n: int, concurrency: int, idle: int
) -> tuple[float, float]:
    """(jobs per second for `n` jobs, p50 ms of one job alone from sbatch to over)."""
    await until_over(cluster, {await sbatch(cluster)}, 60)  # warm-up
    alone: list[float] = []
    for _ in range(idle):
        started = time.monotonic()
        await until_over(cluster, {await sbatch(cluster)}, 60)
        alone.append((time.monotonic() - started) * 1000)
    gate = asyncio.Semaphore(concurrency)

    async def one() -> str:
        async with gate:
            return await sbatch(cluster)

    started = time.monotonic()
    jobs = set(await asyncio.gather(*(one() for _ in range(n))))
    submit_s = time.monotonic() - started
    await until_over(cluster, jobs, max(120.0, n * 1.0))
    wall_s = time.monotonic() - started
    rate = n / wall_s
    print(
        f"  sbatch: {n} jobs submitted in {submit_s:.2f}s, all over {wall_s:.2f}s after the first"
    )
    print(
        f"  sbatch: idle: {idle} jobs one at a time:"
        f" sbatch -> over p50 {percentile(alone, 50):.0f} ms"
    )
    return rate, percentile(alone, 50)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n=300")
    parser.add_argument("-n", type=int, default=1000, help="tasks (default 1000)")
    parser.add_argument("--concurrency", type=int, default=32, help="HTTP requests in flight")
    parser.add_argument(
        "--idle", type=int, default=None, help="tasks run one at a time first (20; --quick 10)"
    )
    parser.add_argument(
        "--layout",
        choices=("processes", "one-process"),
        default="processes",
        help="every service its own process (as `runyard up`), or all in this one",
    )
    parser.add_argument(
        "--runtime",
        choices=("local", "slurm"),
        default="local",
        help="the bench pool's runtime; slurm: on a Slurm cluster started here, "
        "compared with plain sbatch",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the run, print the top")
    parser.add_argument("--keep", action="store_true", help="keep the temp dirs")
    parser.add_argument(
        "--statements",
        action="store_true",
        help="print the SQL statements that took the embedded Postgres's time in the burst",
    )
    parser.add_argument(
        "--pg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of the embedded Postgres, e.g. synchronous_commit=off (repeatable)",
    )
    args = parser.parse_args()
    tune_gc()  # as `runyard up` does (in one-process, this process is the platform)
    n = 300 if args.quick else args.n
    idle = args.idle if args.idle is not None else (10 if args.quick else 20)
    if args.runtime == "slurm" and (why := slurm_missing()):
        raise SystemExit(f"--runtime slurm: {why}")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `timeout`: tear down
    home = make_home()
    profiler = cProfile.Profile() if args.profile else None
    vs_slurm = "na"
    try:
        pg_settings = dict(item.split("=", 1) for item in args.pg)
        if args.statements:
            pg_settings.setdefault("shared_preload_libraries", "pg_stat_statements")
        with (
            infrastructure(args.keep, pg_settings) as (server_dsn, bootstrap, postmaster),
            slurm_cluster(home, args.runtime == "slurm") as cluster,
        ):
            if profiler is not None:
                profiler.enable()
            result = asyncio.run(
                bench(
                    n,
                    args.concurrency,
                    server_dsn,
                    bootstrap,
                    home,
                    args.layout,
                    idle,
                    postmaster,
                    cluster,
                    args.statements,
                )
            )
            rate, idle_succeeded = result.tasks_per_s, result.idle_succeeded_p50_ms
            if profiler is not None:
                profiler.disable()
            if cluster is not None:
                sbatch_rate, sbatch_idle = asyncio.run(
                    plain_sbatch(cluster, n, args.concurrency, idle)
                )
                overhead = 1000 / rate - 1000 / sbatch_rate
                print(
                    f"  runyard on slurm {rate:.1f} tasks/s, plain sbatch {sbatch_rate:.1f}"
                    f" jobs/s: Runyard's overhead {overhead:.0f} ms per task at those rates;"
                    f" idle: {idle_succeeded:.0f} ms submit -> succeeded against"
                    f" {sbatch_idle:.0f} ms sbatch -> over ({idle_succeeded - sbatch_idle:+.0f} ms)"
                )
                vs_slurm = f"{rate / sbatch_rate:.2f}"
    finally:
        unmount_deployments_under([home])  # what deployments cut off by the stop left
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
    if profiler is not None:
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(45)
        print(out.getvalue())
    # The fields of the line's first form first, in their order; later ones after.
    print(
        f"e2e: tasks={n} tasks_per_s={result.tasks_per_s:.1f}"
        f" submit_to_running_p50_ms={result.running_p50_ms:.0f}"
        f" submit_to_running_p99_ms={result.running_p99_ms:.0f}"
        f" idle_running_p50_ms={result.idle_running_p50_ms:.0f}"
        f" vs_slurm={vs_slurm}"
        f" idle_succeeded_p50_ms={result.idle_succeeded_p50_ms:.0f}"
        f" cpu_ms_per_task={result.cpu_ms_per_task:.0f}"
        f" idle_cores={result.idle_cores:.2f} layout={args.layout}"
    )


#: A run's home is this prefix, the run's process id and a random part.
HOME_PREFIX = "runyard-bench-e2e-home-"


def make_home() -> Path:
    """This run's home, once the mounts of runs that are gone are detached.

    A run killed mid-burst (SIGKILL, a lost terminal) leaves its deployments' mounts
    (namespace files, /dev/shm, system disks): every mount namespace made afterwards on
    the host copies them, and each worker's sandbox detaches them one by one, so a
    later run would measure them.
    """
    for old in Path(tempfile.gettempdir()).glob(f"{HOME_PREFIX}*"):
        pid = old.name.removeprefix(HOME_PREFIX).split("-")[0]
        gone = pid.isdigit() and not Path(f"/proc/{pid}").exists()
        if gone and (found := unmount_deployments_under([old])):
            print(f"  detached {found} mounts an earlier run left in {old}", flush=True)
    return Path(tempfile.mkdtemp(prefix=f"{HOME_PREFIX}{os.getpid()}-"))


@contextlib.contextmanager
def slurm_cluster(home: Path, wanted: bool) -> Iterator[SlurmCluster | None]:
    """The Slurm cluster of `--runtime slurm` (stopped on the way out), else None."""
    if not wanted:
        yield None
        return
    with SlurmCluster(home / "slurm", nodes=SLURM_NODES) as cluster:
        yield cluster


if __name__ == "__main__":
    main()
