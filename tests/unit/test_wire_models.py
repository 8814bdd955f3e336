"""The HTTP API's models (runyard.contracts.http) name what the rest of Runyard names:
task statuses, roles, what a rerun may change, and the error body every edge answers."""

from __future__ import annotations

from typing import get_args

from runyard.api.auth import ROLES
from runyard.api.errors import NotFound
from runyard.contracts import http as wire
from runyard.contracts.requests import RerunChanges
from runyard.domain import RERUN_CHANGEABLE, TaskStatus


def test_statuses_roles_and_rerun_changes_are_the_domains() -> None:
    assert get_args(wire.TaskStatus) == get_args(TaskStatus)
    assert get_args(wire.Role) == ROLES
    assert set(RerunChanges.model_fields) == RERUN_CHANGEABLE


def test_every_refusal_reads_as_the_error_model() -> None:
    refused = NotFound("task_not_found", "task 'x' does not exist", "check the task id")
    refused.extra = {"item": 3}
    error = wire.Error.model_validate(refused.to_dict())
    assert (error.code, error.field, error.hint) == ("task_not_found", "", "check the task id")
    assert error.model_extra == {"item": 3}
    assert error.model_dump() == refused.to_dict()  # read and written back unchanged
