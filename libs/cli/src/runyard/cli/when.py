"""Times on the command line: `30m`, `1h`, `2d` (that long ago), `now` or ISO 8601.

`runyard audit --since`, `runyard logs --since/--until`, `runyard whatif --from`
and the replay points (`runyard show --at`, `runyard diff --from/--to`,
`runyard pools --at`) read them here and send the gateway an ISO 8601 time with
a zone.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import typer

_RELATIVE = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def ago(text: str, *, now: datetime | None = None) -> str | None:
    """`30m`, `1h`, `2d` as the ISO 8601 time that long before `now` (`now` itself for
    `now`); None when `text` is not of that form; `typer.BadParameter` for a span that
    reaches before year 1."""
    if text.strip().lower() == "now":
        return (now or datetime.now(UTC)).isoformat()
    match = _RELATIVE.match(text.strip())
    if match is None:
        return None
    try:
        return ((now or datetime.now(UTC)) - _span(match)).isoformat()
    except OverflowError:
        raise typer.BadParameter(
            f"{text.strip()[:64]!r} reaches back before year 1: give a shorter span "
            "(e.g. 30d) or an ISO 8601 time"
        ) from None


def _span(match: re.Match[str]) -> timedelta:
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def parse_when(text: str | None, *, now: datetime | None = None) -> str | None:
    """`30m`, `1h`, `2d` (that long ago), `now` or an ISO 8601 time (UTC when it has no
    zone), as ISO 8601 with a zone; `typer.BadParameter` otherwise."""
    if text is None:
        return None
    if (relative := ago(text, now=now)) is not None:
        return relative
    try:
        at = datetime.fromisoformat(text)
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r}: give 30m, 1h, 2d, now or an ISO 8601 time") from exc
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).isoformat()


def replay_point(text: str, *, now: datetime | None = None) -> str:
    """A replay point as the gateway takes it: `30m`, `1h`, `2d` become the time that
    long ago, `now` the time now, an ISO 8601 time without a zone is UTC (as
    `parse_when` reads it); a position (digits) or anything else goes as given (the
    gateway checks it and says what is wrong)."""
    relative = ago(text, now=now)
    if relative is not None:
        return relative
    if text.strip().isdigit():
        return text
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        return text
    return at.replace(tzinfo=UTC).isoformat() if at.tzinfo is None else text
