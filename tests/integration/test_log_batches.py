"""The logs batch consumer (`runyard.messaging.batches`) on the real broker: offsets
committed only once the handler returned, an outage in the handler waited out
without losing the batch, any other handler error ending it uncommitted, malformed
records counted and skipped, and its lag reported while it runs."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from runyard.contracts.loglines import LogRecord
from runyard.messaging import KafkaSettings
from runyard.messaging.batches import LogBatchConsumer
from runyard.telemetry import setup_metrics
from runyard.telemetry.metrics import metrics_text

from tests.conftest import quick_groups
from tests.integration.test_metrics import value
from tests.integration.test_relay import wait_until
from tests.log_records import log_record

pytestmark = pytest.mark.integration


def line(text: str, seq: int) -> bytes:
    return log_record(datetime.now(UTC), "t-b", text, seq=seq).to_bytes()


async def publish(kafka: KafkaSettings, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(**kafka.client_options())
    await producer.start()
    try:
        for v in values:  # one key: one partition, in this order
            await producer.send_and_wait(kafka.topics.logs, v, key=b"t-b")
    finally:
        await producer.stop()


class Taken:
    """A handler that keeps the lines of every batch it is given."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    async def __call__(self, records: list[LogRecord]) -> None:
        self.batches.append([r.line for r in records])

    @property
    def lines(self) -> list[str]:
        return [text for batch in self.batches for text in batch]


@contextlib.asynccontextmanager
async def running(consumer: LogBatchConsumer) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(consumer.run())
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
def kafka(kafka: KafkaSettings) -> KafkaSettings:
    """Each test here starts several members of one group in turn (`quick_groups`)."""
    return quick_groups(kafka)


def group() -> str:
    return f"batches-{uuid.uuid4().hex[:8]}"


async def test_offsets_are_committed_only_once_the_handler_returned(kafka: KafkaSettings) -> None:
    name = group()
    await publish(kafka, [line(f"l{i}", i) for i in range(5)])
    held: list[list[str]] = []

    async def never_returns(records: list[LogRecord]) -> None:
        held.append([r.line for r in records])
        await asyncio.Event().wait()

    # Stopped while its handler still runs: nothing it took is committed.
    first = LogBatchConsumer(name, kafka=kafka, handler=never_returns)
    async with running(first):
        await wait_until(lambda: held)
    assert first.stats.batches == 0

    # The next member of the group takes it all again, and handles it.
    taken = Taken()
    second = LogBatchConsumer(name, kafka=kafka, handler=taken)
    async with running(second):
        await wait_until(lambda: second.stats.received == 5)  # handled and committed
    assert taken.lines == [f"l{i}" for i in range(5)]
    assert held[0] == taken.lines[: len(held[0])]

    # Handled, committed: the one after that only gets what came since.
    await publish(kafka, [line("l5", 5)])
    after = Taken()
    third = LogBatchConsumer(name, kafka=kafka, handler=after)
    async with running(third):
        await wait_until(lambda: after.lines)
        await asyncio.sleep(0.5)  # anything older would have come in the same poll
    assert after.lines == ["l5"]


async def test_a_position_past_the_partitions_end_reads_it_again_from_its_start(
    kafka: KafkaSettings,
) -> None:
    """A broker that lost its data answers a fetch past the end with nothing, not an
    error: a group whose offset outlived the loss would wait there and jump over every
    line published since. Here the group's committed offset is past the end."""
    name = group()
    await publish(kafka, [line(f"l{i}", i) for i in range(3)])
    ahead = AIOKafkaConsumer(**kafka.client_options(), group_id=kafka.topics.prefix + name)
    await ahead.start()
    try:
        topic = kafka.topics.logs
        every = [TopicPartition(topic, p) for p in ahead.partitions_for_topic(topic) or ()]
        ends = await ahead.end_offsets(every)
        ahead.assign(every)
        await ahead.commit({tp: end + 100 for tp, end in ends.items()})
    finally:
        await ahead.stop()

    taken = Taken()
    async with running(LogBatchConsumer(name, kafka=kafka, handler=taken)):
        await wait_until(lambda: len(taken.lines) == 3, within=20)
        await publish(kafka, [line("l3", 3)])  # and goes on from there
        await wait_until(lambda: len(taken.lines) == 4, within=20)
    assert taken.lines == ["l0", "l1", "l2", "l3"]


async def test_an_outage_in_the_handler_is_waited_out_without_losing_the_batch(
    kafka: KafkaSettings,
) -> None:
    name = group()
    await publish(kafka, [line(f"l{i}", i) for i in range(3)])
    calls: list[list[str]] = []
    taken = Taken()

    async def flaky(records: list[LogRecord]) -> None:
        calls.append([r.line for r in records])
        if len(calls) <= 2:
            raise ConnectionResetError("the database went away")
        await taken(records)

    consumer = LogBatchConsumer(name, kafka=kafka, handler=flaky)
    async with running(consumer) as task:
        await wait_until(lambda: consumer.stats.received == 3)
        assert not task.done()
    assert calls[0] == calls[1] == calls[2]  # the same batch, handed again
    assert taken.lines == ["l0", "l1", "l2"]

    # and committed once handled
    await publish(kafka, [line("l3", 3)])
    after = Taken()
    async with running(LogBatchConsumer(name, kafka=kafka, handler=after)):
        await wait_until(lambda: after.lines)
        await asyncio.sleep(0.5)
    assert after.lines == ["l3"]


async def test_a_handler_error_that_is_no_outage_stops_it_and_the_batch_comes_again(
    kafka: KafkaSettings,
) -> None:
    name = group()
    await publish(kafka, [line("l0", 0), line("l1", 1)])

    async def broken(records: list[LogRecord]) -> None:
        raise RuntimeError("a bug in the handler")

    with pytest.raises(RuntimeError, match="a bug in the handler"):
        await asyncio.wait_for(LogBatchConsumer(name, kafka=kafka, handler=broken).run(), 60)

    taken = Taken()
    async with running(LogBatchConsumer(name, kafka=kafka, handler=taken)):
        await wait_until(lambda: len(taken.lines) == 2)
    assert taken.lines == ["l0", "l1"]


async def test_malformed_records_are_counted_and_skipped_and_the_lag_is_reported(
    kafka: KafkaSettings,
) -> None:
    setup_metrics("log-batches-test")
    name = group()
    junk = [b"not json", b'{"task_id": "t-b"}', line("ok", 0).replace(b'"run":1', b'"run":"1"')]
    await publish(kafka, [junk[0], line("a", 0), junk[1], line("b", 1), junk[2]])
    taken = Taken()
    consumer = LogBatchConsumer(name, kafka=kafka, handler=taken)
    async with running(consumer):
        await wait_until(lambda: consumer.stats.received == 5)
        assert taken.lines == ["a", "b"]
        assert consumer.stats.malformed == 3
        assert consumer.lag() == {kafka.topics.logs: 0}
        text = metrics_text()
        assert value(text, "runyard_log_lines_total", consumer=name, outcome="malformed") == 3
        assert value(text, "runyard_consumer_lag", consumer=name, topic=kafka.topics.logs) == 0
    assert consumer.lag() == {}  # stopped: nothing held, nothing reported
    assert value(metrics_text(), "runyard_consumer_lag", consumer=name) is None
