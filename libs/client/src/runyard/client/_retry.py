"""When a call is sent again, and after how long.

A call is sent again when its failure may pass and sending it twice cannot do
twice what was asked:

- the connection could not be made (nothing was sent): any call;
- a 429 with Retry-After (the tenant uses its share of something at once) whose
  code says the gateway refused before doing anything (`REFUSED_BEFORE_ACTING`:
  `submission.busy`, nothing written; `streams.too_many`, refused before the
  stream starts; `logs.busy`, refused before the search runs): any call, a
  create included; a 429 of another code only for idempotent calls;
- a 503 (an outage: the answer says when to try again in Retry-After), or the
  connection broke after the request went out: idempotent calls only (GET,
  HEAD, PUT, DELETE, OPTIONS, and the calls the client marks so).

The API has no idempotency key, so a POST that creates something (a task, a
rerun, a clone, a group) is never sent again once it may have been acted on:
the caller sees the error and decides. A 429 is waited for as its Retry-After
says (at most `max_wait_s`), within the same `attempts` as every retry.
"""

from __future__ import annotations

from dataclasses import dataclass

from runyard.client._errors import ApiError, ClientError, GatewayUnreachable, TooBusy, Unavailable

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
#: The 429 codes the gateway answers before it does anything of the request (docs/limits.md),
#: so that a create refused with one may be sent again.
REFUSED_BEFORE_ACTING = frozenset({"submission.busy", "streams.too_many", "logs.busy"})


@dataclass(frozen=True, slots=True)
class Retry:
    """How often and how long to wait: `attempts` in all (1: never again), waiting
    `backoff_s` doubled each time, or what Retry-After says, at most `max_wait_s`."""

    attempts: int = 4
    backoff_s: float = 0.5
    max_wait_s: float = 10.0

    def wait_s(self, error: ClientError, *, attempt: int, idempotent: bool) -> float | None:
        """Seconds to wait before attempt `attempt + 1` after `error`; None: do not retry."""
        if attempt >= self.attempts or not retryable(error, idempotent=idempotent):
            return None
        backoff = self.backoff_s * (1 << (attempt - 1))
        if isinstance(error, ApiError) and error.retry_after_s is not None:
            backoff = float(error.retry_after_s)
        return min(backoff, self.max_wait_s)


def retryable(error: ClientError, *, idempotent: bool) -> bool:
    """Whether the call may be sent again after `error` (see the module docstring)."""
    if isinstance(error, GatewayUnreachable):
        return idempotent or not error.sent
    if isinstance(error, TooBusy):
        before_acting = error.code in REFUSED_BEFORE_ACTING
        return error.retry_after_s is not None and (idempotent or before_acting)
    return isinstance(error, Unavailable) and idempotent


NO_RETRY = Retry(attempts=1)

__all__ = ["IDEMPOTENT_METHODS", "NO_RETRY", "REFUSED_BEFORE_ACTING", "Retry", "retryable"]
