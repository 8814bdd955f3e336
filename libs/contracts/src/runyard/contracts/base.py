"""The base every Runyard event payload derives from.

An event is a frozen pydantic model whose class name is its type name
(`TaskPlaced`) and whose `schema_version` class variable says which shape of
that type it is. Stored events are written as (type, schema_version, JSON);
`runyard.contracts.mapper` turns them back into models, upcasting older
versions first.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict


class Event(BaseModel):
    """Base of every event payload: immutable, strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Shape of this type; bump it (and register an upcaster) on a breaking change.
    schema_version: ClassVar[int] = 1
    #: Stream category this event belongs to (`task`, `pool`, ...).
    category: ClassVar[str] = ""
    #: Which service appends it, and which react to it (for the event catalogue).
    emitted_by: ClassVar[str] = ""
    reacted_by: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def type_name(cls) -> str:
        return cls.__name__

    def to_json(self) -> str:
        return self.model_dump_json()

    def payload(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
