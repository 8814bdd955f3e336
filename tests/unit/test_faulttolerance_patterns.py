"""Users' fault-tolerance patterns run with RE2 (linear time) or are refused, no I/O."""

from __future__ import annotations

import pytest
from runyard.faulttolerance.patterns import (
    UserPatternError,
    check_user_pattern,
    compile_user_pattern,
)
from runyard.faulttolerance.resume import ResumeMatcher


def test_a_pattern_that_backtracks_exponentially_in_python_matches_in_linear_time() -> None:
    # Python's `re` would take about 2**100000 steps here; RE2 scans the line once.
    line = "a" * 100_000 + "!"
    assert compile_user_pattern(r"(a+)+$").search(line) is None
    assert ResumeMatcher(r"(a+)+$").match(line) is None


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"(ckpt)-\1", "invalid escape sequence: \\1"),
        (r"(?<=load )checkpoint", "invalid perl operator: (?<="),
        (r"checkpoint(?= loaded)", "invalid perl operator: (?="),
        (r"step (\d+", "missing ): step (\\d+"),
    ],
)
def test_patterns_re2_cannot_compile_are_refused_with_the_reason(pattern: str, reason: str) -> None:
    assert check_user_pattern(pattern) == reason
    with pytest.raises(UserPatternError) as refused:
        ResumeMatcher(pattern)
    assert reason in str(refused.value)
    assert "RE2" in refused.value.hint and "backreferences" in refused.value.hint


def test_a_valid_pattern_passes_the_check_and_its_named_groups_give_step_and_path() -> None:
    pattern = r"restored (?P<path>\S+) @ (?P<step>\d+)"
    assert check_user_pattern(pattern) is None
    found = ResumeMatcher(pattern).match("[rank0] restored /ckpt/run7/latest @ 1200 ok")
    assert found is not None
    assert (found.source, found.step, found.path) == ("custom", 1200, "/ckpt/run7/latest")
