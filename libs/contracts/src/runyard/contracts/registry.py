"""The mapper every Runyard process uses: all event models and their upcasters.

A process that reads the log must know every type that can be in it, so one
function lists them (`all_event_models`) and one builds the mapper from that
list (`default_mapper`). A new category of events adds its tuple to
`all_event_models` and its upcasters to `all_upcasters`.
"""

from __future__ import annotations

from runyard.contracts.admin_events import ACCESS_EVENTS, CATALOGUE_EVENTS
from runyard.contracts.base import Event
from runyard.contracts.mapper import EventMapper, Upcaster
from runyard.contracts.pool_events import POOL_EVENTS
from runyard.contracts.task_events import TASK_EVENTS, TASK_UPCASTERS


def all_event_models() -> tuple[type[Event], ...]:
    """Every event model Runyard can store, grouped by category."""
    return TASK_EVENTS + POOL_EVENTS + ACCESS_EVENTS + CATALOGUE_EVENTS


def all_upcasters() -> tuple[tuple[str, int, Upcaster], ...]:
    """(type name, from version, upcaster) for every older event shape still readable."""
    return TASK_UPCASTERS


def default_mapper() -> EventMapper:
    """A mapper that knows every event model and can upcast every older version."""
    mapper = EventMapper(all_event_models())
    for type_name, from_version, upcaster in all_upcasters():
        mapper.register_upcaster(type_name, from_version, upcaster)
    return mapper
