"""Time travel over the log (R-61): a stream as it was at a point, and what changed.

A *point* is a global position of the event log (`1234`) or an instant
(`2026-12-01T10:00:00Z`, ISO 8601 with a zone). A stream *as of* a point is its
prefix: its events, in stream order, up to the last one at or before the point
(by global position, or by `occurred_at` for an instant). Folding that prefix
with the stream's own fold (`runyard.domain.fold` for a task,
`fold_pool` for a pool) gives the state it had then; nothing else is read.

A prefix is cut at the first event past the point, so a later event stamped
earlier (clocks of two services) never slips into it: the fold only ever sees
a history that really was the stream at some moment.

Pure: nothing here reads a clock or the store; points and events come in.

    ReplayRefused (a DomainError, 400)    code replay.*, the field it concerns
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from runyard.contracts.envelope import RecordedEvent
from runyard.domain.errors import DomainError

#: Points are bounded as log search times are (docs/limits.md).
EARLIEST: Final = datetime(1970, 1, 1, tzinfo=UTC)
LATEST: Final = datetime(3000, 1, 1, tzinfo=UTC)
#: A global position is a Postgres bigint.
MAX_POSITION: Final = 2**63 - 1
POINT_HINT: Final = (
    "give a global position of the log (e.g. 1234: `runyard events ID --json` gives each"
    " event's) or an ISO 8601 time with a zone (e.g. 2026-12-01T10:00:00Z)"
)

Point = int | datetime
E = TypeVar("E", bound=RecordedEvent[Any])


class ReplayRefused(DomainError):
    """A point that cannot be replayed: malformed, out of range, or not in the stream."""

    http_status = 400


@dataclass(frozen=True, slots=True)
class AsOf:
    """Where a prefix ends: the point asked for and the last event folded."""

    point: Point
    #: Global position, stream version and time of the last event of the prefix.
    position: int
    version: int
    occurred_at: datetime
    event_type: str
    #: Events in the whole stream (the prefix has `version` of them).
    stream_events: int

    def to_dict(self) -> dict[str, Any]:
        point = self.point.isoformat() if isinstance(self.point, datetime) else self.point
        return {
            "point": point,
            "position": self.position,
            "version": self.version,
            "occurred_at": self.occurred_at.isoformat(),
            "last_event": self.event_type,
            "stream_events": self.stream_events,
        }


def parse_point(text: str, field: str = "at") -> Point:
    """A global position (digits) or an ISO 8601 instant with a zone; ReplayRefused else."""
    value = text.strip()
    if value.isascii() and value.isdigit():
        position = int(value)
        if not 1 <= position <= MAX_POSITION:
            raise ReplayRefused(
                "replay.bad_point",
                f"{field}: position {value[:64]} is out of range",
                POINT_HINT,
                field,
            )
        return position
    try:
        instant = datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        raise ReplayRefused(
            "replay.bad_point",
            f"{field}: {value[:64]!r} is neither a position nor an ISO 8601 time",
            POINT_HINT,
            field,
        ) from None
    if instant.tzinfo is None:
        raise ReplayRefused(
            "replay.bad_point",
            f"{field}: {value[:64]!r} has no time zone",
            "add the zone, e.g. Z for UTC (2026-12-01T10:00:00Z) or +08:00",
            field,
        )
    if not EARLIEST <= instant <= LATEST:
        raise ReplayRefused(
            "replay.bad_point",
            f"{field}: {value[:64]!r} is outside 1970-01-01 to 3000-01-01",
            POINT_HINT,
            field,
        )
    return instant


def _at_or_before(event: RecordedEvent[Any], point: Point) -> bool:
    if isinstance(point, datetime):
        return event.occurred_at <= point
    return event.global_position <= point


def prefix(events: Iterable[E], point: Point) -> list[E]:
    """The events of one stream (in stream order) up to `point`: cut at the first past it."""
    cut: list[E] = []
    for event in events:
        if not _at_or_before(event, point):
            break
        cut.append(event)
    return cut


def check_in_log(point: Point, head: int, field: str = "at") -> None:
    """A position past the end of the log (`head`: its last position) is refused."""
    if isinstance(point, int) and point > head:
        raise ReplayRefused(
            "replay.past_end",
            f"{field}: position {point} is past the end of the log (last position {head})",
            f"give a position up to {head}, or leave `{field}` out for the current state",
            field,
        )


def stream_prefix(
    events: Sequence[E], point: Point, *, what: str, field: str = "at"
) -> tuple[list[E], AsOf]:
    """The prefix of a stream at `point` and where it ends; ReplayRefused when the
    stream had no event yet then (`what` names it: "task t-1", "pool p")."""
    cut = prefix(events, point)
    if not cut:
        first = events[0] if events else None
        since = (
            f": its first event is at position {first.global_position},"
            f" {first.occurred_at.isoformat()}"
            if first
            else ""
        )
        hint = (
            f"give a point at or after {first.occurred_at.isoformat()}"
            f" (or position {first.global_position})"
            if first
            else "check the id"
        )
        raise ReplayRefused(
            "replay.before_start", f"{field}: {what} did not exist yet then{since}", hint, field
        )
    last = cut[-1]
    as_of = AsOf(
        point,
        last.global_position,
        last.stream_version,
        last.occurred_at,
        last.type,
        len(events),
    )
    return cut, as_of


def check_order(start: Point, end: Point) -> None:
    """`from` must not come after `to` when both are positions or both are times."""
    if (isinstance(start, int) and isinstance(end, int) and start > end) or (
        isinstance(start, datetime) and isinstance(end, datetime) and start > end
    ):
        raise ReplayRefused(
            "replay.bad_range",
            "from: it comes after `to`",
            "swap --from and --to: the earlier point goes first",
            "from",
        )


@dataclass(frozen=True, slots=True)
class Change:
    """One field whose value differs between two views (a dotted path: `counters.restarts`)."""

    field: str
    before: Any
    after: Any

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "from": self.before, "to": self.after}


def flatten(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf of a JSON value as (dotted path, value); list items by index."""
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            yield from flatten(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list | tuple) and value:
        for index, item in enumerate(value):
            yield from flatten(item, f"{path}.{index}" if path else str(index))
    else:
        yield path, value


def changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Change]:
    """The leaves that differ between two JSON views, in the order of `after` (then the
    leaves only `before` had); a leaf absent on one side is None there.

    Only what differs: a leaf absent on one side and null on the other is no change,
    nor is an empty (null, `{}`, `[]`) leaf whose path has leaves on the other side
    (`placement` null, then `placement.pool`: the leaves under it are the changes)."""
    old, new = dict(flatten(before)), dict(flatten(after))
    found = [
        Change(k, old.get(k), v)
        for k, v in new.items()
        if _differs(old.get(k), v) and not _opened(k, v, old)
    ]
    found += [
        Change(k, v, None)
        for k, v in old.items()
        if k not in new and v is not None and not _opened(k, v, new)
    ]
    return found


def _differs(old: Any, new: Any) -> bool:
    return json.dumps(old, sort_keys=True, default=str) != json.dumps(
        new, sort_keys=True, default=str
    )


def _opened(path: str, value: Any, other: Mapping[str, Any]) -> bool:
    """An empty leaf (null, {}, []) where the other view has leaves under its path."""
    if value not in (None, {}, [], ()):
        return False
    return any(key.startswith(f"{path}.") for key in other)


__all__ = [
    "EARLIEST",
    "LATEST",
    "MAX_POSITION",
    "AsOf",
    "Change",
    "Point",
    "ReplayRefused",
    "changes",
    "check_in_log",
    "check_order",
    "flatten",
    "parse_point",
    "prefix",
    "stream_prefix",
]
