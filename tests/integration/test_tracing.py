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
