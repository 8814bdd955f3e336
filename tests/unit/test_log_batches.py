"""The logs batch consumer's pipeline without a broker: batches polled by hand, each
with a commit that records when it ran (tests/integration/test_log_batches.py runs
the same consumer on the real broker)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from runyard.contracts.loglines import LogRecord
from runyard.messaging import KafkaSettings
from runyard.messaging.batches import LogBatchConsumer, Polled

from tests.log_records import log_record

AT = datetime(2026, 11, 30, tzinfo=UTC)


def value(text: str, seq: int = 0) -> bytes:
    return log_record(AT, "t", text, seq=seq).to_bytes()


class Log:
    """What happened, in order: handler calls and commits."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    async def polled(self, *batches: list[bytes | None]) -> AsyncIterator[Polled]:
        for number, values in enumerate(batches):

            async def commit(number: int = number) -> None:
                self.events.append(("commit", number))

            yield values, commit


def consumer(handler: object, **options: object) -> LogBatchConsumer:
    return LogBatchConsumer("unit-logs", kafka=KafkaSettings(), handler=handler, **options)  # type: ignore[arg-type]


async def test_each_batch_is_committed_after_its_handler_returned() -> None:
    log = Log()

    async def handler(records: list[LogRecord]) -> None:
        log.events.append(("handled", [r.line for r in records]))

    c = consumer(handler)
    await c.pipeline(log.polled([value("a"), value("b")], [value("c")]))
    assert log.events == [
        ("handled", ["a", "b"]),
        ("commit", 0),
        ("handled", ["c"]),
        ("commit", 1),
    ]
    assert (c.stats.received, c.stats.batches, c.stats.malformed) == (3, 2, 0)


async def test_batches_in_flight_together_are_committed_in_order() -> None:
    log = Log()
    delays = {"slow": 0.2, "fast": 0.0, "faster": 0.0}

    async def handler(records: list[LogRecord]) -> None:
        await asyncio.sleep(delays[records[0].line])
        log.events.append(("handled", records[0].line))

    c = consumer(handler, in_flight=3)
    await c.pipeline(log.polled([value("slow")], [value("fast")], [value("faster")]))
    handled = [e for e in log.events if e[0] == "handled"]
    assert handled[-1] == ("handled", "slow")  # the first batch finished last...
    commits = [e for e in log.events if e[0] == "commit"]
    assert commits == [("commit", 0), ("commit", 1), ("commit", 2)]  # ...and was committed first
    assert log.events.index(("commit", 0)) > log.events.index(("handled", "slow"))


async def test_an_outage_in_the_handler_holds_the_batch_until_it_is_over() -> None:
    log = Log()
    calls: list[list[str]] = []

    async def handler(records: list[LogRecord]) -> None:
        calls.append([r.line for r in records])
        if len(calls) < 3:
            raise ConnectionRefusedError("the database is away")
        log.events.append(("handled", len(calls)))

    c = consumer(handler)
    await c.pipeline(log.polled([value("a"), value("b")]))
    assert calls == [["a", "b"]] * 3  # the same batch each time, nothing lost
    assert log.events == [("handled", 3), ("commit", 0)]


async def test_a_handler_error_that_is_no_outage_ends_the_pipeline_uncommitted() -> None:
    log = Log()

    async def handler(records: list[LogRecord]) -> None:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        await consumer(handler).pipeline(log.polled([value("a")], [value("b")]))
    assert log.events == []


async def test_malformed_messages_are_counted_and_skipped() -> None:
    log = Log()
    handled: list[list[str]] = []

    async def handler(records: list[LogRecord]) -> None:
        handled.append([r.line for r in records])

    c = consumer(handler)
    junk: list[bytes | None] = [b"not json", None, b'{"at": "2026-11-30T00:00:00Z"}']
    await c.pipeline(log.polled([junk[0], value("a"), junk[1]], [junk[2]], [value("b")]))
    assert handled == [["a"], ["b"]]  # a batch of nothing but junk reaches no handler...
    assert log.events == [("commit", 0), ("commit", 1), ("commit", 2)]  # ...and is committed
    assert (c.stats.received, c.stats.malformed, c.stats.batches) == (5, 3, 3)


async def test_a_batch_is_committed_without_waiting_for_the_next_one() -> None:
    log = Log()
    committed = asyncio.Event()

    async def handler(records: list[LogRecord]) -> None:
        return None

    async def then_quiet() -> AsyncIterator[Polled]:
        async for values, commit in log.polled([value("a")]):

            async def commit_and_tell(commit: Any = commit) -> None:
                await commit()
                committed.set()

            yield values, commit_and_tell
        await asyncio.sleep(60)  # nothing more on the topic
        yield [], _nothing

    running = asyncio.create_task(consumer(handler).pipeline(then_quiet()))
    try:
        await asyncio.wait_for(committed.wait(), 5)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert log.events == [("commit", 0)]


async def test_a_failing_handler_ends_the_pipeline_at_once_on_a_quiet_topic() -> None:
    log = Log()

    async def handler(records: list[LogRecord]) -> None:
        raise RuntimeError("a bug")

    async def then_quiet() -> AsyncIterator[Polled]:
        async for polled in log.polled([value("a")]):
            yield polled
        await asyncio.sleep(60)
        yield [], _nothing

    with pytest.raises(RuntimeError, match="a bug"):
        await asyncio.wait_for(consumer(handler).pipeline(then_quiet()), 5)
    assert log.events == []


async def test_a_cancel_cancels_the_handler_in_flight_and_commits_nothing() -> None:
    log = Log()
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def handler(records: list[LogRecord]) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def endless() -> AsyncIterator[Polled]:
        async for polled in log.polled([value("a")]):
            yield polled
        await asyncio.sleep(60)  # polling on while the batch is handled
        yield [], _nothing

    running = asyncio.create_task(consumer(handler).pipeline(endless()))
    await asyncio.wait_for(started.wait(), 5)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert cancelled.is_set()
    assert log.events == []


async def _nothing() -> None:
    return None
