"""The request bodies' models (runyard.contracts.requests): what they accept, what they
pass on, and how a body that breaks one is refused (`parse_body`, which the gRPC API
and the console use; the HTTP routes answer the same through FastAPI)."""

from __future__ import annotations

from typing import Any

import pytest
from runyard.api.auth import ROLES
from runyard.api.errors import BadRequest
from runyard.api.inputs import parse_body
from runyard.contracts.requests import (
    MAX_ENV_TEXT,
    RequestBody,
    RerunChanges,
    SpecOverrides,
    TaskGroupRequest,
    TaskSubmission,
    TokenRequest,
)
from runyard.contracts.spec import MAX_GROUP_SIZE, TaskSpec
from runyard.domain import RERUN_CHANGEABLE

BASE = {"name": "n", "pool": "pool-a", "image": "img:1", "command": "python train.py"}


def refused(model: type[RequestBody], body: Any) -> dict[str, Any]:
    with pytest.raises(BadRequest) as caught:
        parse_body(model, body)
    answer = caught.value.to_dict()
    assert answer["hint"], answer
    if answer["code"] != "rerun.field_not_changeable":  # names the field in its words
        assert answer["field"] in answer["message"], answer
    return answer


def test_a_spec_is_passed_on_as_sent_in_either_env_form() -> None:
    text = parse_body(TaskSubmission, {**BASE, "env": "A=1;B=2", "creator_only": ["A"]})
    assert text.as_json() == {**BASE, "env": "A=1;B=2", "creator_only": ["A"]}
    listed = parse_body(TaskSubmission, {**BASE, "env": [{"name": "A", "value": "1"}]})
    assert listed.as_json() == {**BASE, "env": [{"name": "A", "value": "1"}]}  # no defaults


def test_the_spec_models_reuse_the_specs_fields() -> None:
    fields = set(TaskSpec.model_fields)
    assert set(TaskSubmission.model_fields) == fields | {"creator_only"}
    assert set(SpecOverrides.model_fields) == fields | {"creator_only"}
    assert not any(f.is_required() for f in SpecOverrides.model_fields.values())
    assert set(RerunChanges.model_fields) == RERUN_CHANGEABLE
    name = TaskSubmission.model_fields["name"]
    assert name.metadata == TaskSpec.model_fields["name"].metadata  # its limits


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({**BASE, "tags": ["x" * 65]}, "spec.invalid", "tags.0"),
        ({**BASE, "env": [{"name": "A" * 129}]}, "spec.invalid", "env.0.name"),
        ({**BASE, "env": "A=" + "x" * MAX_ENV_TEXT}, "spec.invalid", "env"),
        ({**BASE, "creator_only": ["A"] * 257}, "spec.invalid", "creator_only"),
        ({**BASE, "colour": "red"}, "spec.unknown_field", "colour"),
        ({"pool": "pool-a"}, "spec.invalid", "name"),
        ([BASE], "request.invalid", "body"),
    ],
)
def test_a_spec_that_breaks_the_model_is_refused_naming_the_field(
    body: Any, code: str, field: str
) -> None:
    answer = refused(TaskSubmission, body)
    assert (answer["code"], answer["field"]) == (code, field), answer


@pytest.mark.parametrize(("env", "field"), [({"A": "1"}, "env"), (5, "env"), (["A=1"], "env.0")])
def test_an_env_in_neither_form_is_refused_showing_both(env: Any, field: str) -> None:
    for model in (TaskSubmission, SpecOverrides):
        answer = refused(model, {**BASE, "env": env})
        assert (answer["code"], answer["field"]) == ("spec.invalid", field), answer
        assert "{name, value}" in answer["message"], answer
        assert '"env": "A=1;B=2"' in answer["hint"], answer


@pytest.mark.parametrize("field", ["tags", "creator_only", "output_dirs"])
def test_a_word_where_a_list_goes_is_asked_for_as_a_list(field: str) -> None:
    """`tags: exp1` in a task file: a list is asked for in the words of YAML and JSON,
    not as pydantic's "a valid tuple"."""
    for model in (TaskSubmission, SpecOverrides):
        answer = refused(model, {**BASE, field: "exp1"})
        assert (answer["code"], answer["field"]) == ("spec.invalid", field), answer
        assert answer["message"] == f"{field}: should be a list", answer
        assert "[a, b]" in answer["hint"] and "tuple" not in str(answer), answer


