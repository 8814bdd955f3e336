"""Offset commits at most once per interval (`runyard.messaging.commits`) on the real
broker: many handled batches make one commit, only handled offsets are committed
(never the consumer's position, which runs ahead), an idle reader's last batch is
committed within an interval, and `close` commits what is pending."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from runyard.messaging import KafkaSettings
from runyard.messaging.commits import OffsetCommits

from tests.conftest import QUICK_GROUP
from tests.integration.test_relay import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
async def consumer(kafka: KafkaSettings) -> AsyncIterator[tuple[AIOKafkaConsumer, TopicPartition]]:
    """A group member holding every partition of the logs topic, 10 messages in
    partition 0, all fetched (its position is past them)."""
    topic = kafka.topics.logs
    producer = AIOKafkaProducer(**kafka.client_options())
    await producer.start()
    try:
        for n in range(10):
            await producer.send_and_wait(topic, f"m{n}".encode(), partition=0)
    finally:
        await producer.stop()
    member = AIOKafkaConsumer(
        topic,
        **kafka.client_options(),
        group_id=f"{kafka.topics.prefix}commits-{uuid.uuid4().hex[:6]}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **QUICK_GROUP,
    )
    await member.start()
    tp = TopicPartition(topic, 0)
    try:
        taken: list[bytes] = []
        while len(taken) < 10:
            polled = await member.getmany(tp, timeout_ms=500)
            taken += [m.value for m in polled.get(tp, [])]
        assert await member.position(tp) == 10
        yield member, tp
    finally:
        await member.stop()


async def test_handled_batches_make_one_commit_of_what_was_handled(
    consumer: tuple[AIOKafkaConsumer, TopicPartition],
) -> None:
    member, tp = consumer
    commits = OffsetCommits("test", interval_s=0.5)
    await commits.handled(member, {tp: 1})
    await wait_until(lambda: commits.commits == 1, within=5)  # the first: at once
    for offset in range(2, 8):  # six more batches of one message, handled meanwhile
        await commits.handled(member, {tp: offset})
    assert commits.commits == 1, "they wait for the interval"
    await wait_until(lambda: commits.commits == 2, within=5)
    assert await member.committed(tp) == 7, "the last handled offset, not the position (10)"
    assert commits.failures == 0
    await commits.close()
    assert commits.commits == 2, "nothing was pending"


async def test_an_idle_reader_commits_its_last_batch_and_close_commits_what_is_pending(
    consumer: tuple[AIOKafkaConsumer, TopicPartition],
) -> None:
    member, tp = consumer
    commits = OffsetCommits("test", interval_s=60)
    await commits.handled(member, {tp: 3})
    await wait_until(lambda: commits.commits == 1, within=5)  # the first: at once
    await commits.handled(member, {tp: 5})
    await commits.handled(member, {tp: 4})  # an older offset never moves it back
    assert await member.committed(tp) == 3, "the next commit waits for the interval"
    await commits.close()
    assert await member.committed(tp) == 5
    assert commits.commits == 2


async def test_no_interval_commits_every_batch_before_it_returns(
    consumer: tuple[AIOKafkaConsumer, TopicPartition],
) -> None:
    member, tp = consumer
    commits = OffsetCommits("test", interval_s=0)
    for offset in (2, 6):
        await commits.handled(member, {tp: offset})
        assert await member.committed(tp) == offset
    assert commits.commits == 2


async def test_partitions_no_longer_held_are_not_committed(
    consumer: tuple[AIOKafkaConsumer, TopicPartition],
) -> None:
    member, tp = consumer
    commits = OffsetCommits("test", interval_s=0)
    elsewhere = TopicPartition("not-held", 0)
    await commits.handled(member, {elsewhere: 4})
    assert commits.commits == 0
    await commits.handled(member, {elsewhere: 5, tp: 9})
    assert await member.committed(tp) == 9
    assert (commits.commits, commits.failures) == (1, 0)
