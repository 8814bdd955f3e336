"""The pure parts of `runyard dead-letters` and `runyard projections`: reading a
dead-letter message of either source, and the partition the producer picks."""

from __future__ import annotations

import json

from aiokafka.partitioner import DefaultPartitioner
from runyard.messaging.deadletters import parse_dead_letter
from runyard.messaging.progress import partition_of


def test_a_relay_reference_lists_its_event_and_reason() -> None:
    reference = {
        "event_id": "e1",
        "stream_id": "task-1",
        "stream_version": 3,
        "global_position": 42,
        "type": "TaskSubmitted",
        "size": 2_000_000,
        "reason": "relay could not publish: MessageSizeTooLargeError",
    }
    headers = {"source": "relay", "reason": str(reference["reason"])}
    letter = parse_dead_letter(1, 7, 0, headers, json.dumps(reference).encode())
    assert (letter.source, letter.event_id, letter.global_position, letter.size) == (
        "relay",
        "e1",
        42,
        2_000_000,
    )
    assert letter.as_json()["parked_at"] == "1970-01-01T00:00:00+00:00"


def test_a_consumer_dead_letter_lists_the_envelope_it_parked() -> None:
    envelope = {"event_id": "e2", "stream_id": "pool-a", "stream_version": 1, "type": "PoolCreated"}
    value = json.dumps(envelope).encode()
    letter = parse_dead_letter(0, 0, 0, {"consumer": "scheduler", "reason": "boom"}, value)
    assert (letter.source, letter.reason, letter.stream_id, letter.size) == (
        "scheduler",
        "boom",
        "pool-a",
        len(value),
    )


def test_a_message_that_is_not_json_still_lists() -> None:
    letter = parse_dead_letter(0, 3, 0, {"consumer": "logs", "reason": "undecodable"}, b"\xff")
    assert (letter.source, letter.event_id, letter.global_position) == ("logs", None, None)


def test_partition_of_is_the_producers_choice() -> None:
    partitioner = DefaultPartitioner()
    for stream_id in ("task-0193", "pool-gpu-a", "test-1", "access-x"):
        expected = partitioner(stream_id.encode(), [0, 1, 2, 3], [0, 1, 2, 3])
        assert partition_of(stream_id, 4) == expected