def test_an_unknown_field_is_answered_with_the_names_of_the_object_holding_it() -> None:
    nested = refused(TaskSubmission, {**BASE, "fault_tolerance": {"hang_timout_s": 60}})
    assert nested["field"] == "fault_tolerance.hang_timout_s"
    assert nested["hint"].startswith("did you mean hang_timeout_s? check the field name: ")
    assert "max_restarts" in nested["hint"] and "worker_count" not in nested["hint"]
    volume = {"file_system": "fs", "volume": "v", "mount_path": "/d", "pth": "x"}
    mount = refused(TaskSubmission, {**BASE, "mounts": [volume]})
    assert mount["field"] == "mounts.0.pth"
    assert mount["hint"] == "check the field name: file_system, volume, mount_path, read_only"
    top = refused(TaskSubmission, {**BASE, "imag": "img:2"})
    assert top["hint"].startswith("did you mean image? ") and "worker_count" in top["hint"]
    # What other platforms call a field: its name here.
    assert refused(TaskSubmission, {**BASE, "workers": 2})["hint"].startswith(
        "did you mean worker_count? "
    )
    assert refused(TaskSubmission, {**BASE, "colour": "red"})["hint"].startswith(
        "check the field name: name, "
    )
    group = refused(
        TaskGroupRequest, {"template": {**BASE, "fault_tolerance": {"envcheck": 1}}, "items": [{}]}
    )
    assert group["field"] == "template.fault_tolerance.envcheck"
    assert group["hint"].startswith("did you mean env_check? ")


def test_rerun_changes_name_what_only_a_clone_may_change() -> None:
    answer = refused(RerunChanges, {"pool": "pool-b"})
    assert answer == {
        "code": "rerun.field_not_changeable",
        "field": "pool",
        "message": "a rerun with changes cannot change the pool",
        "hint": "use clone to change the pool",
    }
    assert refused(RerunChanges, {"colour": 1})["code"] == "spec.unknown_field"
    assert refused(RerunChanges, {"worker_count": 0})["field"] == "worker_count"
    assert parse_body(RerunChanges, {"worker_spec": None}).as_json() == {"worker_spec": None}


def test_a_group_names_its_item_and_its_size() -> None:
    item = refused(TaskGroupRequest, {"template": BASE, "items": [{}, {"name": 5}]})
    assert (item["code"], item["field"], item["item"]) == ("spec.invalid", "items[1].name", 1)
    assert refused(TaskGroupRequest, {"template": BASE, "items": [{}, 5]})["field"] == "items[1]"
    template = refused(TaskGroupRequest, {"template": {**BASE, "name": ""}, "items": [{}]})
    assert (template["code"], template["field"]) == ("spec.invalid", "template.name")
    sizes: list[tuple[list[dict[str, Any]], str]] = [
        ([], "group.empty"),
        ([{}] * (MAX_GROUP_SIZE + 1), "group.too_large"),
    ]
    for items, code in sizes:
        answer = refused(TaskGroupRequest, {"template": BASE, "items": items})
        assert (answer["code"], answer["field"]) == (code, "items")
    group_id = refused(TaskGroupRequest, {"template": BASE, "items": [{}], "group_id": "g" * 129})
    assert (group_id["code"], group_id["field"]) == ("request.invalid", "group_id")


@pytest.mark.parametrize(
    ("changes", "code", "field"),
    [
        ({"tenant": "a/b"}, "auth.invalid_name", "tenant"),
        ({"user": "eve\nforged"}, "auth.invalid_name", "user"),
        ({"role": "owner"}, "auth.invalid_role", "role"),
        ({"ttl": 0}, "auth.invalid_expiry", "ttl"),
        ({"ttl": "30 days"}, "auth.invalid_expiry", "ttl"),
        ({"ttl": True}, "auth.invalid_expiry", "ttl"),
        ({"description": "d" * 201}, "auth.invalid_description", "description"),
        ({"colour": "red"}, "request.invalid", "colour"),
    ],
)
def test_a_token_request_is_refused_with_the_codes_of_the_token_rules(
    changes: dict[str, Any], code: str, field: str
) -> None:
    answer = refused(TokenRequest, {"tenant": "ta", "user": "alice", **changes})
    assert (answer["code"], answer["field"]) == (code, field), answer


def test_a_token_request_takes_the_roles_of_the_api_and_the_legacy_admin() -> None:
    assert TokenRequest.model_json_schema()["properties"]["role"]["enum"] == list(ROLES)
    assert parse_body(TokenRequest, {"tenant": "t", "user": "u"}).role == "member"
    legacy = parse_body(TokenRequest, {"tenant": "t", "user": "u", "role": "admin"})
    assert legacy.role == "platform_admin"
