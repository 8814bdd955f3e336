"""The request bodies of the HTTP API in its OpenAPI document, with every limit.

Handlers take the body as a JSON object and the submission service parses it
with its rules (so a refusal names the field the way the rules do); this module
publishes what those rules accept as JSON Schema: the task spec with its
`maxLength`, `maxItems` and ranges (docs/limits.md), the text form of `env`
and the `creator_only` list, overrides, rerun changes, task groups and the
catalogue entries. A client or a fuzzer that follows the document never sends
a body that a shape check refuses.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from runyard.api import auth
from runyard.api.responses import NO_BODY
from runyard.contracts.resources import Image, PublicData, Volume
from runyard.contracts.spec import (
    MAX_ENV_BYTES,
    MAX_ENV_NAME,
    MAX_ENV_VARS,
    MAX_GROUP_SIZE,
    MAX_ID,
    TaskSpec,
)
from runyard.domain import RERUN_CHANGEABLE

_MARK = "x-runyard-body"
_REF = "#/components/schemas/{model}"


def request_body(
    name: str, *, required: bool = True, links: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`openapi_extra` of a route whose JSON body is the named schema of `body_schemas`
    (`required=False`: the body may be left out); `links`: the OpenAPI links of its
    success answer (what a client may call next with what it answered)."""
    return {_MARK: {"name": name, "required": required, "links": links or {}}}


def body_schemas(app: FastAPI) -> None:
    """Make `app.openapi()` describe the marked routes' bodies with the schemas below."""
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            _apply(document)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _apply(document: dict[str, Any]) -> None:
    schemas, components = _schemas()
    document.setdefault("components", {}).setdefault("schemas", {}).update(components)
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            mark = operation.pop(_MARK, None) if isinstance(operation, dict) else None
            if mark is None:
                continue
            operation["requestBody"] = {
                "required": mark["required"],
                "content": {"application/json": {"schema": schemas[mark["name"]]}},
            }
            if mark["links"]:
                success = next(s for s in operation["responses"] if s.startswith("2"))
                operation["responses"][success]["links"] = mark["links"]


def _model(model: type[BaseModel], defs: dict[str, Any]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template=_REF)
    defs.update(schema.pop("$defs", {}))
    return schema


def _schemas() -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """(schema of each body name, component schemas they refer to)."""
    defs: dict[str, Any] = {}
    spec = _with_env_text(_model(TaskSpec, defs))
    overrides = {**copy.deepcopy(spec), "title": "SpecOverrides"}
    overrides.pop("required", None)
    rerun = {
        "title": "RerunChanges",
        "type": "object",
        "additionalProperties": False,
        "properties": {k: v for k, v in spec["properties"].items() if k in RERUN_CHANGEABLE},
    }
    group = {
        "title": "TaskGroup",
        "type": "object",
        "additionalProperties": False,
        "required": ["template", "items"],
        "properties": {
            "template": spec,
            "items": {
                "type": "array",
                "items": overrides,
                "minItems": 1,
                "maxItems": MAX_GROUP_SIZE,
            },
            "group_id": {"type": "string", "minLength": 1, "maxLength": MAX_ID},
        },
    }
    schemas = {
        "TaskSpec": spec,
        "SpecOverrides": overrides,
        "RerunChanges": rerun,
        "TaskGroup": group,
        "Image": _model(Image, defs),
        "Volume": _model(Volume, defs),
        "PublicData": _model(PublicData, defs),
        "TokenRequest": _token_request(),
        "NoBody": NO_BODY["requestBody"]["content"]["application/json"]["schema"],
        "LogExport": {
            "title": "LogExport",
            "type": "object",
            "additionalProperties": False,
            "properties": {"format": {"type": "string", "enum": ["text", "jsonl"]}},
        },
    }
    return schemas, defs


def _with_env_text(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as the API takes it: `env` as a list or as `A=x;B=y` text, and the
    names of creator-only variables in `creator_only`."""
    properties = dict(spec["properties"])
    env_list = properties["env"]
    properties["env"] = {
        "anyOf": [
            {"type": "string", "maxLength": MAX_ENV_BYTES + MAX_ENV_VARS},
            {k: v for k, v in env_list.items() if k not in ("default", "title")},
        ],
        "description": "`A=x;B=y` text, or a list of {name, value}",
    }
    properties["creator_only"] = {
        "type": "array",
        "items": {"type": "string", "maxLength": MAX_ENV_NAME},
        "maxItems": MAX_ENV_VARS,
        "description": "names of env variables whose values only the creator sees",
    }
    return {**spec, "properties": properties}


def _token_request() -> dict[str, Any]:
    """`POST /v1/admin/tokens`: who the token is for, its role and lifetime."""
    max_ttl = int(auth.MAX_TTL.total_seconds())
    return {
        "title": "TokenRequest",
        "type": "object",
        "additionalProperties": False,
        "required": ["tenant", "user"],
        "properties": {
            "tenant": {"type": "string", "pattern": f"^{auth.TENANT_PATTERN.pattern}$"},
            "user": {"type": "string", "pattern": f"^{auth.USER_PATTERN.pattern}$"},
            "role": {"type": "string", "enum": sorted(auth.ROLES), "default": "member"},
            "ttl": {
                "anyOf": [
                    {"type": "integer", "minimum": 1, "maximum": max_ttl},
                    {"type": "string", "pattern": "^[0-9]{1,9}[smhd]$"},
                ],
                "description": f"seconds, or 30d / 12h / 30m / 45s; at most {max_ttl} s",
            },
            "expires_at": {"type": "string", "format": "date-time"},
            "description": {"type": "string", "maxLength": auth.MAX_DESCRIPTION},
        },
    }
