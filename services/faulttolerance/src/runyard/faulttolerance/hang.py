"""Hang detection (SPEC R-33): no new log line and no step advance for the configured time.

Pure: the detector is told what happened (a line from a worker, the step it
reports) and asked at a given `now`; it never reads a clock. One detector
watches one attempt of a task; it starts counting when the attempt runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True, slots=True)
class HangVerdict:
    """Why the attempt is considered hung: how long nothing moved, and the last signs of life."""

    idle_s: float
    last_log_at: datetime | None
    last_step: int | None
    #: When each worker wrote its last line (workers that never wrote are absent).
    last_line_by_worker: dict[int, datetime]

    def describe(self, timeout_s: float) -> str:
        step = f", last step {self.last_step}" if self.last_step is not None else ""
        seen = (
            f"last log line at {self.last_log_at.isoformat()}"
            if self.last_log_at
            else "no log line yet"
        )
        return f"no progress for {self.idle_s:.0f} s (timeout {timeout_s:.0f} s): {seen}{step}"


@dataclass
class HangDetector:
    """Progress of one attempt; `check(now)` says whether it hangs (once per idle spell)."""

    timeout_s: float
    started_at: datetime
    last_log_at: datetime | None = None
    last_step: int | None = None
    last_step_at: datetime | None = None
    last_line_by_worker: dict[int, datetime] = field(default_factory=dict)
    reported: bool = False

    def line(self, worker: int, at: datetime, step: int | None = None) -> None:
        """A worker wrote a line at `at` (and reported `step`, when the line had one)."""
        if self.last_log_at is None or at > self.last_log_at:
            self.last_log_at = at
            self.reported = False
        previous = self.last_line_by_worker.get(worker)
        if previous is None or at > previous:
            self.last_line_by_worker[worker] = at
        if step is not None and (self.last_step is None or step > self.last_step):
            self.last_step, self.last_step_at = step, at
            self.reported = False

    def last_progress_at(self) -> datetime:
        moments = [m for m in (self.started_at, self.last_log_at, self.last_step_at) if m]
        return max(moments)

    def idle_s(self, now: datetime) -> float:
        return max(0.0, (now - self.last_progress_at()).total_seconds())

    def check(self, now: datetime) -> HangVerdict | None:
        """A verdict when idle longer than the timeout and not yet reported for this spell."""
        idle = self.idle_s(now)
        if self.reported or idle < self.timeout_s:
            return None
        self.reported = True
        return HangVerdict(idle, self.last_log_at, self.last_step, dict(self.last_line_by_worker))
