"""The request bodies of the HTTP API: one pydantic model per body a route takes.

The gateway declares these as the bodies of its routes, so /openapi.json is
generated from them with every limit (docs/limits.md), and a body that breaks one
is refused before a handler runs. The gRPC API and the web console read their
input into the same models, so all three refuse the same input the same way:
`RequestBody.refusal` turns a model's validation errors into the API's error body
(`runyard.contracts.http.Error`: code, field, message, hint), with the code each
body has always been refused with (`spec.invalid` for a spec's field,
`auth.invalid_name` for a token's tenant, ...).

The task spec's models reuse the fields of `TaskSpec` (its constraints are the
limits), with the API's own forms of the spec: `env` as `A=x;B=y` text or a list,
and `creator_only` names. The submission service stays the authority for the
rules (catalogue, pools, env names, ...): the gateway passes it the validated
body's JSON (`as_json`: the fields that were sent, nothing added).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal, NamedTuple, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictInt,
    Tag,
    create_model,
)
from pydantic.fields import FieldInfo
from runyard.contracts.http import Role
from runyard.contracts.resources import Image, PublicData, Volume
from runyard.contracts.spec import (
    MAX_ENV_BYTES,
    MAX_ENV_NAME,
    MAX_ENV_VARS,
    MAX_GROUP_SIZE,
    MAX_ID,
    RERUN_CHANGEABLE,
    TaskSpec,
)

#: What a person calls a spec field in a refusal (the field's name otherwise).
FIELD_LABELS: Mapping[str, str] = {
    "resource_type": "resource type",
    "pool": "pool",
    "name": "name",
    "description": "description",
    "env": "environment variables",
    "mounts": "storage mounts",
}
#: Longest `env` text: every variable's name and value, with a `;` between pairs.
MAX_ENV_TEXT = MAX_ENV_BYTES + MAX_ENV_VARS
#: Tenant and user names of tokens (`runyard.api.auth` checks them with these).
TENANT_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}"
USER_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}"
#: A token's free-text note.
MAX_TOKEN_DESCRIPTION = 200
#: Longest lifetime of a token, in seconds (365 days; `runyard.api.auth.MAX_TTL`).
MAX_TOKEN_TTL_S = 365 * 24 * 3600
#: A token lifetime as text: a count of seconds, minutes, hours or days.
TTL_PATTERN = r"^[0-9]{1,9}[smhd]$"
#: Role names of tokens stored before scoped roles, and what they mean now.
LEGACY_ROLES: Mapping[str, Role] = {"admin": "platform_admin"}


class FieldRefusal(NamedTuple):
    """How a body's field is refused: its code, what to do, and (when the validation
    message says less) what is wrong."""

    code: str
    hint: str
    message: str = ""


class RequestBody(BaseModel):
    """A request body: no field beyond those named (a typo is refused, not ignored)."""

    model_config = ConfigDict(extra="forbid")

    #: The code of a value that breaks the model, and of a field it does not have.
    invalid_code: ClassVar[str] = "request.invalid"
    unknown_code: ClassVar[str] = "request.invalid"
    #: Fields refused with a code of their own (by their top-level name).
    field_refusals: ClassVar[Mapping[str, FieldRefusal]] = {}
    #: Names people give a top-level field that this body calls otherwise.
    field_synonyms: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def refusal(cls, errors: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The error body of the first of `errors` (pydantic's, their `loc` inside the
        body): `{code, field, message, hint}`, the field as a path (`tags.0`,
        `fault_tolerance.hang_timeout_s`)."""
        first = errors[0]
        loc = _without_tags(tuple(first.get("loc", ())))
        return cls._refusal(loc, str(first.get("type", "")), str(first.get("msg", "")))

    @classmethod
    def _refusal(
        cls, loc: tuple[Any, ...], kind: str, msg: str, within: str = ""
    ) -> dict[str, Any]:
        """The refusal of an error at `loc`; `within`: where this body is in another
        (`template.`, `items[3].`), put before the field's path."""
        if not loc:
            field = within.rstrip(".") or "body"
            return _refused(
                "request.invalid", field, f"{field}: {msg}", f"send a JSON object ({cls.__name__})"
            )
        field = within + ".".join(str(part) for part in loc)
        top = within + str(loc[0])
        if kind == "extra_forbidden":
            return _refused(cls.unknown_code, field, f"{field}: {msg}", _unknown_hint(cls, loc))
        own = cls.field_refusals.get(str(loc[0]))
        if own is not None:
            return _refused(own.code, top, f"{top}: {own.message or msg}", own.hint)
        if str(loc[0]) == "env" and (kind, len(loc)) in (("tuple_type", 1), ("model_type", 2)):
            # an object {"A": "1"}, or a list of "A=1" texts: the two forms are other
            what = (
                "neither `A=x;B=y` text nor a list of {name, value} objects"
                if len(loc) == 1
                else "an item of env is an object {name, value}"
            )
            return _refused(
                cls.invalid_code,
                field,
                f"{field}: {what}",
                'send "env": "A=1;B=2" or "env": [{"name": "A", "value": "1"}]',
            )
        if kind in _LIST_KINDS:  # pydantic would say "a valid tuple", a word of Python
            return _refused(
                cls.invalid_code,
                field,
                f"{field}: should be a list",
                f"send {field} as a list: [a, b] (JSON or YAML), or one `- a` a line (YAML)",
            )
        return _refused(
            cls.invalid_code, field, f"{field}: {msg}", f"fix {field} (see {cls.__name__})"
        )

    def as_json(self) -> dict[str, Any]:
        """The body as JSON data with only the fields that were sent."""
        return self.model_dump(mode="json", exclude_unset=True)


