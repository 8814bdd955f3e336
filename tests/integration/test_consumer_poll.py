"""How a consumer waits for events, over a real broker and Postgres: after a poll
that found nothing it polls again at once (the poll itself waits for records up
to its timeout), and a batch is handed to the handler without a worker thread.

FastStream's batch subscriber pauses for its whole batch timeout after an empty
poll, and an event arriving during the pause waited it out; its context lookup
of the message ran on a worker thread once per batch."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import fast_depends.utils
import pytest
from runyard.eventstore import PostgresEventStore
from runyard.messaging import KafkaSettings

from tests.contract.sample_events import happened, sample_mapper
from tests.integration.test_relay import running_consumer, running_relay, wait_until

pytestmark = pytest.mark.integration


async def test_an_idle_consumer_takes_an_event_without_a_pause_or_a_thread(
    dsn: str, kafka: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    pause = kafka.fetch_max_wait_ms / 1000  # the batch timeout
    pauses: list[float] = []
    threaded: list[object] = []
    sleep, in_thread = anyio.sleep, fast_depends.utils.run_in_threadpool

    async def recorded_sleep(delay: float, *args: Any, **kwargs: Any) -> Any:
        if delay == pause:
            pauses.append(delay)
        return await sleep(delay, *args, **kwargs)

    async def recorded_thread(func: Any, *args: Any, **kwargs: Any) -> Any:
        threaded.append(func)
        return await in_thread(func, *args, **kwargs)

    monkeypatch.setattr(anyio, "sleep", recorded_sleep)
    monkeypatch.setattr(fast_depends.utils, "run_in_threadpool", recorded_thread)
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    try:
        async with running_consumer(dsn, kafka, name="poll") as (consumer, collector):
            client = consumer._subscriber.consumer
            polls = {"empty": 0}
            getmany = client.getmany

            async def counted(*args: Any, **kwargs: Any) -> Any:
                polled = await getmany(*args, **kwargs)
                polls["empty"] += not polled
                return polled

            client.getmany = counted
            await wait_until(lambda: polls["empty"] >= 3, within=60)
            await store.append("test-poll", [happened(1)])
            async with running_relay(store, kafka):
                await wait_until(lambda: consumer.stats.processed >= 1, within=60)
            await asyncio.sleep(3 * pause)  # more empty polls after the event
    finally:
        await store.close()
    assert [e.event.n for e in collector.seen] == [1]  # type: ignore[attr-defined]
    assert pauses == [], "the subscriber paused after an empty poll"
    assert threaded == [], "a batch went through a worker thread"
