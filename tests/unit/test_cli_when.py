"""Times on the command line (`runyard.cli.when`): spans ago, ISO 8601, replay points."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import typer
from runyard.cli.when import parse_when, replay_point

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_a_span_is_that_long_before_now() -> None:
    assert parse_when("90s", now=NOW) == "2026-12-01T11:58:30+00:00"
    assert parse_when("2d", now=NOW) == "2026-11-29T12:00:00+00:00"
    assert parse_when(" 1h ", now=NOW) == "2026-12-01T11:00:00+00:00"


@pytest.mark.parametrize("text", ["now", " NOW ", "Now"])
def test_now_is_now(text: str) -> None:
    assert parse_when(text, now=NOW) == replay_point(text, now=NOW) == NOW.isoformat()


def test_an_iso_time_without_a_zone_is_utc() -> None:
    assert parse_when("2026-12-01T10:00", now=NOW) == "2026-12-01T10:00:00+00:00"
    assert parse_when("2026-12-01T18:00+08:00", now=NOW) == "2026-12-01T18:00:00+08:00"


@pytest.mark.parametrize("text", ["9999999999d", "999999d", "99999999999999999999h"])
def test_a_span_past_year_one_is_a_clear_error(text: str) -> None:
    with pytest.raises(typer.BadParameter, match="before year 1: give a shorter span"):
        parse_when(text, now=NOW)
    with pytest.raises(typer.BadParameter, match="before year 1"):
        replay_point(text, now=NOW)


def test_anything_else_is_refused_with_the_forms_it_takes() -> None:
    with pytest.raises(typer.BadParameter, match="give 30m, 1h, 2d, now or an ISO 8601 time"):
        parse_when("yesterday", now=NOW)


def test_a_replay_point_keeps_positions_and_times_for_the_gateway() -> None:
    assert replay_point("30m", now=NOW) == "2026-12-01T11:30:00+00:00"
    assert replay_point("1234", now=NOW) == "1234"  # digits alone: a position
    assert replay_point("2026-12-01T10:00:00Z", now=NOW) == "2026-12-01T10:00:00Z"
    assert replay_point("yesterday", now=NOW) == "yesterday"  # the gateway says why not
    # without a zone: UTC, as every other time of the CLI
    assert replay_point("2026-12-01T10:00:00", now=NOW) == "2026-12-01T10:00:00+00:00"
    assert replay_point("2026-12-01T18:00+08:00", now=NOW) == "2026-12-01T18:00+08:00"
