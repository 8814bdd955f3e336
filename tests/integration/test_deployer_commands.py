"""The deployer's command reader (`follow_commands`) on the real broker."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from runyard.contracts.commands import (
    DEPLOYER_COMMANDS,
    DEPLOYER_COMMANDS_PARTITIONS,
    CaptureStacks,
)
from runyard.contracts.envelope import utcnow
from runyard.deployer.main import ensure_command_topic, follow_commands
from runyard.messaging import KafkaSettings

from tests.integration.test_relay import wait_until

pytestmark = pytest.mark.integration

GROUP = "deployer-commands"


class Doer:
    """Stands in for `DeployerApp`: the commands it was asked to carry out."""

    def __init__(self) -> None:
        self.done: list[str] = []

    async def capture_stacks(self, command: CaptureStacks) -> None:
        self.done.append(command.report_id)


def capture(n: int) -> CaptureStacks:
    now = utcnow()
    return CaptureStacks(
        actor="service:faulttolerance",
        requested_at=now,
        expires_at=now + timedelta(minutes=5),
        task_id=f"t{n}",
        run=1,
        attempt=1,
        report_id=f"r{n}",
        reason="request",
    )


async def test_commands_sent_after_a_broker_lost_its_memory_are_carried_out(
    kafka: KafkaSettings,
) -> None:
    """The group's committed offsets are past the topic's end, as after a broker that
    lost its data while the deployer kept its offset: the broker answers such fetches
    with nothing. The reader sees its position past the end and reads the topic from
    its start, so commands sent since the loss are carried out, not skipped."""
    await ensure_command_topic(kafka)
    topic = kafka.topics.name(DEPLOYER_COMMANDS)
    ahead = AIOKafkaConsumer(**kafka.client_options(), group_id=kafka.topics.prefix + GROUP)
    await ahead.start()
    try:
        every = [TopicPartition(topic, p) for p in range(DEPLOYER_COMMANDS_PARTITIONS)]
        ahead.assign(every)
        await ahead.commit({tp: 50 for tp in every})
    finally:
        await ahead.stop()
    producer = AIOKafkaProducer(**kafka.client_options())
    await producer.start()
    try:
        for n in range(8):
            command = capture(n)
            await producer.send(topic, command.to_bytes(), key=command.task_id.encode())
        await producer.flush()
    finally:
        await producer.stop()
    doer = Doer()
    reader = asyncio.create_task(follow_commands(doer, kafka, GROUP))  # type: ignore[arg-type]
    try:
        await wait_until(lambda: len(doer.done) >= 8, within=60)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    assert sorted(doer.done) == sorted(f"r{n}" for n in range(8))
