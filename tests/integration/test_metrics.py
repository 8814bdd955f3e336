"""A service's /metrics on the real broker and Postgres: events handled, handler time,
consumer lag, events appended, log lines, and a service's own gauges."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import httpx
import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families
from runyard.api.service import service_app
from runyard.contracts import Event, RecordedEvent
from runyard.eventstore import PostgresEventStore
from runyard.logs import LogIngester, LogStore
from runyard.messaging import KafkaSettings
from runyard.messaging.consumer import IdempotentConsumer, make_broker
from runyard.telemetry import register_gauge, setup_metrics

from tests.contract.sample_events import happened, sample_mapper
from tests.integration.test_relay import running_relay, wait_until
from tests.integration.test_scaling import _create_topic, _log_line, running

pytestmark = pytest.mark.integration

WITHIN_S = 60.0


async def scrape(app: object) -> str:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://service") as client:
        answer = await client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    return answer.text


def value(text: str, sample: str, **labels: str) -> float | None:
    """The sum of `sample`'s values whose labels include `labels` (None: no such sample)."""
    found = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and labels.items() <= s.labels.items():
                found = (found or 0.0) + s.value
    return found


class Gate:
    """A handler that can be held on an event, to let a backlog build up behind it."""

    def __init__(self) -> None:
        self.handled = 0
        self.hold = False
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, event: RecordedEvent[Event], conn: asyncpg.Connection) -> None:
        if self.hold:
            self.hold = False
            self.holding.set()
            await self.release.wait()
        self.handled += 1


@contextlib.asynccontextmanager
async def metered_consumer(
    dsn: str, kafka: KafkaSettings, name: str
) -> AsyncIterator[tuple[IdempotentConsumer, Gate]]:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    broker = make_broker(kafka)
    gate = Gate()
    consumer = IdempotentConsumer(
        name, pool=pool, mapper=sample_mapper(), handler=gate, kafka=kafka
    )
    consumer.subscribe(broker, kafka.topics.for_category("test"))
    await broker.start()
    try:
        yield consumer, gate
    finally:
        gate.release.set()
        await broker.stop()
        await pool.close()


async def test_metrics_show_events_handled_handler_time_lag_and_appends(
    dsn: str, kafka: KafkaSettings
) -> None:
    app = service_app("metrics-test")
    name = f"metered-{uuid.uuid4().hex[:8]}"
    topic = kafka.topics.for_category("test")
    await _create_topic(kafka, topic, 4)
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    appended_before = value(await scrape(app), "runyard_events_appended_total", type="Happened")
    try:
        async with (
            metered_consumer(dsn, kafka, name) as (consumer, gate),
            running_relay(store, kafka),
        ):
            for i in range(10):
                await store.append(f"test-{i}", [happened(i)])
            await wait_until(lambda: gate.handled == 10, WITHIN_S)

            text = await scrape(app)
            mine = {"consumer": name}
            handled = value(text, "runyard_events_handled_total", **mine, type="Happened")
            assert handled == 10
            assert value(text, "runyard_events_handled_total", **mine, outcome="handled") == 10
            assert value(text, "runyard_handler_seconds_count", **mine) == 10
            assert (value(text, "runyard_handler_seconds_sum", **mine) or 0) > 0
            appended = value(text, "runyard_events_appended_total", type="Happened")
            assert (appended or 0) - (appended_before or 0) >= 10

            # A handler held on one event: the events behind it show as lag, and
            # the lag goes back to 0 once they are handled.
            gate.hold = True
            await store.append("test-held", [happened(100)])
            await asyncio.wait_for(gate.holding.wait(), WITHIN_S)
            for i in range(20):
                await store.append(f"test-{i}", [happened(200 + i)])
            await _wait_for_lag(app, name, topic, lambda lag: lag > 0)
            gate.release.set()
            await wait_until(lambda: gate.handled == 31, WITHIN_S)
            await _wait_for_lag(app, name, topic, lambda lag: lag == 0)
            text = await scrape(app)
            assert value(text, "runyard_events_handled_total", **mine, outcome="handled") == 31
            # a batch counts as processed once its transaction has committed
            await wait_until(lambda: consumer.stats.processed == 31, WITHIN_S)
    finally:
        await store.close()


async def _wait_for_lag(app: object, consumer: str, topic: str, wanted: object) -> None:
    deadline = asyncio.get_running_loop().time() + WITHIN_S
    while True:
        lag = value(await scrape(app), "runyard_consumer_lag", consumer=consumer, topic=topic)
        if lag is not None and wanted(lag):  # type: ignore[operator]
            return
        assert asyncio.get_running_loop().time() < deadline, f"lag stayed at {lag}"
        await asyncio.sleep(0.05)


async def test_metrics_show_log_lines_by_outcome(dsn: str, kafka: KafkaSettings) -> None:
    app = service_app("metrics-test")
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    producer = AIOKafkaProducer(**kafka.client_options())
    await producer.start()
    store = LogStore(pool)
    await store.migrate()
    await store.maintain(datetime.now(UTC))
    group = f"logs-{uuid.uuid4().hex[:8]}"
    ingester = LogIngester(store, kafka, group=group)
    try:
        lines = [_log_line(1, seq) for seq in range(5)]
        for line in [*lines, lines[0]]:  # the first one twice
            await producer.send(kafka.topics.logs, line, key=b"task-1")
        await producer.send_and_wait(kafka.topics.logs, json.dumps({"no": 1}).encode())
        async with running(ingester.run):
            await wait_until(lambda: ingester.consumer.stats.received == 7, WITHIN_S)
            text = await scrape(app)
            mine = {"consumer": group}
            assert value(text, "runyard_log_lines_total", **mine, outcome="stored") == 5
            assert value(text, "runyard_log_lines_total", **mine, outcome="duplicate") == 1
            assert value(text, "runyard_log_lines_total", **mine, outcome="malformed") == 1
            assert value(text, "runyard_consumer_lag", **mine, topic=kafka.topics.logs) == 0
        # A stopped ingester no longer reports a lag.
        assert value(await scrape(app), "runyard_consumer_lag", **mine) is None
    finally:
        await producer.stop()
        await pool.close()


async def test_a_services_own_gauge_and_a_second_setup() -> None:
    setup_metrics("metrics-test")
    setup_metrics("another-name")  # the first one stays; nothing breaks
    app = service_app("metrics-test")
    name = f"runyard_test_queue_length_{uuid.uuid4().hex[:8]}"
    unregister = register_gauge(
        name, "Tasks waiting, by pool.", lambda: [(3, {"pool": "a"}), (0, {"pool": "b"})]
    )
    text = await scrape(app)
    assert value(text, name, pool="a") == 3
    assert value(text, name, pool="b") == 0

    register_gauge(name, "Tasks waiting.", lambda: 7)  # registered again: replaced
    assert value(await scrape(app), name) == 7
    unregister()  # the replaced callback's: no effect
    assert value(await scrape(app), name) == 7
