"""Input the gateway refuses before any rule sees it (docs/limits.md).

Every edge (HTTP path, query, headers used, JSON bodies; gRPC fields and
`*_json` fields) checks its input here, so such a request is a 400
`request.invalid` naming the field, never a 500:

- text the store cannot hold: Postgres text and jsonb refuse the NUL
  character, and UTF-8 cannot encode a lone surrogate (JSON's `"\\ud800"`);
- JSON nested deeper than `MAX_JSON_DEPTH` (no spec field nests that deep;
  deeper input only costs stack and time);
- request ids over `MAX_REQUEST_ID`;
- HTTP bodies over `MAX_BODY_BYTES` (413, counted while the body arrives);
- bodies that break their model (`runyard.contracts.requests`): `parse_body`,
  and FastAPI's own validation of a route's body (`body_refused`), answer the
  model's refusal, so HTTP, gRPC and the console refuse one input alike.

The walk is iterative and linear in the size of the input.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from runyard.api.errors import BadRequest, PayloadTooLarge
from runyard.contracts.requests import RequestBody
from starlette.types import ASGIApp, Message, Receive, Scope, Send

NUL = "\x00"
#: Deepest JSON nesting accepted (a task group body is 4 levels deep; a spec 3).
MAX_JSON_DEPTH = 32
#: Longest request id (`X-Request-Id` header, gRPC `x-request-id` metadata).
MAX_REQUEST_ID = 128
#: Longest task group id a caller may choose.
MAX_GROUP_ID = 128
#: Longest path or query parameter (gRPC: string field other than `*_json`): ids,
#: filters, cursors.
MAX_PARAM = 1024

_SURROGATE = re.compile("[\ud800-\udfff]")


#: (what is wrong, how to fix it) of a refused input.
Problem = tuple[str, str]


def _problem(text: str) -> Problem | None:
    if NUL in text:
        return "the NUL character (\\u0000) is not allowed", "remove the NUL character"
    found = _SURROGATE.search(text)
    if found is not None:
        return (
            f"a lone surrogate (\\u{ord(found.group()):04x}) at character {found.start()} "
            "is not text",
            "send valid UTF-8 text (pair or remove the surrogate)",
        )
    return None


_TOO_DEEP: Problem = (
    f"nested deeper than {MAX_JSON_DEPTH} levels",
    f"send JSON nested at most {MAX_JSON_DEPTH} levels deep",
)


def find_unstorable(value: Any, field: str = "") -> tuple[str, Problem] | None:
    """(path, problem) of the first string or key the store cannot hold, or of
    nesting deeper than `MAX_JSON_DEPTH`; None when all is well."""
    stack: list[tuple[Any, str, int]] = [(value, field, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            if (reason := _problem(item)) is not None:
                return path or "request", reason
            continue
        if isinstance(item, dict | list | tuple) and depth >= MAX_JSON_DEPTH:
            return path or "request", _TOO_DEEP
        if isinstance(item, dict):
            children = []
            for key, child in item.items():
                key_path = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and (reason := _problem(key)) is not None:
                    return path or "request", reason
                children.append((child, key_path, depth + 1))
            stack.extend(reversed(children))
        elif isinstance(item, list | tuple):
            stack.extend(
                (child, f"{path}[{i}]", depth + 1) for i, child in reversed(list(enumerate(item)))
            )
    return None


def reject_unstorable(value: Any, field: str = "") -> None:
    """Refuse `value` (400 request.invalid) if any string in it holds a NUL character or a
    lone surrogate, or it nests too deep; the error names the field and says what to do."""
    found = find_unstorable(value, field)
    if found is not None:
        path, (reason, hint) = found
        raise BadRequest("request.invalid", f"{path}: {reason}", hint, path)


Body = TypeVar("Body", bound=RequestBody)


def parse_body(model: type[Body], data: Any) -> Body:
    """`data` (a body as JSON data) read into `model`; a 400 with the model's refusal
    (code, field, message, hint) when it breaks it."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise body_refused(model, exc.errors()) from exc


