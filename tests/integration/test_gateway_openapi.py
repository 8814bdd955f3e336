"""The gateway's OpenAPI document describes every body, and the gateway keeps to it.

Two checks over a real gateway (Postgres, the submission service, and every
service whose routes it routes answering beside it; `Target` of the fuzz test):

- the document served at /openapi.json, the routed routes merged in, has a
  request body schema for every POST, PUT and PATCH (each route's body a named model
  of `runyard.contracts.requests`, with its limits), a response schema for every
  route, and declares its refusals with the one error body;
- a stateful schemathesis run follows the document's links from a new task to
  get, stop, rerun and events, and finds no 5xx and no answer that breaks the
  schema (body, status code, content type). Kept short: CI has two cores.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from runyard.api.auth import ROLES, TENANT_PATTERN
from runyard.contracts.requests import MAX_ENV_TEXT
from runyard.contracts.spec import MAX_COMMAND, MAX_ENV_VARS, MAX_GROUP_SIZE
from runyard.domain import RERUN_CHANGEABLE
from schemathesis import GenerationMode
from schemathesis.core.transport import Response

from tests.integration.test_gateway import BASE, config_dir
from tests.integration.test_gateway_fuzz import Target, shape_refusal

#: Scenarios of the stateful run (RUNYARD_FUZZ_EXAMPLES runs a longer search).
SCENARIOS = int(os.environ.get("RUNYARD_FUZZ_EXAMPLES", "10"))
#: The task operations the stateful run walks, linked from a task's answer.
TASK_OPERATIONS = ["createTask", "getTask", "stopTask", "rerunTask", "taskEvents", "cloneTask"]
WRITES = ("post", "put", "patch")


@pytest.fixture
def target(dsn: str, tmp_path: Path) -> Iterator[Target]:
    made = Target(dsn, config_dir(tmp_path), "member")
    try:
        yield made
    finally:
        made.close()


def served_document(target: Target) -> dict[str, Any]:
    answer = target.send({"method": "GET", "url": "http://gw/openapi.json"})
    assert answer.status_code == 200, answer.text
    document: dict[str, Any] = answer.json()
    return document


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, items in document["paths"].items():
        for method, operation in items.items():
            if method in ("get", "post", "put", "patch", "delete"):
                yield method, path, operation


def has_schema(response: dict[str, Any]) -> bool:
    content = response.get("content") or {}
    return bool(content) and all("schema" in media for media in content.values())


def test_every_route_has_body_and_answer_schemas(target: Target) -> None:
    document = served_document(target)
    seen = list(operations(document))
    assert any(p.startswith("/v1/tasks/{task_id}/logs") for _, p, _ in seen), "owners merged"
    missing_body = [
        (m, p) for m, p, op in seen if m in WRITES and not has_schema(op.get("requestBody") or {})
    ]
    missing_answer = [
        (m, p)
        for m, p, op in seen
        if not any(s.startswith("2") and has_schema(r) for s, r in op["responses"].items())
    ]
    assert (missing_body, missing_answer) == ([], [])
    unnamed = [
        (m, p, status)
        for m, p, op in seen
        for status, answer in op["responses"].items()
        if not named(answer.get("content", {}).get("application/json", {}).get("schema", {}))
    ]
    assert unnamed == []  # every JSON answer, refusals too, is a model of the document


def named(schema: dict[str, Any]) -> bool:
    """A schema that is a model of the document (or a list of one), or no JSON at all."""
    if not schema:
        return True
    if schema.get("type") == "array":
        return "$ref" in schema.get("items", {})
    return "$ref" in schema


def test_the_gateway_routes_declare_their_refusals_with_the_error_body(target: Target) -> None:
    document = served_document(target)
    error = {"$ref": "#/components/schemas/Error"}
    own = [(m, p, op) for m, p, op in operations(document) if "/logs" not in p]
    for method, path, operation in own:
        if not path.startswith(("/v1/tasks", "/v1/groups", "/v1/pools", "/v1/catalogue")):
            continue
        if path.startswith("/v1/pools/") and "capacity" not in path:
            continue  # the scheduler's routes, merged
        refusals = {s: r for s, r in operation["responses"].items() if s[0] in "45"}
        assert {"400", "401", "503"} <= set(refusals), (method, path)
        for status, response in refusals.items():
            if status == "422":
                continue
            schema = response["content"]["application/json"]["schema"]
            assert schema == error, (method, path, status)


#: (method, path) -> the model of its request body.
BODY_MODELS = {
    ("post", "/v1/tasks"): "TaskSubmission",
    ("post", "/v1/tasks/{task_id}/rerun"): "RerunChanges",
    ("post", "/v1/tasks/{task_id}/clone"): "SpecOverrides",
    ("post", "/v1/groups"): "TaskGroupRequest",
    ("post", "/v1/groups/{group_id}/rerun"): "RerunChanges",
    ("post", "/v1/admin/tokens"): "TokenRequest",
    ("post", "/v1/admin/images"): "ImageEntry",
    ("post", "/v1/admin/volumes"): "VolumeEntry",
    ("post", "/v1/admin/public-data"): "PublicDataEntry",
    ("post", "/v1/tasks/{task_id}/logs/exports"): "LogExportRequest",
}


def test_every_body_is_a_named_model_with_its_limits(target: Target) -> None:
    document = served_document(target)
    schemas = document["components"]["schemas"]
    for (method, path), model in BODY_MODELS.items():
        body = document["paths"][path][method]["requestBody"]["content"]["application/json"]
        assert body["schema"] == {"$ref": f"#/components/schemas/{model}"}, (path, body)
        assert schemas[model]["additionalProperties"] is False, model
    group = schemas["TaskGroupRequest"]["properties"]
    assert (group["items"]["minItems"], group["items"]["maxItems"]) == (1, MAX_GROUP_SIZE)
    assert group["items"]["items"] == {"$ref": "#/components/schemas/SpecOverrides"}
    assert group["template"] == {"$ref": "#/components/schemas/TaskSubmission"}
    assert "required" not in schemas["SpecOverrides"]
    assert set(schemas["RerunChanges"]["properties"]) == RERUN_CHANGEABLE
    spec = schemas["TaskSubmission"]
    assert set(spec["required"]) == {"name", "pool", "image", "command"}
    text, listed = spec["properties"]["env"]["oneOf"]
    assert (text["maxLength"], listed["maxItems"]) == (MAX_ENV_TEXT, MAX_ENV_VARS)
    assert spec["properties"]["creator_only"]["maxItems"] == MAX_ENV_VARS
    assert spec["properties"]["command"]["maxLength"] == MAX_COMMAND
    token = schemas["TokenRequest"]
    assert token["properties"]["role"]["enum"] == list(ROLES)
    assert token["properties"]["role"]["default"] == "member"
    assert token["required"] == ["tenant", "user"]
    assert token["properties"]["tenant"]["pattern"] == f"^{TENANT_PATTERN.pattern}$"
    assert schemas["LogExportRequest"]["properties"]["format"]["enum"] == ["text", "jsonl"]


def test_a_task_links_to_what_may_be_done_with_it(target: Target) -> None:
    document = served_document(target)
    created = document["paths"]["/v1/tasks"]["post"]["responses"]["201"]
    assert {link["operationId"] for link in created["links"].values()} >= {
        "getTask",
        "stopTask",
        "rerunTask",
    }


@pytest.mark.slow
def test_stateful_run_over_task_links_finds_no_error(target: Target) -> None:
    document = schemathesis.openapi.from_dict(served_document(target))
    # Valid requests only: `Target` sends each with the member's token, whatever was
    # generated, so a request without one is not what schemathesis thinks it sent.
    document.config.generation.update(allow_x00=False, modes=[GenerationMode.POSITIVE])
    # The rules refuse many valid shapes (a rerun of a running task, a custom GPU count
    # with a worker count): only a refusal for the shape breaks the document (below).
    document.config.checks.update(excluded_check_names=["ignored_auth", "positive_data_acceptance"])
    schema = document.include(operation_id=TASK_OPERATIONS)
    names = iter(range(10**6))
    seen: Counter[tuple[str, str, int]] = Counter()

    class TaskLinks(schema.as_state_machine()):  # type: ignore[misc]
        def before_call(self, case: Any) -> None:
            # A spec the rules accept, so that the links have a task to follow.
            if case.operation.path in ("/v1/tasks", "/v1/tasks/{task_id}/clone"):
                case.body = {**BASE, "name": f"stateful-{next(names)}"}

        def call(self, case: Any, **kwargs: Any) -> Response:
            kwargs = dict(case.as_transport_kwargs(base_url="http://gw"))
            answer = target.send(dict(kwargs))
            assert not shape_refusal(answer), ("schema-valid request refused", kwargs, answer.text)
            seen[(case.method, case.operation.path, answer.status_code)] += 1
            return Response.from_any(answer)

    TaskLinks.run(
        settings=settings(
            max_examples=SCENARIOS,
            stateful_step_count=6,
            deadline=None,
            database=None,
            derandomize=True,  # the same walk on every run (CI), longer with the variable
            suppress_health_check=list(HealthCheck),
        )
    )
    followed = {path for _, path, status in seen if status < 300 and "{task_id}" in path}
    assert len(followed) >= 2, seen  # links from a new task were followed
