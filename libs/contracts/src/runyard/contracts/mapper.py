"""Turn event models into stored bytes and back, upcasting old versions.

The event store only sees `(type, schema_version, json)`. This module owns the
registry of event classes by type name and the chain of upcasters that lift a
stored payload from the version it was written with to the version the code
knows today. The log is forever: an event written by an old release must still
load, so a breaking change to an event adds an upcaster instead of a migration.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from runyard.contracts.base import Event

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


class UnknownEventType(LookupError):
    """A stored event names a type this code has no model for."""

    def __init__(self, type_name: str) -> None:
        super().__init__(f"no event model registered for type {type_name!r}")
        self.type_name = type_name


class EventMapper:
    """Registry of event models and upcasters; encodes and decodes payloads."""

    def __init__(self, models: Iterable[type[Event]] = ()) -> None:
        self._models: dict[str, type[Event]] = {}
        self._current: dict[str, tuple[type[Event], int]] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        for model in models:
            self.register(model)

    def register(self, model: type[Event]) -> None:
        name = model.type_name()
        known = self._models.get(name)
        if known is not None and known is not model:
            raise ValueError(f"event type {name!r} registered twice")
        self._models[name] = model
        self._current[name] = (model, model.schema_version)

    def register_upcaster(self, type_name: str, from_version: int, upcaster: Upcaster) -> None:
        """`upcaster` turns a payload of `from_version` into one of `from_version + 1`."""
        self._upcasters[(type_name, from_version)] = upcaster

    def model(self, type_name: str) -> type[Event]:
        try:
            return self._models[type_name]
        except KeyError:
            raise UnknownEventType(type_name) from None

    @property
    def models(self) -> dict[str, type[Event]]:
        return dict(self._models)

    @property
    def current(self) -> Mapping[str, tuple[type[Event], int]]:
        """Each type name's model and its schema version, as kept (not a copy): for
        a reader that decodes many rows and looks each type up itself."""
        return self._current

    def encode(self, event: Event) -> tuple[str, int, str]:
        """(type name, schema version, JSON text) for storage."""
        return event.type_name(), event.schema_version, event.model_dump_json()

    def decode(self, type_name: str, schema_version: int, data: str | bytes) -> Event:
        model = self.model(type_name)
        if schema_version == model.schema_version:
            return model.model_validate_json(data)
        payload: dict[str, Any] = json.loads(data)
        return model.model_validate(self.upcast(type_name, schema_version, payload))

    def upcast(
        self, type_name: str, schema_version: int, payload: dict[str, Any]
    ) -> dict[str, Any]:
        target = self.model(type_name).schema_version
        if schema_version > target:
            raise ValueError(
                f"{type_name} v{schema_version} is newer than this code (v{target});"
                " upgrade Runyard"
            )
        version = schema_version
        while version < target:
            step = self._upcasters.get((type_name, version))
            if step is None:
                raise ValueError(f"no upcaster for {type_name} from v{version} to v{version + 1}")
            payload = step(payload)
            version += 1
        return payload
