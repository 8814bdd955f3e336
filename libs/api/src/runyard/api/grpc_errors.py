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

and the standard rich error model (Google's API design guide, "Errors"): a
`google.rpc.Status` in the `grpc-status-details-bin` trailer (grpcio-status)
with the same code and message, whose details are

    google.rpc.ErrorInfo     reason: the code in UPPER_SNAKE (`image.not_found`
                             is IMAGE_NOT_FOUND); domain `runyard`; metadata:
                             code (as HTTP spells it), field, hint, httpStatus,
                             and the error's extra members (`item`, ...)
    google.rpc.BadRequest    INVALID_ARGUMENT only: one field violation, the
                             field as HTTP names it (`image`, `regex`), the
                             message, the same reason
    google.rpc.RetryInfo     a retryable outage: the delay of HTTP's Retry-After

Anything `runyard.api.errors.translate` does not answer (a bug, a fault) is
INTERNAL with a fixed text: its own text, which may hold internals, goes to the
log only. A client of another Runyard server reads a refusal back with
`error_of_rpc`, as the error the server raised.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, NoReturn

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from runyard.api.errors import GatewayError, error_of, translate
from runyard.errors import RunyardError

log = logging.getLogger("runyard.grpc")

#: Trailing metadata keys of a refusal.
CODE_KEY = "runyard-code"
FIELD_KEY = "runyard-field"
HINT_KEY = "runyard-hint"
STATUS_KEY = "runyard-status"
ERROR_KEY = "runyard-error-bin"
#: The `google.rpc.ErrorInfo` domain of every Runyard refusal.
ERROR_DOMAIN = "runyard"


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


def reason_of(code: str) -> str:
    """The ErrorInfo reason of a Runyard error code: UPPER_SNAKE, at most 63 characters
    (`image.not_found` is IMAGE_NOT_FOUND)."""
    reason = re.sub(r"[^A-Z0-9]+", "_", code.upper()).strip("_")
    if not reason or not reason[0].isalpha():
        reason = "E_" + reason
    return reason[:63]


def rich_status(error: RunyardError) -> status_pb2.Status:
    """The `google.rpc.Status` of a refusal: code, message and the details the
    module docstring lists."""
    code = status_of(error)
    reason = reason_of(str(error.code))
    info = error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN)
    info.metadata.update(
        {
            "code": str(error.code),
            "field": error.field,
            "hint": error.hint,
            "httpStatus": str(error.http_status),
            **{str(k): _text(v) for k, v in error.extra.items()},
        }
    )
    details = [info]
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=error.field, description=error.message, reason=reason
        )
        details.append(error_details_pb2.BadRequest(field_violations=[violation]))
    if error.retryable and error.retry_after_s is not None:
        delay = duration_pb2.Duration(seconds=int(error.retry_after_s))
        details.append(error_details_pb2.RetryInfo(retry_delay=delay))
    status = status_pb2.Status(code=_code_number(code), message=error.message)
    for detail in details:
        packed = any_pb2.Any()
        packed.Pack(detail)
        status.details.append(packed)
    return status


def _code_number(code: grpc.StatusCode) -> int:
    """The `google.rpc.Code` number of a status code (the two enums share numbers)."""
    number: int = code.value[0]
    return number


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


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
        rich = rpc_status.to_status(rich_status(error))
        trailing = (*error_metadata(error), *rich.trailing_metadata)
        await context.abort(rich.code, rich.details, trailing_metadata=trailing)
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


def status_of_rpc(exc: grpc.aio.AioRpcError) -> status_pb2.Status | None:
    """The `google.rpc.Status` a refusal carries (None: none, e.g. an INTERNAL error)."""
    status: status_pb2.Status | None = rpc_status.from_call(exc)
    return status


def error_info(status: status_pb2.Status) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo among a status's details."""
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None


def bad_request(status: status_pb2.Status) -> error_details_pb2.BadRequest | None:
    """The BadRequest among a status's details (INVALID_ARGUMENT only)."""
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            found = error_details_pb2.BadRequest()
            detail.Unpack(found)
            return found
    return None


__all__ = [
    "abort",
    "bad_request",
    "error_info",
    "error_metadata",
    "error_of_rpc",
    "reason_of",
    "rich_status",
    "status_of",
    "status_of_rpc",
]
