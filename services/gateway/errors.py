"""The gateway's error translation: the shared API errors (runyard.api.errors).

The submission rules' refusals reach the gateway already as API errors (the
submission service's `Refusal`, turned back by `SubmissionClient`), so
nothing here is the gateway's own any more; the edges import `translate`
from here to keep one place to add to.
"""

from __future__ import annotations

from runyard.api import errors
from runyard.api.errors import GatewayError


def translate(error: Exception) -> GatewayError | None:
    """The API error for a domain or store error (None: not ours)."""
    return errors.translate(error)
