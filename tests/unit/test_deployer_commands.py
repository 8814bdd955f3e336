"""The deployer's commands on the wire (`runyard.contracts.commands`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from runyard.contracts.commands import CaptureStacks, parse_command

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


def capture(**changes: object) -> CaptureStacks:
    fields: dict[str, object] = {
        "task_id": "t1",
        "run": 1,
        "attempt": 2,
        "report_id": "r1",
        "reason": "request",
        "requested_at": T0,
        "expires_at": T0 + timedelta(seconds=20),
        "actor": "user:acme/alice",
        "causation_id": "req-1",
        "correlation_id": "req-1",
        "trace_context": {"traceparent": "00-abc-def-01"},
    }
    return CaptureStacks.model_validate({**fields, **changes})


def test_a_command_comes_back_as_sent() -> None:
    command = capture()
    assert parse_command(command.to_bytes()) == command


def test_what_follows_a_command_carries_its_asker_and_cause() -> None:
    meta = capture().metadata()
    assert (meta.actor, meta.causation_id, meta.correlation_id) == (
        "user:acme/alice",
        "req-1",
        "req-1",
    )
    assert meta.trace_context == {"traceparent": "00-abc-def-01"}


def test_a_command_expires_when_its_asker_stops_waiting() -> None:
    command = capture()
    assert not command.expired(T0 + timedelta(seconds=19))
    assert command.expired(T0 + timedelta(seconds=20))


def test_anything_else_on_the_topic_is_skipped() -> None:
    for raw in (None, b"", b"not json", b"[]", b'{"type": "Nope", "data": {}}'):
        assert parse_command(raw) is None
    broken = b'{"type": "CaptureStacks", "data": {"task_id": "t1"}}'
    assert parse_command(broken) is None