def body_refused(model: type[BaseModel], errors: Sequence[Mapping[str, Any]]) -> BadRequest:
    """The 400 of a body that breaks `model` (`errors`: pydantic's, located in the body)."""
    if issubclass(model, RequestBody):
        body = model.refusal(errors)
    else:
        field = ".".join(str(p) for p in errors[0]["loc"]) or "body"
        body = {
            "code": "request.invalid",
            "field": field,
            "message": f"{field}: {errors[0]['msg']}",
            "hint": "fix the request (see /openapi.json)",
        }
    error = BadRequest(body.pop("code"), body.pop("message"), body.pop("hint"), body.pop("field"))
    error.extra = body
    return error


def check_request_id(request_id: str | None, field: str = "x-request-id") -> None:
    """Refuse a request id that is too long or not storable text (it becomes the
    events' correlation id)."""
    if request_id is None:
        return
    reject_unstorable(request_id, field)
    if len(request_id) > MAX_REQUEST_ID:
        raise BadRequest(
            "request.invalid",
            f"{field}: {len(request_id)} characters, at most {MAX_REQUEST_ID} are allowed",
            "send a shorter request id (a UUID is 36 characters), or none",
            field,
        )


#: Largest HTTP request body (a task group of many items fits; a spec is far smaller).
MAX_BODY_BYTES = 1024 * 1024


def body_too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        "request.too_large",
        f"the request body is over {limit} bytes",
        "send a smaller body: keep long commands in a script on a volume or in the image, "
        "and split large task groups (see docs/limits.md)",
        "body",
    )


class _Exceeded(Exception):
    """The body went over the limit while the application read it."""


#: What a refusal is answered with for a request (`BodyLimit.page`): its body and
#: content type, or None for the API's JSON.
RefusalPage = Callable[[Scope, PayloadTooLarge], tuple[bytes, str] | None]


class BodyLimit:
    """ASGI middleware: refuse a body over `max_bytes` with 413 while it arrives.

    A declared Content-Length over the limit is refused before anything is
    read; a chunked body is counted as it is received and refused as soon as
    it goes over, so a client can never make the gateway buffer more than the
    limit. Whatever the application answered meanwhile is replaced by the 413:
    the API's JSON error, or what `page` makes of it for that request (a page a
    person reads, for a form of the console).
    """

    def __init__(
        self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES, page: RefusalPage | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.page = page

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _declared_length(scope) > self.max_bytes:
            await self._refuse(scope, send)
            return
        state = {"received": 0, "exceeded": False, "started": False}

        async def limited() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > self.max_bytes:
                    state["exceeded"] = True
                    raise _Exceeded
            return message

        async def guarded(message: Message) -> None:
            if state["exceeded"]:
                if message["type"] == "http.response.start" and not state["started"]:
                    state["started"] = True
                    await self._refuse(scope, send)
                return
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        try:
            await self.app(scope, limited, guarded)
        except _Exceeded:
            if not state["started"]:
                await self._refuse(scope, send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        error = body_too_large(self.max_bytes)
        shown = self.page(scope, error) if self.page is not None else None
        body, kind = shown or (json.dumps(error.to_dict()).encode(), "application/json")
        headers = [(b"content-type", kind.encode()), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": error.http_status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _declared_length(scope: Scope) -> int:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


def group_id_of(body: Any) -> str | None:
    """The `group_id` a task group body names, if any: a string of at most `MAX_GROUP_ID`
    characters (it is stored in every task's event and indexed in the task list)."""
    value = body.get("group_id") if isinstance(body, dict) else None
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > MAX_GROUP_ID:
        shown = f"{len(value)} characters" if isinstance(value, str) else type(value).__name__
        raise BadRequest(
            "request.invalid",
            f"group_id: {shown}; a string of at most {MAX_GROUP_ID} characters is needed",
            "leave group_id out to get a generated one, or send a short name",
            "group_id",
        )
    return value


def check_param(name: str, value: str) -> None:
    """Refuse a parameter (id, filter, cursor) over `MAX_PARAM` characters."""
    if len(value) > MAX_PARAM:
        raise BadRequest(
            "request.invalid",
            f"{name}: {len(value)} characters, at most {MAX_PARAM} are allowed",
            f"send a shorter {name}",
            name,
        )
