"""The refusals a route declares in its OpenAPI document, each with the one error body.

Every refusal of every service is `runyard.contracts.http.Error` (`{code, field,
message, hint}`); a route names the statuses it may answer with `refusals(...)`, so
the document says which refusals a client must expect where. 400 (a parameter the
store cannot hold), 401 (the bearer token) and 503 (an outage, with Retry-After) may
come from any authenticated route and are always declared.

`AnswerRoute` is the route class of every router with response models: the answer
is checked against its model and sent with the members it was built with only.
"""

from __future__ import annotations

from typing import Any

from fastapi.routing import APIRoute
from runyard.api.inputs import MAX_BODY_BYTES
from runyard.contracts.http import Error

#: What each status means, as the document says it.
MEANING: dict[int, str] = {
    400: "refused: the request or a value in it (`code` says which rule, `field` where)",
    401: "no, malformed, unknown, expired or revoked bearer token",
    403: "the caller's role or tenant does not allow it",
    404: "no such task, group, pool, event or token visible to the caller",
    409: "the state does not allow it now, or it changed meanwhile",
    413: f"the request body is over {MAX_BODY_BYTES} bytes",
    422: "the request was understood but cannot be carried out as asked",
    429: "the caller's (or everyone's) share of this work at once is in use: send it again",
    503: "a database, the broker or another service cannot be reached now: send it again",
}
ALWAYS = (400, 401, 503)
RETRY_AFTER = {
    "Retry-After": {
        "description": "seconds to wait before sending it again",
        "schema": {"type": "integer"},
    }
}


#: `openapi_extra` of a POST that takes no body: the document says so (an empty object
#: may be sent, and anything sent is ignored).
NO_BODY: dict[str, Any] = {
    "requestBody": {
        "required": False,
        "content": {
            "application/json": {
                "schema": {
                    "title": "NoBody",
                    "type": "object",
                    "maxProperties": 0,
                    "description": "the operation takes no body (an empty object may be sent)",
                }
            }
        },
    }
}


class AnswerRoute(APIRoute):
    """A route whose answer is checked against its response model and sent with the
    members it was built with only: a default of the model is the reader's (the
    client's), never added to the wire, so declaring a model changes no answer."""

    def __init__(self, path: str, endpoint: Any, **kwargs: Any) -> None:
        kwargs["response_model_exclude_unset"] = True
        super().__init__(path, endpoint, **kwargs)


def refusals(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses` of a route that may refuse with `statuses` (and 400, 401, 503)."""
    declared: dict[int | str, dict[str, Any]] = {}
    for status in sorted({*ALWAYS, *statuses}):
        declared[status] = {"model": Error, "description": MEANING[status]}
        if status in (429, 503):
            declared[status]["headers"] = RETRY_AFTER
    return declared


__all__ = ["MEANING", "NO_BODY", "AnswerRoute", "refusals"]
