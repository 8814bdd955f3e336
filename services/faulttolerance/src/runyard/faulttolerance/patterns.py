"""Users' regular expressions in fault tolerance (`fault_tolerance.resume_pattern`).

They run on every line a worker prints, inside the control plane, so they run
with RE2 (google-re2): matching takes time linear in the line, whatever the
pattern (`(a+)+$` cannot stall the service). RE2 has no backreferences
(`\\1`) and no lookaround (`(?=...)`, `(?<=...)`); a pattern that needs them is
refused at submission with the reason, and `check_user_pattern` is what the
submission side calls to say so.
"""

from __future__ import annotations

from typing import Final, Protocol

import re2

#: Same as the spec's `MAX_PATTERN`; RE2's own memory budget bounds the compiled program.
MAX_PROGRAM_BYTES: Final = 8 << 20

HINT: Final = (
    "Runyard runs user patterns with RE2 (linear time): no backreferences (\\1) and no "
    "lookahead/lookbehind; e.g. `loading checkpoint (?P<path>\\S+) at step (?P<step>\\d+)`"
)


class UserPatternError(ValueError):
    """A user's pattern RE2 cannot compile: `reason` says why, `hint` what to write instead."""

    def __init__(self, pattern: str, reason: str) -> None:
        super().__init__(f"the pattern {pattern!r} is not a valid RE2 expression: {reason}")
        self.pattern = pattern
        self.reason = reason
        self.hint = HINT


class UserMatch(Protocol):
    """What RE2's match object offers that fault tolerance uses."""

    def groupdict(self) -> dict[str, str | None]: ...

    def group(self, index: int = 0) -> str: ...


class UserPattern(Protocol):
    def search(self, text: str) -> UserMatch | None: ...


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # the refusal says why; no line on the service's stderr
    options.max_mem = MAX_PROGRAM_BYTES
    return options


def compile_user_pattern(pattern: str) -> UserPattern:
    """`pattern` compiled with RE2; `UserPatternError` when RE2 refuses it."""
    try:
        compiled: UserPattern = re2.compile(pattern, _options())
    except re2.error as exc:
        raise UserPatternError(pattern, _reason(exc)) from None
    return compiled


def check_user_pattern(pattern: str) -> str | None:
    """Why RE2 refuses `pattern` (e.g. `invalid escape sequence: \\1`), or None if it is fine.

    Pure: for the submission side's checks, so a spec is refused before any
    worker line meets the pattern.
    """
    try:
        compile_user_pattern(pattern)
    except UserPatternError as exc:
        return exc.reason
    return None


def _reason(exc: Exception) -> str:
    raw = exc.args[0] if exc.args else exc
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    return text or "RE2 refused it"
