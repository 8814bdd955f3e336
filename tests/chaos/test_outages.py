"""Outages of the database and the broker, waited out by the relay and the consumers.

- Postgres goes down (an immediate shutdown, as a crash looks to clients) for
  20 s while events flow from the store through the relay to a consumer: the
  relay and the consumer wait, the API answers 503 with Retry-After, and after
  the restart every event is published once and handled once.
- The (memory-only) broker dies with events on it that no consumer has handled:
  after its restart the relay publishes again the unconfirmed tail, not the log.

Each runs on infrastructure of its own (a Postgres, or a broker, the test may
take away), never on the session's shared servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from pathlib import Path

import asyncpg
import httpx
import pytest
from runyard.api.auth import create_token
from runyard.contracts import Event, RecordedEvent
from runyard.eventstore import HEALTH, PostgresEventStore, retrying
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app
from runyard.messaging import KafkaSettings, Topics, ensure_topics
from runyard.messaging.consumer import IdempotentConsumer, make_broker
from runyard.relay import OutboxRelay
from runyard.stack.embedded import EmbeddedKafka, EmbeddedPostgres

from tests.contract.sample_events import happened, sample_mapper

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
#: Long enough for several of the relay's retries (the platform's chaos run waits 20 s).
OUTAGE_S = 8.0


# -- helpers ---------------------------------------------------------------------------


async def wait_until(
    condition: Callable[[], object],
    within: float = 60.0,
    state: Callable[[], str] = lambda: "",
) -> None:
    """Wait for `condition` (its value, or what it returns awaited); past `within` s
    (below pytest's timeout, so that the failure says where it stood) fail with
    `state()` and every task's stack."""
    deadline = asyncio.get_running_loop().time() + within
    while not await _value(condition()):
        if asyncio.get_running_loop().time() > deadline:
            for task in asyncio.all_tasks():
                with contextlib.suppress(Exception):  # frames of compiled code
                    task.print_stack(limit=8)
            raise AssertionError(f"condition not met in {within:.0f} s: {state()}")
        await asyncio.sleep(0.05)


async def _value(result: object) -> object:
    return await result if inspect.isawaitable(result) else result


async def handled(pool: asyncpg.Pool) -> list[int]:
    """Every `n` the consumer's handler wrote, in its transactions (repeats kept)."""
    rows = await pool.fetch("SELECT n FROM handled ORDER BY n")
    return [r["n"] for r in rows]


async def record(event: RecordedEvent[Event], conn: asyncpg.Connection) -> None:
    """The consumer's effect: a row per event, committed with its inbox row."""
    await conn.execute("INSERT INTO handled (n) VALUES ($1)", event.event.n)  # type: ignore[attr-defined]


@contextlib.asynccontextmanager
async def relay_running(
    store: PostgresEventStore, kafka: KafkaSettings
) -> AsyncIterator[tuple[OutboxRelay, asyncio.Task[None]]]:
    relay = OutboxRelay(store, kafka, broker_check_interval=0.2)
    task = asyncio.create_task(relay.run())
    await asyncio.wait_for(relay.ready.wait(), 30)
    try:
        yield relay, task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def consumer_running(
    pool: asyncpg.Pool, kafka: KafkaSettings
) -> AsyncIterator[IdempotentConsumer]:
    broker = make_broker(kafka)
    consumer = IdempotentConsumer(
        "outage-collector", pool=pool, mapper=sample_mapper(), handler=record, kafka=kafka
    )
    consumer.subscribe(broker, kafka.topics.for_category("test"))
    await broker.start()
    try:
        yield consumer
    finally:
        await broker.stop()


async def append(store: PostgresEventStore, numbers: range) -> None:
    """Append as a client would during an outage: waiting it out."""
    for n in numbers:
        await retrying(partial(store.append, f"test-{n % 10}", [happened(n)]), component="writer")


# -- a Postgres of this test's own -----------------------------------------------------


@pytest.fixture
def own_postgres() -> Iterator[EmbeddedPostgres]:
    root = Path(tempfile.mkdtemp(prefix="ry-out-"))
    server = EmbeddedPostgres(root / "pg", settings={"fsync": "off", "max_connections": "100"})
    server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            if not (server.data_dir / "postmaster.pid").exists():
                server.start()  # stop() cleans up only a running server
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def postgres_down(server: EmbeddedPostgres) -> None:
    """Immediate shutdown (SIGQUIT): connections drop at once, as in a crash."""
    pid = int((server.data_dir / "postmaster.pid").read_text().split()[0])
    os.kill(pid, signal.SIGQUIT)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, "Postgres did not go down within 30 s"
        time.sleep(0.05)


def gateway_config(tmp_path: Path) -> Path:
    folder = tmp_path / "config"
    folder.mkdir()
    shutil.copy(REPO / "infra/config/catalogue.yaml", folder / "catalogue.yaml")
    shutil.copy(REPO / "infra/config/pools.yaml", folder / "pools.yaml")
    return folder


@pytest.mark.timeout(300)  # its waits fail first, saying where it stood
async def test_a_database_outage_is_waited_out_and_costs_no_event(
    own_postgres: EmbeddedPostgres, kafka: KafkaSettings, tmp_path: Path
) -> None:
    dsn = own_postgres.dsn
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    await store.pool.execute("CREATE TABLE handled (n integer NOT NULL)")
    consumer_pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    await store.pool.execute("CREATE DATABASE gateway")  # its own log: the platform's events
    gateway = await Gateway.connect(own_postgres.dsn_for("gateway"), gateway_config(tmp_path))
    token = await create_token(gateway.db, "t1", "alice", "member")
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(gateway)),
        base_url="http://gw",
        headers={"Authorization": f"Bearer {token}"},
    )
    before, burst, during = range(0, 200), range(200, 400), range(400, 500)
    try:
        async with (
            consumer_running(consumer_pool, kafka) as consumer,
            relay_running(store, kafka) as (relay, relay_task),
        ):
            await append(store, before)
            await wait_until(lambda: consumer.stats.processed == len(before))
            assert (await http.get("/v1/tasks")).status_code == 200
            assert (await http.get("/readyz")).json() == {"ready": True}

            def state() -> str:
                return (
                    f"writer done={writer.done()}"
                    f" consumer={consumer.stats} relay={relay.stats}"
                    f" relay_done={relay_task.done()}"
                    f" down={HEALTH.report()}"
                )

            await append(store, burst)  # in flight when the database goes
            postgres_down(own_postgres)
            went_down = time.monotonic()
            writer = asyncio.create_task(append(store, during))
            await wait_until(lambda: "relay" in HEALTH.down, within=30)

            ready = await http.get("/readyz")
            assert ready.status_code == 503 and ready.headers["Retry-After"] == "2"
            assert "relay" in ready.json()["waiting"]
            listed = await http.get("/v1/tasks")
            submitted = await http.post("/v1/tasks", json={"name": "x", "pool": "pool-a"})
            for answer in (listed, submitted):
                assert answer.status_code == 503, answer.text
                assert answer.headers["Retry-After"] == "2"
                assert answer.json()["code"] == "service.unavailable"

            await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - went_down)))
            assert not relay_task.done(), "the relay stopped during the outage"
            own_postgres.start()

            await wait_until(writer.done, state=state)
            await writer
            total = len(before) + len(burst) + len(during)

            # Counted in the handled table, not by the consumer: a batch whose commit
            # the database made just before it went down, with the answer lost, is
            # handled again and found done (a duplicate for the consumer's stats).
            async def all_handled() -> bool:
                return len(await handled(consumer_pool)) >= total

            await wait_until(all_handled, state=state)
            await wait_until(lambda: relay.stats.published == total, state=state)
            await wait_until(lambda: "relay" not in HEALTH.down, state=state)
            assert sorted(await handled(consumer_pool)) == list(range(total))  # each once
            assert relay.stats.published == total  # each published once: nothing replayed
            assert consumer.stats.dead_lettered == 0
            assert (await http.get("/v1/tasks")).status_code == 200
            assert (await http.get("/readyz")).json() == {"ready": True}
            print(
                f"\nchaos postgres-outage: events={total} lost=0 doubled=0"
                f" outage_s={OUTAGE_S:.0f} republished={relay.stats.republished}"
            )
    finally:
        await http.aclose()
        await gateway.close()
        await consumer_pool.close()
        await store.close()


