"""`runyard dead-letters` and `runyard projections` on the real Postgres and broker:
an event the relay dead-lettered is listed with its reason and, once retried,
reaches a consumer once; every reader shows its position and a lag that drops
to 0 when it has caught up."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from runyard.cli.main import app as cli_app
from runyard.eventstore import PostgresEventStore
from runyard.messaging import KafkaSettings
from runyard.relay import OutboxRelay
from typer.testing import CliRunner, Result

from tests.contract.sample_events import happened, sample_mapper
from tests.integration.test_relay import (
    checkpoint_reaches,
    renamed,
    running_consumer,
    wait_until,
)

pytestmark = pytest.mark.integration


async def _cli(kafka: KafkaSettings, dsn: str, *args: str) -> Result:
    argv = [*args, "--bootstrap", kafka.bootstrap, "--dsn", dsn]
    env = {"RUNYARD_TOPIC_PREFIX": kafka.topics.prefix}
    return await asyncio.to_thread(CliRunner().invoke, cli_app, argv, env=env)


@contextlib.asynccontextmanager
async def relaying(
    store: PostgresEventStore, kafka: KafkaSettings, **options: Any
) -> AsyncIterator[OutboxRelay]:
    """A relay that runs until it has published the whole log, then stops."""
    relay = OutboxRelay(store, kafka, broker_check_interval=0.2, **options)
    task = asyncio.create_task(relay.run())
    try:
        yield relay
        await checkpoint_reaches(store, await store.head_position())
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_dead_lettered_event_is_listed_and_a_retry_reaches_a_consumer_once(
    dsn: str, kafka: KafkaSettings
) -> None:
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    await store.append("test-1", [happened(1)])
    await store.append("test-2", [renamed("a" * 10_000)])
    await store.append("test-3", [happened(3)])
    async with running_consumer(dsn, kafka) as (consumer, collector):
        async with relaying(store, kafka, max_message_bytes=4096):
            await wait_until(lambda: consumer.stats.processed == 2, within=60)

        listed = await _cli(kafka, dsn, "dead-letters", "--json")
        assert listed.exit_code == 0, listed.output
        (letter,) = json.loads(listed.stdout)
        assert (letter["source"], letter["stream_id"], letter["type"]) == (
            "relay",
            "test-2",
            "Renamed",
        )
        assert (letter["stream_version"], letter["global_position"]) == (1, 2)
        assert "MessageSizeTooLarge" in letter["reason"]
        table = await _cli(kafka, dsn, "dead-letters")
        assert letter["event_id"] in table.stdout and "MessageSizeTooLarge" in table.stdout

        # The cause is not fixed yet (the broker still takes 4 KiB): the retry says why.
        refused = await _cli(
            kafka, dsn, "dead-letters", "--retry", letter["event_id"], "--max-message-bytes", "4096"
        )
        assert refused.exit_code == 1
        assert "not published" in refused.output and "MessageSizeTooLarge" in refused.output

        for _ in range(2):  # a second retry is skipped by the consumer's inbox
            sent = await _cli(kafka, dsn, "dead-letters", "--retry", letter["event_id"])
            assert sent.exit_code == 0, sent.output
            assert f"published {letter['event_id']}" in sent.stdout
        await wait_until(lambda: consumer.stats.processed == 3, within=60)
        await wait_until(lambda: consumer.stats.duplicates >= 1, within=60)
    firsts = [getattr(e.event, "first", None) for e in collector.seen]
    assert firsts.count("a" * 10_000) == 1
    missing = await _cli(
        kafka, dsn, "dead-letters", "--retry", "00000000-0000-0000-0000-000000000000"
    )
    assert missing.exit_code == 1 and "no event with this id" in missing.output
    await store.close()


async def _progress(
    kafka: KafkaSettings, dsn: str, until: Any = lambda _: True
) -> dict[str, dict[str, Any]]:
    """`runyard projections --json` by reader, once `until` holds for it (a consumer
    saves its positions in the transaction of its batch, just after handling it)."""
    for _ in range(100):
        shown = await _cli(kafka, dsn, "projections", "--json")
        assert shown.exit_code == 0, shown.output
        found = {p["name"]: p for p in json.loads(shown.stdout)}
        if until(found):
            break
        await asyncio.sleep(0.2)
    return found


async def test_projections_show_each_reader_and_a_lag_that_drops_to_zero(
    dsn: str, kafka: KafkaSettings
) -> None:
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    for n in range(1, 4):
        await store.append(f"test-{n}", [happened(n)])
    async with store.pool.acquire() as conn:  # a read model one event in
        await conn.execute("INSERT INTO checkpoints (name, position) VALUES ('task_list', 1)")
    async with running_consumer(dsn, kafka) as (consumer, _):
        async with relaying(store, kafka):
            await wait_until(lambda: consumer.stats.processed == 3, within=60)
        for n in range(4, 6):  # appended while the relay is away
            await store.append(f"test-{n}", [happened(n)])
        behind = await _progress(kafka, dsn, lambda f: f.get("collector", {}).get("position") == 3)
        assert behind["task_list"] | {"updated_at": None} == {
            "name": "task_list",
            "kind": "checkpoint",
            "position": 1,
            "log_end": 5,
            "lag": 4,
            "updated_at": None,
            "last_error": None,
            "partitions": {},
        }
        assert (behind["relay"]["position"], behind["relay"]["lag"]) == (3, 2)
        assert (behind["collector"]["kind"], behind["collector"]["lag"]) == ("consumer", 2)

        async with relaying(store, kafka):
            await wait_until(lambda: consumer.stats.processed == 5, within=60)
        async with store.pool.acquire() as conn:
            await conn.execute("UPDATE checkpoints SET position = 5 WHERE name = 'task_list'")
        caught_up = await _progress(kafka, dsn, lambda f: f.get("collector", {}).get("lag") == 0)
    assert {name: p["lag"] for name, p in caught_up.items()} == {
        "task_list": 0,
        "relay": 0,
        "collector": 0,
    }
    assert caught_up["collector"]["position"] == caught_up["collector"]["log_end"] == 5
    shown = await _cli(kafka, dsn, "projections", "--no-broker")
    assert "collector" in shown.stdout and "task_list" in shown.stdout
    await store.close()
