"""Stack reports (SPEC R-33): what the fault-tolerance service keeps of a capture.

The capture itself is the deployer's (it owns the worker processes): it carries
out a `CaptureStacks` command and appends `StacksCaptured` with the raw stacks
per worker (`runyard.contracts.stacks`). From that event this module builds the
report the API shows: for each worker the frame each of its Python threads is
in, function-call statistics (in how many threads, of which workers, each
function appears), the workers whose main stack differs from the majority's
first (the odd one out), a summary, and the raw per-thread stacks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from runyard.contracts import RecordedEvent
from runyard.contracts.stacks import ProcessStacks, by_worker, digest
from runyard.contracts.task_events import StacksCaptured


@dataclass
class StackReport:
    """The aggregated report of one capture, with the raw stacks kept."""

    report_id: str
    task_id: str
    run: int
    attempt: int
    captured_at: datetime
    #: Raw stacks per worker index: every Python process of the worker's group.
    workers: dict[int, list[ProcessStacks]]
    #: Worker -> the innermost frame of each of its Python threads.
    frames_by_worker: dict[int, list[str]] = field(default_factory=dict)
    #: Function -> {"threads": n, "workers": [indexes]}.
    functions: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Workers whose main stack is shared by the fewest workers come first.
    odd_ones_out: list[int] = field(default_factory=list)
    summary: str = ""
    #: What was cut from the raw stacks to fit the event ("" if nothing).
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "report_id": self.report_id,
            "task_id": self.task_id,
            "run": self.run,
            "attempt": self.attempt,
            "captured_at": self.captured_at.isoformat(),
            "workers": {
                str(k): [p.model_dump(mode="json") for p in v] for k, v in self.workers.items()
            },
            "frames_by_worker": {str(k): v for k, v in self.frames_by_worker.items()},
            "functions": self.functions,
            "odd_ones_out": self.odd_ones_out,
            "summary": self.summary,
            "note": self.note,
        }


def aggregate(
    report_id: str,
    task_id: str,
    run: int,
    attempt: int,
    captured_at: datetime,
    workers: Mapping[int, Sequence[ProcessStacks]],
) -> StackReport:
    """The report over the workers' raw stacks: frames per worker, counts, odd one out."""
    read = digest(workers)
    return StackReport(
        report_id,
        task_id,
        run,
        attempt,
        captured_at,
        {index: list(processes) for index, processes in workers.items()},
        read.frames_by_worker,
        read.functions,
        read.odd_ones_out,
        read.summary,
    )


def report_of(task_id: str, recorded: RecordedEvent[StacksCaptured]) -> StackReport:
    """The report of a `StacksCaptured` event (its summary is the deployer's, made from
    the whole dump before any trimming)."""
    captured = recorded.event
    report = aggregate(
        captured.report_id,
        task_id,
        captured.run,
        captured.attempt,
        recorded.occurred_at,
        by_worker(captured.stacks),
    )
    report.summary = captured.summary or report.summary
    report.note = captured.note
    return report
