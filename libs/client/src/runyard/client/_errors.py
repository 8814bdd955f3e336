"""What a call of the client raises when it does not get the answer it asked for.

    RunyardError (runyard.errors)
    └── ClientError                   code, message, hint, field, retryable
        ├── GatewayUnreachable        no answer: the connection failed or timed out
        │                             (retryable)
        └── ApiError                  the gateway refused: `status` and its `Error` body
            ├── BadRequest            400
            ├── Unauthenticated       401
            ├── PermissionDenied      403
            ├── NotFound              404
            ├── Conflict              409
            ├── PayloadTooLarge       413
            ├── TooBusy               429 (retryable; `retry_after_s` from Retry-After)
            └── Unavailable           503 (retryable; `retry_after_s` from Retry-After)

Any other refusal status is an `ApiError` of that status; so is a redirect (3xx), which
the API never answers (`client.redirected`: a gateway URL that moved, as from http to
https behind a proxy, or a path with an empty id, `/v1/tasks/`).
"""

from __future__ import annotations

import httpx
from runyard.contracts.http import Error
from runyard.errors import RunyardError


class ClientError(RunyardError):
    """A call that got no usable answer."""


class GatewayUnreachable(ClientError):
    """No answer: the gateway could not be reached, or did not answer in time."""

    code = "client.unreachable"
    retryable = True

    def __init__(self, reason: str, *, sent: bool, url: str = "") -> None:
        at = f" at {url}" if url else ""
        super().__init__(
            f"cannot reach the gateway{at}: {reason}",
            hint="start it with `runyard up`, or check the URL (RUNYARD_URL)",
        )
        #: Whether the request may have reached the gateway (then only an idempotent
        #: call is sent again).
        self.sent = sent


class InvalidId(ClientError):
    """An id that cannot be one segment of a URL path: it holds a `/`, which the gateway
    reads as a separator even sent as `%2F` (another route would answer). Nothing is sent."""

    code = "client.invalid_id"

    def __init__(self, value: str) -> None:
        super().__init__(
            f"{value!r} is no id: an id has no '/', the gateway would read it as another route",
            hint="check the id: `runyard ls` lists your tenant's tasks,"
            " `runyard group ls` its groups",
        )
        self.value = value


class ApiError(ClientError):
    """The gateway's refusal: its HTTP `status` and the `Error` body it answered."""

    def __init__(self, status: int, error: Error, retry_after_s: int | None = None) -> None:
        super().__init__(error.message, code=error.code, hint=error.hint, field=error.field)
        self.http_status = status
        self.error = error
        self.retry_after_s = retry_after_s
        self.extra = dict(error.model_extra or {})


class BadRequest(ApiError):
    """400: the request, or a value in it, breaks a rule."""


class Unauthenticated(ApiError):
    """401: no token, or one the gateway does not accept."""


class PermissionDenied(ApiError):
    """403: the token's role or tenant does not allow it."""


class NotFound(ApiError):
    """404: nothing of that id visible to the caller."""


class Conflict(ApiError):
    """409: the state does not allow it now."""


class PayloadTooLarge(ApiError):
    """413: the request body is over the gateway's limit."""


class TooBusy(ApiError):
    """429: the caller's tenant uses its share of something at once (its submissions in
    flight, its streams open, its log searches); send it again after `retry_after_s`."""

    retryable = True


class Unavailable(ApiError):
    """503: the gateway or a service behind it cannot answer now; send it again later."""

    retryable = True


_OF_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthenticated,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    429: TooBusy,
    503: Unavailable,
}


def refusal(answer: httpx.Response) -> ApiError:
    """The error of a refusal (status 400 and above), from its body when it has one, or of
    a redirect (3xx)."""
    if answer.status_code < 400:
        return ApiError(answer.status_code, redirected(answer))
    try:
        error = Error.model_validate(answer.json())
    except ValueError:
        text = answer.text[:500]
        error = Error(code=f"http.{answer.status_code}", message=text or answer.reason_phrase)
    kind = _OF_STATUS.get(answer.status_code, ApiError)
    return kind(answer.status_code, error, retry_after(answer))


def redirected(answer: httpx.Response) -> Error:
    """Where a redirect points, and what to change: the gateway's URL when it points to
    another origin, else the ids of the request (an empty one is another route)."""
    asked = answer.request.url
    target = asked.join(answer.headers.get("location", ""))
    origin = f"{target.scheme}://{target.netloc.decode()}"
    if (target.scheme, target.netloc) != (asked.scheme, asked.netloc):
        hint = f"set the gateway's URL (--url, RUNYARD_URL) to {origin}"
    else:
        hint = "check the ids given: an empty one asks for another route"
    return Error(
        code="client.redirected",
        message=f"{asked.path} was answered {answer.status_code} {answer.reason_phrase},"
        f" to {target}: the gateway's API never redirects",
        hint=hint,
    )


def retry_after(answer: httpx.Response) -> int | None:
    """The seconds of a Retry-After header given in seconds (None: none, or a date)."""
    value = answer.headers.get("retry-after", "").strip()
    return int(value) if value.isdigit() else None


__all__ = [
    "ApiError",
    "BadRequest",
    "ClientError",
    "Conflict",
    "GatewayUnreachable",
    "InvalidId",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "TooBusy",
    "Unauthenticated",
    "Unavailable",
    "refusal",
    "retry_after",
]
