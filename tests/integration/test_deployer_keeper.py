"""Worker output a broker loses is published again, and a finished worker's output files
stay until the log service has stored every line (runyard.deployer.keeper).

Real workers (the local runtime), a real log service on a real port (its store on the
real Postgres) answering `/internal/v1/lines/missing`. The sink stands where the broker
is: it acknowledges every line but loses the ones a test names, as a broker that
restarted without its memory does; the lines it keeps go straight into the log store.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from runyard.deployer.app import DeployerApp
from runyard.deployer.keeper import BrokerWatch, LogServiceLines, OutputKeeper
from runyard.deployer.runtime import LocalRuntime, OutputLine
from runyard.logs import LogStore
from runyard.logs.http import MAX_MISSING_STREAMS

from tests.integration.test_deployer_faults import World, spec, world  # noqa: F401 (fixture)
from tests.integration.test_gateway_routing import SERVICE_TOKEN, LogService, log_service
from tests.log_records import log_record

pytestmark = pytest.mark.integration

LINES = 30


@dataclass
class LossySink:
    """Acknowledges every line; stores those it does not lose (a broker, then the log
    service's ingest). `watch` hears of each acknowledgement, at a growing offset."""

    store: LogStore
    watch: BrokerWatch
    loses: Callable[[OutputLine], bool] = lambda line: False
    acked: list[OutputLine] = field(default_factory=list)
    offset: int = 0

    async def __call__(self, line: OutputLine) -> None:
        self.acked.append(line)
        stream = (line.task_id, line.run, line.attempt, line.worker, line.stream)
        self.watch.saw(stream, 0, self.offset)
        self.offset += 1
        if self.loses(line):
            return
        await self.store.ingest([line.record()])


@dataclass
class Rig:
    world: World
    logs: LogService
    runtime: LocalRuntime
    app: DeployerApp
    sink: LossySink
    keeper: OutputKeeper
    endpoints: dict[str, str]
    #: The end offsets the broker answers, where a test sets them (else: all it took).
    ends: dict[int, int]

    async def stored(self, task_id: str) -> list[tuple[int, str]]:
        rows = await self.logs.store.pool.fetch(
            "SELECT seq, line FROM log_lines WHERE task_id = $1 AND stream = 'stdout' ORDER BY seq",
            task_id,
        )
        return [(r["seq"], r["line"]) for r in rows]

    async def kept(self, task_id: str, within: float = 30.0) -> None:
        key = (task_id, 1, 1)
        async with asyncio.timeout(within):
            while key not in self.runtime.kept():  # noqa: ASYNC110 (no event to wait on)
                await asyncio.sleep(0.05)


@pytest.fixture
async def rig(world: World, dsn: str, tmp_path: Path) -> AsyncIterator[Rig]:  # noqa: F811
    endpoints: dict[str, str] = {}
    async with log_service(dsn, tmp_path / "exports", endpoints) as logs:
        runtime = LocalRuntime(dataclasses.replace(world.config(), keep_output=True))
        watch = BrokerWatch(tmp_path / "acked.json")
        sink = LossySink(logs.store, watch)
        app = DeployerApp(world.store, runtime, on_output=sink, stop_grace_s=1.0)
        world.apps.append(app)
        ends: dict[int, int] = {}

        async def probe() -> dict[int, int]:
            return {0: ends.get(0, sink.offset)}

        stored = LogServiceLines(endpoints, SERVICE_TOKEN)
        keeper = OutputKeeper(
            runtime, stored, sink, watch=watch, probe=probe, repair_after_s=3600.0
        )
        try:
            yield Rig(world, logs, runtime, app, sink, keeper, endpoints, ends)
        finally:
            await stored.close()


def numbered(count: int, start: int = 0) -> list[tuple[int, str]]:
    return [(i, f"line {i}") for i in range(start, start + count)]


async def test_lines_a_broker_lost_are_published_again_from_a_running_workers_file(
    rig: Rig,
) -> None:
    here = rig.world
    task, gate = here.gated("echo done", runtime=rig.runtime)
    command = f"for i in $(seq 0 {LINES - 1}); do echo line $i; done; " + task.command
    rig.sink.loses = lambda line: line.seq is not None and 10 <= line.seq < 20
    await here.launch(rig.app, "live", spec(command, mounts=task.mounts))
    async with asyncio.timeout(30):
        while len([x for x in rig.sink.acked if x.stream == "stdout"]) < LINES:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    assert await rig.stored("live") == numbered(10) + numbered(10, 20)

    await rig.keeper.round()  # the broker still has everything it acknowledged
    assert await rig.stored("live") == numbered(10) + numbered(10, 20)
    assert rig.keeper.republished == 0

    rig.ends[0] = 0  # the broker comes back empty
    rig.sink.loses = lambda line: False
    await rig.keeper.round()
    assert await rig.stored("live") == numbered(LINES)  # each line once
    assert rig.keeper.republished == 10
    times = await rig.logs.store.pool.fetch(
        "SELECT seq, at FROM log_lines WHERE task_id = 'live' AND stream = 'stdout' ORDER BY seq"
    )
    first = {r["seq"]: r["at"] for r in times}
    # Published again with the time of the mark after them: close to when they were read.
    assert abs((first[15] - first[9]).total_seconds()) < 2.5

    gate.touch()
    await here.until("live", lambda s: s.finished)
    await rig.kept("live")
    del rig.ends[0]
    await rig.keeper.round()  # every line is stored: the files go
    assert rig.runtime.kept() == {}
    assert not (here.tmp / "scratch" / "live").exists()
    assert [line for _, line in await rig.stored("live")][-1] == "done"


async def test_output_kept_while_a_loss_waits_for_the_log_service_is_published_again(
    rig: Rig,
) -> None:
    here = rig.world
    task, gate = here.gated("echo last", runtime=rig.runtime)
    command = "for i in $(seq 0 4); do echo line $i; done; " + task.command
    rig.sink.loses = lambda line: line.seq in (2, 3)
    await here.launch(rig.app, "wait", spec(command, mounts=task.mounts))
    async with asyncio.timeout(30):
        while len(rig.sink.acked) < 5:  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    await rig.keeper.round()
    rig.ends[0] = 0  # the broker lost its memory ...
    logs_url = rig.endpoints.pop("logs")  # ... and the log service is away
    with pytest.raises(RuntimeError, match="no log service"):
        await rig.keeper.round()
    del rig.ends[0]
    rig.sink.loses = lambda line: False
    gate.touch()  # the worker ends meanwhile: its output is kept, no longer followed
    await here.until("wait", lambda s: s.finished)
    await rig.kept("wait")

    rig.endpoints["logs"] = logs_url
    await rig.keeper.round()
    assert await rig.stored("wait") == [*numbered(5), (5, "last")]
    assert rig.keeper.republished == 2


async def test_a_finished_workers_files_stay_until_every_line_is_stored(rig: Rig) -> None:
    here = rig.world
    rig.sink.loses = lambda line: line.seq == 3
    command = "for i in $(seq 0 5); do echo line $i; done"
    await here.launch(rig.app, "done", spec(command))
    await here.until("done", lambda s: s.finished)
    await rig.kept("done")
    folder = here.tmp / "scratch" / "done" / "run1-a1"

    await rig.keeper.round()  # one line missing, no loss known: it may still come
    assert folder.exists() and rig.keeper.republished == 0

    rig.keeper.repair_after_s = 0.0  # ... but not forever: published again
    rig.sink.loses = lambda line: False
    rig.keeper._kept[("done", 1, 1)].due = 0.0
    await rig.keeper.round()
    assert rig.keeper.republished == 1
    assert await rig.stored("done") == numbered(6)

    rig.keeper._kept[("done", 1, 1)].due = 0.0
    await rig.keeper.round()
    assert not folder.exists()


async def test_output_an_earlier_deployer_left_of_a_finished_task_is_published_and_kept(
    rig: Rig,
) -> None:
    """An earlier deployer recorded a worker's exit and was cut before its last lines
    were out (they are in the file, past the saved offset, or went with a broker). The
    task is finished: the next deployer ends nothing and starts nothing, but keeps the
    output until every line is stored, and publishes at once what the store lacks."""
    here = rig.world
    rig.sink.loses = lambda line: line.seq is not None and line.seq >= 3
    await here.launch(rig.app, "cut", spec("for i in $(seq 0 5); do echo line $i; done"))
    await here.until("cut", lambda s: s.finished)
    await rig.kept("cut")
    assert await rig.stored("cut") == numbered(3)
    # What the earlier deployer left when it was cut: the deployment as started.
    folder = here.tmp / "scratch" / "cut" / "run1-a1"
    state = json.loads((folder / "state.json").read_text())
    state.update(phase="started", worker_count=1, workers=[{"index": 0, "pid": 2**22 + 7}])
    (folder / "state.json").write_text(json.dumps(state))

    runtime = LocalRuntime(dataclasses.replace(here.config(), keep_output=True))
    app = DeployerApp(here.store, runtime, on_output=rig.sink, stop_grace_s=1.0)
    here.apps.append(app)
    assert await app.reconcile() == []  # nothing to take over: the task is finished
    kept = runtime.kept()[("cut", 1, 1)]
    assert kept.salvaged and kept.lines == {(0, "stdout"): 6}
    assert folder.exists()

    rig.sink.loses = lambda line: False
    lines = LogServiceLines(rig.endpoints, SERVICE_TOKEN)
    keeper = OutputKeeper(runtime, lines, rig.sink)
    try:
        await keeper.round()  # no broker loss known: published at once all the same
        assert keeper.republished == 3
        assert await rig.stored("cut") == numbered(6)
        keeper._kept[("cut", 1, 1)].due = 0.0
        await keeper.round()
    finally:
        await lines.close()
    assert runtime.kept() == {}
    assert not folder.exists()


async def test_kept_files_go_after_keep_s_and_stay_while_no_log_service_answers(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    here = rig.world
    rig.sink.loses = lambda line: True
    await here.launch(rig.app, "lost", spec("echo a; echo b"))
    await here.until("lost", lambda s: s.finished)
    await rig.kept("lost")
    folder = here.tmp / "scratch" / "lost" / "run1-a1"

    logs_url = rig.endpoints.pop("logs")  # no log service known: nothing is removed
    rig.keeper.keep_s = 0.0
    await rig.keeper.round()
    assert folder.exists()

    rig.endpoints["logs"] = logs_url
    with caplog.at_level(logging.WARNING, "runyard.deployer.keeper"):
        await rig.keeper.round()
    assert not folder.exists()
    assert "2 line(s) still not stored" in caplog.text


def ends(**by_partition: int) -> Callable[[], Awaitable[dict[int, int]]]:
    async def probe() -> dict[int, int]:
        return {int(p.removeprefix("p")): e for p, e in by_partition.items()}

    return probe


async def test_the_broker_watch_notices_what_a_broker_loss_looks_like(tmp_path: Path) -> None:
    watch = BrokerWatch(tmp_path / "acked.json")
    assert not await watch.look(ends(p0=50, p1=10))
    assert not await watch.look(ends(p0=60, p1=10))
    assert await watch.look(ends(p0=3, p1=10))  # an end offset went back
    assert not await watch.look(ends(p0=4, p1=10))

    watch.saw("a", 1, 20)
    watch.saw("b", 1, 5)  # another stream: no order between the two
    assert not await watch.look(ends(p0=4, p1=21))
    watch.saw("a", 1, 2)  # the same stream, back below its last line: a new partition
    assert await watch.look(ends(p0=4, p1=21))
    assert watch.losses == 2


async def test_a_restarted_deployer_compares_the_broker_with_what_it_acknowledged(
    tmp_path: Path,
) -> None:
    path = tmp_path / "acked.json"
    watch = BrokerWatch(path)
    watch.saw("a", 0, 41)
    watch.saw("b", 2, 7)
    watch.saw("c", 0, 12)  # acknowledgements of different streams come in any order
    watch.save()
    assert BrokerWatch(path).acked == {0: 41, 2: 7}

    assert not await BrokerWatch(path).look(ends(p0=42, p1=0, p2=8, p3=0))  # all still there
    again = BrokerWatch(path)
    assert await again.look(ends(p0=3, p1=0, p2=8, p3=0))  # partition 0 is younger
    assert again.acked == {2: 7}


# --- the log service's route ------------------------------------------------------------


async def test_the_missing_lines_route_answers_the_service_credential_only(
    dsn: str, tmp_path: Path
) -> None:
    endpoints: dict[str, str] = {}
    async with log_service(dsn, tmp_path, endpoints) as logs, httpx.AsyncClient() as http:
        records = [
            log_record(datetime.now(UTC), "t-9", f"l{i}", attempt=2, seq=i)
            for i in (0, 1, 2, 5, 6, 9)
        ]
        await logs.store.ingest(records)
        route = f"{logs.url}/internal/v1/lines/missing"
        ask = {
            "streams": [
                {
                    "task_id": "t-9",
                    "run": 1,
                    "attempt": 2,
                    "worker": 0,
                    "stream": "stdout",
                    "below": 12,
                },
                {
                    "task_id": "t-9",
                    "run": 1,
                    "attempt": 2,
                    "worker": 0,
                    "stream": "stdout",
                    "start": 5,
                    "below": 7,
                },
                {
                    "task_id": "t-9",
                    "run": 1,
                    "attempt": 2,
                    "worker": 0,
                    "stream": "stderr",
                    "below": 2,
                },
                {
                    "task_id": "t-9",
                    "run": 1,
                    "attempt": 1,
                    "worker": 0,
                    "stream": "stdout",
                    "below": 0,
                },
            ]
        }
        refused = await http.post(route, json=ask)
        assert refused.status_code == 401
        wrong = await http.post(route, json=ask, headers={"x-runyard-service-token": "nope"})
        assert wrong.status_code == 401

        answer = await http.post(
            route, json=ask, headers={"x-runyard-service-token": SERVICE_TOKEN}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json() == {
            "streams": [
                {"missing": [[3, 5], [7, 9], [10, 12]], "truncated": False},
                {"missing": [], "truncated": False},
                {"missing": [[0, 2]], "truncated": False},
                {"missing": [], "truncated": False},
            ]
        }

        one = ask["streams"][0]
        too_many = {"streams": [one] * (MAX_MISSING_STREAMS + 1)}
        headers = {"x-runyard-service-token": SERVICE_TOKEN}
        assert (await http.post(route, json=too_many, headers=headers)).status_code in (400, 422)
        bad = {"streams": [{**one, "stream": "stdin"}]}
        assert (await http.post(route, json=bad, headers=headers)).status_code in (400, 422)


async def test_failing_rounds_are_logged_when_they_start_and_when_they_end(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    await rig.keeper.round()
    rig.keeper.check_s = 0.02
    rig.ends[0] = -1  # a loss to see to ...
    logs_url = rig.endpoints.pop("logs")  # ... and nobody to ask
    with caplog.at_level(logging.WARNING, "runyard.deployer.keeper"):
        running = asyncio.create_task(rig.keeper.run())
        await asyncio.sleep(0.3)
        rig.endpoints["logs"] = logs_url
        await asyncio.sleep(0.3)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    failed = [r for r in caplog.records if "trying again every" in r.getMessage()]
    again = [r for r in caplog.records if "working again after" in r.getMessage()]
    assert len(failed) == 1 and "no log service" in failed[0].getMessage()
    assert len(again) == 1
