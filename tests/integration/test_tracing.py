"""One trace across a Kafka hop: writer span -> relay headers -> consumer span ->
the consumer's reaction carries the consumer span's context (R-62)."""

from __future__ import annotations

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent, utcnow
from runyard.eventstore import PostgresEventStore
from runyard.messaging import KafkaSettings
from runyard.messaging.consumer import IdempotentConsumer, make_broker
from runyard.telemetry import current_trace_context, setup_tracing, tracer

from tests.contract.sample_events import Happened, sample_mapper
from tests.integration.test_relay import running_relay, wait_until

pytestmark = pytest.mark.integration

EXPORTER = InMemorySpanExporter()


def _trace_id(context: dict[str, str]) -> str:
    return context["traceparent"].split("-")[1]


def _span_id(context: dict[str, str]) -> str:
    return context["traceparent"].split("-")[2]


async def test_a_reaction_continues_the_trace_of_its_cause(dsn: str, kafka: KafkaSettings) -> None:
    setup_tracing("runyard-test", exporter=EXPORTER)
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    reactions: list[Metadata] = []

    async def react(event: RecordedEvent[Event], conn: asyncpg.Connection) -> None:
        if isinstance(event.event, Happened) and event.event.n == 1:
            meta = event.metadata.caused_by(event, "service:reactor")
            reactions.append(meta)
            await store.append_in(conn, "test-2", [NewEvent(Happened(n=2), meta, utcnow())])

    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    broker = make_broker(kafka)
    consumer = IdempotentConsumer(
        "reactor", pool=pool, mapper=sample_mapper(), handler=react, kafka=kafka
    )
    consumer.subscribe(broker, kafka.topics.for_category("test"))
    await broker.start()
    try:
        with tracer("test").start_as_current_span("submit request"):
            origin = current_trace_context()
            first = NewEvent(
                Happened(n=1), Metadata(actor="user:a/b", trace_context=origin), utcnow()
            )
            await store.append("test-1", [first])
        async with running_relay(store, kafka):
            await wait_until(lambda: consumer.stats.processed >= 2, within=60)
    finally:
        await broker.stop()
        await pool.close()
    [reaction] = reactions
    assert _trace_id(reaction.trace_context) == _trace_id(origin)
    assert _span_id(reaction.trace_context) != _span_id(origin), "parent is the consumer span"
    [stored] = await store.read_stream("test-2")
    assert stored.metadata.trace_context == reaction.trace_context
    consumer_spans = [
        s
        for s in EXPORTER.get_finished_spans()
        if s.kind == trace.SpanKind.CONSUMER
        and format(s.context.trace_id, "032x") == _trace_id(origin)
    ]
    assert consumer_spans, "FastStream's middleware continued the trace from the headers"
    await store.close()


async def test_a_submission_carries_the_http_requests_trace(dsn: str) -> None:
    """The gateway's request span is the parent of what the request appends."""
    import httpx
    from runyard.api.auth import create_token
    from runyard.contracts import default_mapper
    from runyard.gateway.app import Gateway
    from runyard.gateway.http import create_app

    from tests.unit.test_cli import REPO

    setup_tracing("runyard-test", exporter=EXPORTER)
    gateway = await Gateway.connect(dsn, REPO / "infra/config")
    try:
        token = await create_token(gateway.db, "t1", "alice", "member")
        caller_trace = "0af7651916cd43dd8448eb211c80319c"
        headers = {
            "Authorization": f"Bearer {token}",
            "traceparent": f"00-{caller_trace}-b7ad6b7169203331-01",
        }
        transport = httpx.ASGITransport(app=create_app(gateway))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            answer = await http.post(
                "/v1/tasks",
                headers=headers,
                json={
                    "name": "t",
                    "pool": "dev-a100",
                    "worker_spec": "1gpu",
                    "image": "pytorch:2.3-cuda12",
                    "command": "true",
                },
            )
        assert answer.status_code == 201, answer.text
        store = PostgresEventStore(gateway.db, default_mapper())
        [submitted] = await store.read_stream(f"task-{answer.json()['task_id']}")
        context = submitted.metadata.trace_context
        assert _trace_id(context) == caller_trace
        assert _span_id(context) != "b7ad6b7169203331", "the parent is the gateway's span"
    finally:
        await gateway.close()
