"""The gateway's error translation: the shared API errors (runyard.api.errors)
plus the submission rules' refusals, which only the gateway's routes raise."""

from __future__ import annotations

from runyard.api import errors
from runyard.api.errors import BadRequest, GatewayError
from runyard.submission.errors import SubmissionError


def translate(error: Exception) -> GatewayError | None:
    """The API error for a submission, domain or store error (None: not ours)."""
    if isinstance(error, SubmissionError):
        bad = BadRequest(str(error.code), error.message, error.hint, error.field)
        bad.extra = {k: v for k, v in error.to_dict().items() if k == "item"}
        return bad
    return errors.translate(error)
