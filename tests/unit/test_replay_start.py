"""Where the relay starts again after the broker lost its memory (pure)."""

from __future__ import annotations

from runyard.messaging.positions import replay_start

T, P = "task", "pool"


def test_nobody_lagging_replays_nothing() -> None:
    published = {(T, 0): 90, (T, 1): 100}
    confirmed = {"scheduler": {(T, -1): 0, (T, 0): 90, (T, 1): 100}}
    assert replay_start(published, confirmed, upto=100) == 100


def test_the_lowest_lag_of_any_group_in_any_partition() -> None:
    published = {(T, 0): 90, (T, 1): 100, (P, 0): 95}
    confirmed = {
        "scheduler": {(T, -1): 0, (P, -1): 0, (T, 0): 90, (T, 1): 70, (P, 0): 95},
        "deployer": {(T, -1): 0, (T, 0): 80, (T, 1): 100},
    }
    assert replay_start(published, confirmed, upto=100) == 70


def test_an_idle_partition_does_not_hold_the_start_back() -> None:
    # Partition 0 got nothing after 10; the group handled all of it.
    published = {(T, 0): 10, (T, 1): 5000}
    confirmed = {"deployer": {(T, 0): 10, (T, 1): 4990}}
    assert replay_start(published, confirmed, upto=5000) == 4990


def test_a_partition_a_group_never_received_from_counts_from_zero() -> None:
    published = {(T, 0): 10, (P, 2): 40}
    confirmed = {"scheduler": {(T, -1): 0, (P, -1): 0, (T, 0): 10}}
    assert replay_start(published, confirmed, upto=50) == 0


def test_topics_a_group_does_not_follow_are_not_its_concern() -> None:
    published = {(T, 0): 10, (P, 0): 40}
    confirmed = {"notification": {(T, -1): 0, (T, 0): 10}}
    assert replay_start(published, confirmed, upto=40) == 40
