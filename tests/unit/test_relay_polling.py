"""How often the relay reads an empty log again: fast right after events, slowly
once quiet while Postgres announces appends, and every 25 ms while it cannot."""

from __future__ import annotations

from typing import Any, cast

from runyard.eventstore.appended import NOTIFY_AFTER_QUIET_S
from runyard.messaging import KafkaSettings
from runyard.relay import OutboxRelay


def _relay() -> OutboxRelay:
    return OutboxRelay(cast(Any, None), KafkaSettings())


def test_the_relay_polls_fast_after_events_then_slowly_while_it_listens() -> None:
    relay = _relay()
    assert relay.idle_poll(0.0, listening=True) == relay.poll_interval == 0.005
    assert relay.idle_poll(relay.quiet_after_s, listening=True) == 0.005
    assert relay.idle_poll(relay.quiet_after_s + 0.01, listening=True) == 0.1
    assert relay.idle_poll(60.0, listening=True) == relay.listened_poll_interval


def test_a_relay_that_cannot_listen_polls_every_25_ms_once_quiet() -> None:
    relay = _relay()
    assert relay.idle_poll(0.1, listening=False) == 0.005
    assert relay.idle_poll(60.0, listening=False) == relay.quiet_poll_interval == 0.025


def test_an_append_that_is_not_announced_comes_while_the_relay_polls_fast() -> None:
    """A store announces an append after `NOTIFY_AFTER_QUIET_S` without one; an
    append it does not announce follows its previous one (which the relay read) by
    less than that, so the relay must still be polling fast for it."""
    assert _relay().quiet_after_s > NOTIFY_AFTER_QUIET_S
