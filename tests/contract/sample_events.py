"""Small events for store and messaging tests (the real ones are in runyard.contracts)."""

from __future__ import annotations

from typing import ClassVar

from runyard.contracts import Event, EventMapper, Metadata, NewEvent, utcnow


class Happened(Event):
    category: ClassVar[str] = "test"
    n: int


class Renamed(Event):
    """v2 split `name` into `first` and `last`; v1 stored just `name`."""

    category: ClassVar[str] = "test"
    schema_version: ClassVar[int] = 2
    first: str
    last: str


def _renamed_v1_to_v2(payload: dict[str, object]) -> dict[str, object]:
    first, _, last = str(payload.pop("name")).partition(" ")
    return {**payload, "first": first, "last": last}


def sample_mapper() -> EventMapper:
    mapper = EventMapper([Happened, Renamed])
    mapper.register_upcaster("Renamed", 1, _renamed_v1_to_v2)
    return mapper


def happened(n: int, actor: str = "user:acme/alice") -> NewEvent[Happened]:
    return NewEvent(
        Happened(n=n), Metadata(actor=actor, correlation_id="corr-1"), occurred_at=utcnow()
    )