#: Pydantic's error types of a value that is not the list a field takes.
_LIST_KINDS = frozenset({"tuple_type", "list_type", "set_type", "frozen_set_type"})


def _unknown_hint(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """What to do about the unknown field at `loc`: the name it is closest to, if any,
    and the names the object holding it takes (a nested object's own, not the body's)."""
    known = _fields_at(model, loc[:-1])
    if not known:
        return f"check the field name (see {model.__name__})"
    name = str(loc[-1])
    synonyms = getattr(model, "field_synonyms", {}) if len(loc) == 1 else {}
    close = [synonyms[name]] if synonyms.get(name) in known else []
    close = close or difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    guess = f"did you mean {close[0]}? " if close else ""
    return f"{guess}check the field name: {', '.join(known)}"


def _fields_at(model: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    """The field names of the object at `path` inside a `model` body (names and list
    indexes), [] where that is not a model."""
    kind: Any = model
    for part in path:
        kind = _model_in(kind if isinstance(part, int) else _field_type(kind, part))
        if kind is None:
            return []
    return list(kind.model_fields) if isinstance(kind, type) and issubclass(kind, BaseModel) else []


def _field_type(kind: Any, name: Any) -> Any:
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        field = kind.model_fields.get(str(name))
        return field.annotation if field is not None else None
    return None


def _model_in(annotation: Any) -> Any:
    """The model an annotation holds: itself, or what an Optional, a Union with one
    model, or a list or tuple of it (at an index) holds; None where there is none."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    models = [m for arg in get_args(annotation) if (m := _model_in(arg)) is not None]
    return models[0] if len(set(models)) == 1 else None


def _refused(code: str, field: str, message: str, hint: str) -> dict[str, Any]:
    return {"code": code, "field": field, "message": message, "hint": hint}


# --- the task spec as the API takes it --------------------------------------------

#: Tags of the two forms of `env` (in an error's `loc` only; not field names).
_ENV_TEXT, _ENV_LIST = "env:text", "env:list"


def _without_tags(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(part for part in loc if part not in (_ENV_TEXT, _ENV_LIST))


def _env_form(value: Any) -> str:
    return _ENV_TEXT if isinstance(value, str) else _ENV_LIST


_ENV_FIELD = TaskSpec.model_fields["env"]
#: `env`: `A=x;B=y` text, or the spec's own list of {name, value}.
EnvInput = Annotated[
    Annotated[str, Field(max_length=MAX_ENV_TEXT), Tag(_ENV_TEXT)]
    | Annotated[_ENV_FIELD.annotation, *_ENV_FIELD.metadata, Tag(_ENV_LIST)],  # type: ignore[name-defined]
    Discriminator(_env_form),
]
#: Names of env variables whose values only the creator sees.
CreatorOnly = tuple[Annotated[str, Field(max_length=MAX_ENV_NAME)], ...]


class _SpecShape(RequestBody):
    """A spec's field is refused as the submission rules refuse it."""

    invalid_code: ClassVar[str] = "spec.invalid"
    unknown_code: ClassVar[str] = "spec.unknown_field"
    field_synonyms: ClassVar[Mapping[str, str]] = {
        "workers": "worker_count",
        "num_workers": "worker_count",
        "replicas": "worker_count",
        "nodes": "worker_count",
        "gpus": "custom_gpus",
        "cmd": "command",
        "environment": "env",
        "queue": "pool",
    }


def _spec_fields(names: Sequence[str], *, optional: bool) -> dict[str, Any]:
    """`TaskSpec`'s fields `names`, with their constraints; `optional`: none required
    (a field left out keeps the spec's value)."""
    fields: dict[str, Any] = {}
    for name in names:
        field = TaskSpec.model_fields[name]
        if optional and field.is_required():
            field = FieldInfo.merge_field_infos(field, default=None)
        fields[name] = (field.annotation, field)
    return fields


def _with_env_forms(fields: dict[str, Any]) -> dict[str, Any]:
    return {
        **fields,
        "env": (
            EnvInput,
            Field(default=(), description="`A=x;B=y` text, or a list of {name, value}"),
        ),
        "creator_only": (
            CreatorOnly,
            Field(
                default=(),
                max_length=MAX_ENV_VARS,
                description="names of env variables whose values only the creator sees",
            ),
        ),
    }


def _spec_model(name: str, fields: dict[str, Any]) -> type[_SpecShape]:
    """A model of `fields` (the classes below derive from it: mypy sees classes)."""
    model: type[_SpecShape] = create_model(name, __base__=_SpecShape, **fields)
    return model


_ALL = list(TaskSpec.model_fields)
_Submission = _spec_model("TaskSubmission", _with_env_forms(_spec_fields(_ALL, optional=False)))
_Overrides = _spec_model("SpecOverrides", _with_env_forms(_spec_fields(_ALL, optional=True)))
_Rerun = _spec_model(
    "RerunChanges", _spec_fields([f for f in _ALL if f in RERUN_CHANGEABLE], optional=True)
)


class TaskSubmission(_Submission):  # type: ignore[misc,valid-type]
    """A task spec as `POST /v1/tasks` takes it: the fields of TaskSpec, `env` as
    `A=x;B=y` text or a list, and the `creator_only` names."""


class SpecOverrides(_Overrides):  # type: ignore[misc,valid-type]
    """Fields of a task spec to override (a clone, an item of a task group): any field,
    none required."""


class RerunChanges(_Rerun):  # type: ignore[misc,valid-type]
    """What a rerun may change: the launch command, the worker spec or count, the custom
    GPU count, the image. Any other field needs a clone."""

    @classmethod
    def _refusal(
        cls, loc: tuple[Any, ...], kind: str, msg: str, within: str = ""
    ) -> dict[str, Any]:
        field = str(loc[0]) if loc else ""
        if kind == "extra_forbidden" and field in TaskSpec.model_fields:
            label = FIELD_LABELS.get(field, field.replace("_", " "))
            return _refused(
                "rerun.field_not_changeable",
                within + field,
                f"a rerun with changes cannot change the {label}",
                f"use clone to change the {label}",
            )
        refusal: dict[str, Any] = super()._refusal(loc, kind, msg, within)
        return refusal


#: A group id given in a request: it is one segment of the group's URLs
#: (`/v1/groups/<id>`), so no `/`, `%`, `?`, `#`, space or control character.
GROUP_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]*$"


class TaskGroupRequest(RequestBody):
    """`POST /v1/groups`: one task per item, each the template with the item's overrides."""

    template: TaskSubmission
    items: list[SpecOverrides] = Field(min_length=1, max_length=MAX_GROUP_SIZE)
    group_id: str | None = Field(
        default=None,
        max_length=MAX_ID,
        pattern=GROUP_ID_PATTERN,
        description="left out: a generated id; else letters, digits and . _ : @ + = -,"
        " starting with a letter or digit (one segment of a URL path)",
    )

    field_refusals: ClassVar[Mapping[str, FieldRefusal]] = {
        "group_id": FieldRefusal(
            "request.invalid",
            "leave group_id out to get a generated one, or send a short name of letters,"
            " digits and . _ : @ + = - that starts with a letter or digit, e.g. sweep-lr-1",
        ),
    }

    @classmethod
    def _refusal(
        cls, loc: tuple[Any, ...], kind: str, msg: str, within: str = ""
    ) -> dict[str, Any]:
        top = loc[0] if loc else ""
        if top == "template":
            template: dict[str, Any] = TaskSubmission._refusal(
                loc[1:], kind, msg, f"{within}template."
            )
            return template
        if top == "items" and len(loc) > 1 and isinstance(loc[1], int):
            item = loc[1]
            inner: dict[str, Any] = SpecOverrides._refusal(
                loc[2:], kind, msg, f"{within}items[{item}]."
            )
            if len(loc) == 2:
                inner["hint"] = "every item is an object of overrides: [{...}, {...}]"
            return {**inner, "message": f"item {item}: {inner['message']}", "item": item}
        if top == "items" and kind in ("too_short", "too_long"):
            empty = kind == "too_short"
            return _refused(
                "group.empty" if empty else "group.too_large",
                "items",
                f"items: {msg}",
                "give at least one item of overrides (an empty item {} is the template itself)"
                if empty
                else f"split the group into groups of at most {MAX_GROUP_SIZE} items",
            )
        return super()._refusal(loc, kind, msg, within)


# --- tokens, log exports, the catalogue ---------------------------------------------


def _legacy_role(value: Any) -> Any:
    return LEGACY_ROLES.get(value, value) if isinstance(value, str) else value


_NAME_MESSAGE = (
    "must be 1 to {limit} characters: letters, digits, `.`, `_`, `-`{extra},"
    " starting with a letter or digit"
)
_EXPIRY_HINT = 'e.g. {"ttl": "30d"} (default 30d, at most 365d)'


class TokenRequest(RequestBody):
    """`POST /v1/admin/tokens`: who the token is for, its role and its lifetime (`ttl` or
    `expires_at`; 30 days when neither is given, at most 365)."""

    tenant: str = Field(pattern=f"^{TENANT_PATTERN}$")
    user: str = Field(pattern=f"^{USER_PATTERN}$")
    role: Annotated[Role, BeforeValidator(_legacy_role)] = "member"
    ttl: (
        Annotated[StrictInt, Field(ge=1, le=MAX_TOKEN_TTL_S)]
        | Annotated[str, Field(pattern=TTL_PATTERN)]
        | None
    ) = Field(default=None, description="seconds, or 30d / 12h / 30m / 45s")
    expires_at: str | None = Field(
        default=None,
        description="ISO 8601 time with a zone",
        json_schema_extra={"format": "date-time"},
    )
    description: str | None = Field(default=None, max_length=MAX_TOKEN_DESCRIPTION)

    field_refusals: ClassVar[Mapping[str, FieldRefusal]] = {
        "tenant": FieldRefusal(
            "auth.invalid_name",
            'e.g. {"tenant": "team-a"}',
            "tenant " + _NAME_MESSAGE.format(limit=63, extra=""),
        ),
        "user": FieldRefusal(
            "auth.invalid_name",
            'e.g. {"user": "alice"}',
            "user " + _NAME_MESSAGE.format(limit=64, extra=", @"),
        ),
        "role": FieldRefusal(
            "auth.invalid_role",
            'e.g. {"tenant": "t1", "user": "alice", "role": "member"}',
            "role must be one of platform_admin, tenant_admin, member, service, sre",
        ),
        "ttl": FieldRefusal(
            "auth.invalid_expiry",
            _EXPIRY_HINT,
            "ttl must be 1 to 31536000 seconds or a duration such as 30d, 12h, 30m, 45s",
        ),
        "expires_at": FieldRefusal(
            "auth.invalid_expiry", "e.g. 2027-01-31T00:00:00Z", "an ISO 8601 time with a zone"
        ),
        "description": FieldRefusal(
            "auth.invalid_description",
            "one line, no control characters",
            f"text of at most {MAX_TOKEN_DESCRIPTION} printable characters",
        ),
    }


class LogExportRequest(RequestBody):
    """`POST /v1/tasks/{task_id}/logs/exports`: the file's format (the filters are the
    query parameters of /logs)."""

    format: Literal["text", "jsonl"] = "text"

    field_refusals: ClassVar[Mapping[str, FieldRefusal]] = {
        "format": FieldRefusal("export.format", "text or jsonl", "format is text or jsonl"),
    }


class _CatalogueShape(RequestBody):
    """A catalogue entry's field is refused as the submission service refuses it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    invalid_code: ClassVar[str] = "spec.invalid"
    unknown_code: ClassVar[str] = "spec.unknown_field"


class ImageEntry(Image, _CatalogueShape):
    """`POST /v1/admin/images`: an image, the zones it is in, the services it serves."""


class VolumeEntry(Volume, _CatalogueShape):
    """`POST /v1/admin/volumes`: a volume of one zone."""


class PublicDataEntry(PublicData, _CatalogueShape):
    """`POST /v1/admin/public-data`: public data offered in one zone."""


__all__ = [
    "FIELD_LABELS",
    "LEGACY_ROLES",
    "MAX_ENV_TEXT",
    "FieldRefusal",
    "ImageEntry",
    "LogExportRequest",
    "PublicDataEntry",
    "RequestBody",
    "RerunChanges",
    "SpecOverrides",
    "TaskGroupRequest",
    "TaskSubmission",
    "TokenRequest",
    "VolumeEntry",
]
