"""Slow-training detection (SPEC R-34): step times from the logs, smoothed over windows.

Supported log formats (one worker output line at a time):

- **Megatron-LM** training log lines, with or without a time prefix::

      [2026-11-30 02:00:00] iteration       85/    1000 | consumed samples: 680 |
      elapsed time per iteration (ms): 3101.0 | learning rate: 3.0E-04 | ...

  The sample is (iteration, elapsed ms). With `--log-interval N` each line is
  the mean over the last N iterations and stands for one sample.
- **LLaMA-Factory / transformers Trainer** progress bars (tqdm), as they reach
  the log once per update::

       45%|████▌     | 450/1000 [22:15<27:12,  2.97s/it]
       45%|████▌     | 450/1000 [00:15<00:18, 29.70it/s]

  The sample is (step, seconds per iteration, or 1 / iterations per second),
  taken once per step (tqdm repeats a step when it redraws).
- **LLaMA-Factory** `trainer_log.jsonl` records when the training code prints
  them (`{"current_steps": 10, "total_steps": 100, ..., "elapsed_time":
  "0:01:23", ...}`): the step time is the elapsed time between two records
  divided by the steps between them.

Windows are aligned to iteration numbers, from the first iteration the run
logged (its anchor): window k holds iterations `anchor + 5k` to
`anchor + 5k + 4`. A log that starts at iteration 3 (a resumed run, the SPEC's
example) has windows 3-7, 8-12, ..., 83-87, 88-92; one that starts at 1 has
1-5, 6-10, ... The anchor is the run's, so a restarted attempt that resumes from
a checkpoint keeps the same windows. The first `warmup` samples of every
attempt (2: compilation, data loader start, checkpoint load) are not counted,
whatever their iteration. A window is judged once a sample at
or past its last iteration is logged in the same attempt, on the samples it
got: its smoothed mean is their mean. The baseline is the fastest window mean
seen before it in the run (a restart keeps it); the ratio is
(mean - baseline) / baseline, and every window whose ratio exceeds 0.8 gives
a warning line::

    Smoothed mean (iters 83-87: 9465.00 ms, baseline: 3101.00 ms), threshold ratio:2.05. Warning

So a Megatron-LM log that starts at iteration 3 (a resumed run), 3101 ms per
iteration up to 82, then 9000-9860 ms for 83-87 and 16000-17316 ms for 88-92,
gives exactly two lines: 83-87 (9465.00 ms, ratio 2.05) and 88-92
(16704.00 ms, ratio 4.39).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Final

WINDOW: Final = 5
THRESHOLD: Final = 0.8
WARMUP: Final = 2

_MEGATRON = re.compile(
    r"\biteration\s+(?P<it>\d+)\s*/\s*\d+\s*\|.*?"
    r"elapsed time per iteration \(ms\):\s*(?P<ms>\d+(?:\.\d+)?)"
)
# tqdm: "450/1000 [22:15<27:12,  2.97s/it]"; the last bar on a line wins (\r redraws).
_TQDM = re.compile(
    r"(?P<step>\d+)/(?P<total>\d+)\s*\[[^\]<]*<[^\],]*,\s*"
    r"(?P<rate>\d+(?:\.\d+)?)(?P<unit>s/it|it/s)"
)
_ELAPSED = re.compile(r"^(?:(?P<d>\d+) days?, )?(?P<h>\d+):(?P<m>\d{2}):(?P<s>\d{2}(?:\.\d+)?)$")


@dataclass(frozen=True, slots=True)
class StepTime:
    """One step-time sample: the iteration (step) it ends at and its duration in ms."""

    iteration: int
    ms: float


@dataclass(frozen=True, slots=True)
class SlowdownWarning:
    """A window whose smoothed mean is more than THRESHOLD above the baseline."""

    first_iter: int
    last_iter: int
    mean_ms: float
    baseline_ms: float
    ratio: float

    @property
    def message(self) -> str:
        """The R-34 line, to two decimals."""
        return (
            f"Smoothed mean (iters {self.first_iter}-{self.last_iter}: {self.mean_ms:.2f} ms, "
            f"baseline: {self.baseline_ms:.2f} ms), threshold ratio:{self.ratio:.2f}. Warning"
        )


def parse_megatron(line: str) -> StepTime | None:
    """The step time of a Megatron-LM iteration line, or None."""
    match = _MEGATRON.search(line)
    if match is None:
        return None
    return StepTime(int(match["it"]), float(match["ms"]))


def parse_tqdm(line: str) -> StepTime | None:
    """The step time of the last tqdm progress bar on the line (Trainer, LLaMA-Factory)."""
    matches = list(_TQDM.finditer(line))
    if not matches:
        return None
    last = matches[-1]
    rate = float(last["rate"])
    if rate <= 0:
        return None
    seconds = rate if last["unit"] == "s/it" else 1.0 / rate
    return StepTime(int(last["step"]), seconds * 1000.0)


def parse_elapsed_s(text: str) -> float | None:
    """`H:MM:SS` (or `N days, H:MM:SS`, as Python prints a timedelta) in seconds."""
    match = _ELAPSED.match(text.strip())
    if match is None:
        return None
    days = int(match["d"] or 0)
    return days * 86400 + int(match["h"]) * 3600 + int(match["m"]) * 60 + float(match["s"])


def parse_llamafactory_record(line: str) -> tuple[int, float] | None:
    """(current step, elapsed seconds) of a LLaMA-Factory trainer_log record, or None."""
    start = line.find("{")
    if start < 0 or "current_steps" not in line:
        return None
    try:
        record = json.loads(line[start:])
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    step, elapsed = record.get("current_steps"), record.get("elapsed_time")
    if not isinstance(step, int) or not isinstance(elapsed, str):
        return None
    seconds = parse_elapsed_s(elapsed)
    return None if seconds is None else (step, seconds)


@dataclass
class StepTimeParser:
    """Turns one worker's lines into step-time samples, whatever supported format they use.

    Keeps what a format needs across lines: the last tqdm step (redraws repeat it) and
    the last LLaMA-Factory record (a step time is a difference of two of them).
    """

    _last_step: int | None = None
    _last_record: tuple[int, float] | None = None

    def feed(self, line: str) -> StepTime | None:
        sample = parse_megatron(line)
        if sample is not None:
            return self._fresh(sample)
        record = parse_llamafactory_record(line)
        if record is not None:
            return self._from_record(record)
        sample = parse_tqdm(line)
        return self._fresh(sample) if sample is not None else None

    def _fresh(self, sample: StepTime) -> StepTime | None:
        if self._last_step is not None and sample.iteration == self._last_step:
            return None
        self._last_step = sample.iteration
        return sample

    def _from_record(self, record: tuple[int, float]) -> StepTime | None:
        previous, self._last_record = self._last_record, record
        if previous is None or record[0] <= previous[0]:
            return None
        ms = (record[1] - previous[1]) * 1000.0 / (record[0] - previous[0])
        return self._fresh(StepTime(record[0], ms))


def window_of(iteration: int, anchor: int, window: int = WINDOW) -> int | None:
    """The index of the window that holds `iteration` in a run whose first logged
    iteration is `anchor` (None before it)."""
    if iteration < anchor:
        return None
    return (iteration - anchor) // window


def window_bounds(index: int, anchor: int, window: int = WINDOW) -> tuple[int, int]:
    """The first and last iteration of window `index` of a run anchored at `anchor`."""
    first = anchor + index * window
    return first, first + window - 1


@dataclass
class SlowdownDetector:
    """Iteration-aligned windows against the fastest window so far (one per run).

    `observe` takes samples in log order and returns the warnings of the windows
    this sample closes (none, one, or two when it jumps past a window and also
    ends its own). A sample whose iteration does not move forward (a restart from
    a checkpoint) starts a new attempt with its own warm-up, dropping the window
    left open; `restart()` does the same explicitly. The baseline stays.
    """

    window: int = WINDOW
    threshold: float = THRESHOLD
    warmup: int = WARMUP
    baseline_ms: float | None = None
    #: The first iteration the run logged: windows start there (kept across restarts).
    anchor: int | None = None
    #: Ratio of the last window judged (None before the first comparison).
    last_ratio: float | None = None
    _seen: int = 0
    _last_iter: int | None = None
    _open: int | None = None
    _samples: list[StepTime] = field(default_factory=list)

    def restart(self) -> None:
        """A new attempt: warm-up starts again, the open window is dropped; the baseline stays."""
        self._seen = 0
        self._last_iter = None
        self._open = None
        self._samples = []

    def observe(self, sample: StepTime) -> list[SlowdownWarning]:
        if self._last_iter is not None and sample.iteration <= self._last_iter:
            self.restart()
        self._last_iter = sample.iteration
        if self.anchor is None:
            self.anchor = sample.iteration
        self._seen += 1
        if self._seen <= self.warmup:
            return []
        index = window_of(sample.iteration, self.anchor, self.window)
        if index is None:
            return []
        warnings: list[SlowdownWarning] = []
        if self._open is not None and index != self._open:
            warnings += self._judge()
        self._open = index
        self._samples.append(sample)
        if sample.iteration == window_bounds(index, self.anchor, self.window)[1]:
            warnings += self._judge()
        return warnings

    def _judge(self) -> list[SlowdownWarning]:
        """Close the open window: compare its mean with the baseline, then update the baseline."""
        assert self._open is not None and self.anchor is not None
        first, last = window_bounds(self._open, self.anchor, self.window)
        samples, self._open, self._samples = self._samples, None, []
        mean = sum(s.ms for s in samples) / len(samples)
        baseline = self.baseline_ms
        if baseline is None or mean < baseline:
            self.baseline_ms = mean
        if baseline is None or baseline <= 0:
            return []
        ratio = (mean - baseline) / baseline
        self.last_ratio = ratio
        if ratio <= self.threshold:
            return []
        return [SlowdownWarning(first, last, mean, baseline, ratio)]
