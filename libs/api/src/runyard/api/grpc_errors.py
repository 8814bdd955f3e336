"""The gRPC edge's one error translation, for every gRPC server (the gateway's
public API, the submission service's internal one) and their clients.

A handler's error is answered as `abort` says: the status of the error
(`RunyardError.grpc_status`: INVALID_ARGUMENT for a 400, ..., UNAVAILABLE for an
outage, ABORTED for a concurrent change), the error's message as the details,
and trailing metadata that carries the same error as HTTP answers it:

    runyard-code, runyard-field, runyard-hint    printable ASCII
    runyard-status                               the HTTP status of the same refusal
    runyard-error-bin                            the HTTP error body, UTF-8 JSON
                                                 `{code, field, message, hint[, item]}`

Anything `runyard.api.errors.translate` does not answer (a bug, a fault) is
INTERNAL with a fixed text: its own text, which may hold internals, goes to the
log only. A client of another Runyard server reads a refusal back with
`error_of_rpc`, as the error the server raised.
"""

from __future__ import annotations

import json
import logging
from typing import NoReturn

import grpc
from runyard.api.errors import GatewayError, error_of, translate
from runyard.errors import RunyardError

log = logging.getLogger("runyard.grpc")

#: Trailing metadata keys of a refusal.
CODE_KEY = "runyard-code"
FIELD_KEY = "runyard-field"
HINT_KEY = "runyard-hint"
STATUS_KEY = "runyard-status"
ERROR_KEY = "runyard-error-bin"


def status_of(error: RunyardError) -> grpc.StatusCode:
    """The gRPC status code of an error."""
    return grpc.StatusCode[error.grpc_status]


def error_metadata(error: RunyardError) -> tuple[tuple[str, str | bytes], ...]:
    """Trailing metadata of a refusal: code, field, hint, HTTP status and the HTTP body."""
    return (
        (CODE_KEY, _ascii(str(error.code))),
        (FIELD_KEY, _ascii(error.field)),
        (HINT_KEY, _ascii(error.hint)),
        (STATUS_KEY, str(error.http_status)),
        (ERROR_KEY, json.dumps(error.to_dict()).encode()),
    )


def _ascii(text: str) -> str:
    """Printable ASCII, as plain metadata values must be."""
    escaped = text.encode("ascii", "backslashreplace").decode()
    return "".join(c if " " <= c <= "~" else " " for c in escaped)


async def abort(context: grpc.aio.ServicerContext, exc: Exception, server: str) -> NoReturn:
    """End the call with `exc` answered (see the module docstring); `server` names
    the server in the log and in the text of an internal error."""
    if isinstance(exc, grpc.aio.AbortError):  # the handler answered already
        raise exc
    error = translate(exc)
    if error is None:
        log.error("%s: a call failed", server, exc_info=exc)
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error of {server}")
    else:
        await context.abort(
            status_of(error), error.message, trailing_metadata=error_metadata(error)
        )
    raise AssertionError("context.abort returns only by raising")  # pragma: no cover


def error_of_rpc(exc: grpc.aio.AioRpcError) -> GatewayError | None:
    """The refusal a Runyard server answered, as the error it raised (same HTTP status,
    gRPC status, code, field, message, hint, extra); None: not a refusal (no answer,
    a fault of the server)."""
    trailing = dict(exc.trailing_metadata() or ())
    status, body = trailing.get(STATUS_KEY), trailing.get(ERROR_KEY)
    if not isinstance(status, str) or not status.isdigit() or not isinstance(body, bytes):
        return None
    data = json.loads(body)
    if not isinstance(data, dict):
        return None
    error = error_of(int(status), data)
    error.grpc_code = exc.code().name
    return error


__all__ = ["abort", "error_metadata", "error_of_rpc", "status_of"]