# -- a broker of this test's own ----------------------------------------------------


async def test_after_a_broker_loss_only_the_unconfirmed_tail_is_published_again(
    dsn: str,
) -> None:
    """The log holds `log_size` handled events and a tail of `tail` that reached the
    broker but no consumer; the broker dies and comes back empty. The relay must
    publish the tail again (the consumer gets each of its events once), and no
    more than the tail and the last few positions before it: not the log."""
    broker = EmbeddedKafka()
    broker.start()
    kafka = KafkaSettings(bootstrap=broker.bootstrap, topics=Topics("loss."))
    await ensure_topics(kafka.bootstrap, kafka.topics)
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    await store.pool.execute("CREATE TABLE handled (n integer NOT NULL)")
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    log_size, tail, streams = 3000, 100, 10
    try:
        async with relay_running(store, kafka) as (relay, _):
            async with consumer_running(pool, kafka) as consumer:
                await append(store, range(log_size))
                await wait_until(lambda: consumer.stats.processed == log_size)
            # The consumer is away: the tail reaches the broker and nobody else.
            await append(store, range(log_size, log_size + tail))
            await wait_until(lambda: relay.stats.published == log_size + tail)
            broker.kill()
            broker.start()  # same port, empty memory
            await ensure_topics(kafka.bootstrap, kafka.topics)  # as `runyard up`'s watch does
            await wait_until(lambda: relay.stats.broker_resets >= 1, within=60)
            async with consumer_running(pool, kafka) as consumer:
                await wait_until(lambda: consumer.stats.processed == tail)
            republished = relay.stats.republished
        assert sorted(await handled(pool)) == list(range(log_size + tail))  # each once
        # Bounded by the tail: at most the tail and, per partition, what lies between
        # the consumer's last handled event there and the end of the handled log.
        assert tail <= republished <= tail + streams
        print(
            f"\nchaos broker-loss: log={log_size + tail} unconfirmed={tail}"
            f" republished={republished}"
        )
    finally:
        broker.stop()
        await pool.close()
        await store.close()
