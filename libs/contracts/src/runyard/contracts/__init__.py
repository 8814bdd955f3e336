"""Event contracts: the payload base, the envelope and the mapper.

Task and pool event models live in `runyard.contracts.task_events` and
`runyard.contracts.pool_events`; `default_mapper()` knows all of them.
"""

from runyard.contracts.base import Event
from runyard.contracts.envelope import (
    Metadata,
    NewEvent,
    RecordedEvent,
    new_event_id,
    stream_category,
    utcnow,
)
from runyard.contracts.mapper import EventMapper, UnknownEventType, Upcaster
from runyard.contracts.registry import all_event_models, default_mapper

__all__ = [
    "Event",
    "EventMapper",
    "Metadata",
    "NewEvent",
    "RecordedEvent",
    "UnknownEventType",
    "Upcaster",
    "all_event_models",
    "default_mapper",
    "new_event_id",
    "stream_category",
    "utcnow",
]
