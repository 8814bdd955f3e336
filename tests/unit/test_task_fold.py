"""The fold's speed-ups keep its results: the specialised `replace` of the task's state
classes and the version stamped in place give, over random valid histories, every
intermediate state the generic `dataclasses.replace` gives, and never change a state
that was already answered."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runyard.contracts.base import Event
from runyard.contracts.spec import TaskSpec
from runyard.domain import TaskState, evolve, fold
from runyard.domain import task as domain

from tests.unit.test_task_domain import PROPERTIES, Story, specs, walk


def generic_replace(obj: Any, /, **changes: Any) -> Any:
    return dataclasses.replace(obj, **changes)


def generic_stamp(new: TaskState, version: int, before: TaskState | None) -> TaskState:
    return dataclasses.replace(new, version=version)


@contextmanager
def generic_fold() -> Iterator[None]:
    """The fold as it was: `dataclasses.replace` for every change, the version too."""
    with (
        patch.object(domain, "_replace", generic_replace),
        patch.object(domain, "_stamped", generic_stamp),
    ):
        yield


def states(events: list[tuple[Event, datetime]]) -> list[TaskState]:
    answered: list[TaskState] = []
    state: TaskState | None = None
    for event in events:
        state = evolve(state, event)
        answered.append(state)
    return answered


@PROPERTIES
@given(spec=specs, data=st.data())
def test_the_fold_gives_the_generic_replaces_states(spec: TaskSpec, data: st.DataObject) -> None:
    events = walk(spec, data)
    fast = states(events)
    with generic_fold():
        slow = states(events)
        assert fold(events) == slow[-1]
    assert fast == slow
    # each state keeps its own version: stamping in place touched no state answered before
    assert [s.version for s in fast] == list(range(1, len(events) + 1))
    assert fold(events) == fast[-1]


def test_the_specialised_replace_is_the_generic_one() -> None:
    state = Story().running().state
    for changes in ({}, {"hangs": 3}, {"status": "failed", "restarts": 1, "placement": None}):
        assert domain._replace(state, **changes) == dataclasses.replace(state, **changes)
    worker = state.workers[0]
    assert domain._replace(worker, exit_code=1) == dataclasses.replace(worker, exit_code=1)
    with pytest.raises(TypeError, match="no field"):
        domain._replace(state, nope=1)


def test_an_unchanged_state_is_copied_before_its_version_changes() -> None:
    story = Story().running()
    before = story.state
    observed = domain._unchanged(before, story.events[-1][0], story.now)
    assert observed is before
    after = domain._stamped(observed, before.version + 1, before)
    assert after is not before and before.version == len(story.events)
    assert after.version == before.version + 1
