"""Slow-training detection (R-34): parsers and the windowed detector, no I/O."""

from __future__ import annotations

import pytest
from runyard.faulttolerance.slowdown import (
    SlowdownDetector,
    StepTime,
    StepTimeParser,
    parse_elapsed_s,
    parse_megatron,
    parse_tqdm,
)

SPEC_LINE = (
    "Smoothed mean (iters 83-87: 9465.00 ms, baseline: 3101.00 ms), threshold ratio:2.05. Warning"
)


def megatron_line(iteration: int, ms: float, total: int = 1000) -> str:
    return (
        f"[2026-11-30 02:00:{iteration % 60:02d}] iteration {iteration:>8}/{total:>8} | "
        f"consumed samples: {iteration * 8:>10} | elapsed time per iteration (ms): {ms:.1f} | "
        "learning rate: 3.000E-04 | global batch size:     8 | lm loss: 2.345E+00 | "
        "loss scale: 1.0 | grad norm: 0.812 | number of skipped iterations:   0 | "
        "number of nan iterations:   0 |"
    )


def megatron_log() -> list[str]:
    """About 3101 ms per iteration up to 82 (with jitter), about 9465 ms from 83 on."""
    fast = [3100.0, 3102.0, 3101.0, 3099.0, 3103.0]  # mean 3101.0
    jitter = [3105.0, 3110.0, 3108.0, 3112.0, 3104.0]  # slower windows: the baseline stays
    slow = [9463.0, 9467.0, 9465.0, 9464.0, 9466.0]  # mean 9465.0
    lines = ["building GPT model ...", megatron_line(1, 15000.0), megatron_line(2, 4000.0)]
    for it in range(3, 93):
        k = (it - 3) % 5
        if it >= 83:
            ms = slow[k]
        elif 43 <= it <= 47:
            ms = fast[k]
        else:
            ms = jitter[k]
        lines.append(megatron_line(it, ms))
        if it == 50:
            lines.append(" [after training is done] datetime: 2026-11-30 02:00:50")
    return lines


def run_detector(lines: list[str]) -> list[str]:
    parser, detector = StepTimeParser(), SlowdownDetector()
    warnings = []
    for line in lines:
        sample = parser.feed(line)
        if sample is not None and (w := detector.observe(sample)) is not None:
            warnings.append(w.message)
    return warnings


def test_megatron_log_reproduces_the_spec_warning_line() -> None:
    warnings = run_detector(megatron_log())
    assert warnings[0] == SPEC_LINE
    # 88-92 is still slow against the same baseline.
    assert warnings == [SPEC_LINE, SPEC_LINE.replace("83-87", "88-92")]


def test_parse_megatron_line() -> None:
    assert parse_megatron(megatron_line(85, 3101.0)) == StepTime(85, 3101.0)
    short = " iteration       10/     100 | elapsed time per iteration (ms): 812.5 | lr: 1e-4"
    assert parse_megatron(short) == StepTime(10, 812.5)
    assert parse_megatron("iteration 85 done") is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (" 45%|████▌     | 450/1000 [22:15<27:12,  2.97s/it]", StepTime(450, 2970.0)),
        (" 45%|████▌     | 450/1000 [00:15<00:18,  4.00it/s]", StepTime(450, 250.0)),
        (
            # tqdm redraws with \r: the last bar of the line counts
            " 1%|| 1/100 [00:03<05:00,  3.00s/it]\r  2%|| 2/100 [00:06<04:54,  3.10s/it]",
            StepTime(2, 3100.0),
        ),
        ("{'loss': 1.23, 'learning_rate': 1e-05, 'epoch': 0.5}", None),
    ],
)
def test_parse_tqdm(line: str, expected: StepTime | None) -> None:
    sample = parse_tqdm(line)
    if expected is None:
        assert sample is None
    else:
        assert sample is not None
        assert sample.iteration == expected.iteration
        assert sample.ms == pytest.approx(expected.ms)


def test_tqdm_redraws_of_one_step_count_once() -> None:
    parser = StepTimeParser()
    bar = " 10%|█ | {}/100 [00:10<01:30,  1.00s/it]"
    samples = [parser.feed(bar.format(n)) for n in (1, 1, 2, 2, 3)]
    assert [s.iteration for s in samples if s] == [1, 2, 3]


def test_llamafactory_trainer_log_records_give_step_times() -> None:
    parser = StepTimeParser()
    records = [
        '{"current_steps": 5, "total_steps": 100, "loss": 2.1, "elapsed_time": "0:00:10"}',
        '{"current_steps": 10, "total_steps": 100, "loss": 1.9, "elapsed_time": "0:00:25"}',
        '{"current_steps": 15, "total_steps": 100, "loss": 1.8, "elapsed_time": "1 day, 0:00:40"}',
    ]
    samples = [parser.feed(r) for r in records]
    assert samples[0] is None
    assert samples[1] == StepTime(10, 3000.0)
    assert samples[2] is not None and samples[2].ms == pytest.approx((86400 + 15) * 1000 / 5)
    assert parse_elapsed_s("2:03:04.5") == pytest.approx(7384.5)
    assert parse_elapsed_s("soon") is None


def test_no_warning_at_or_below_the_threshold() -> None:
    detector = SlowdownDetector(warmup=0)
    samples = [StepTime(i, 100.0) for i in range(1, 6)] + [StepTime(i, 180.0) for i in range(6, 11)]
    assert [detector.observe(s) for s in samples] == [None] * 10  # ratio 0.80 exactly
    slow = [detector.observe(StepTime(i, 181.0)) for i in range(11, 16)]
    assert slow[-1] is not None and slow[-1].ratio == pytest.approx(0.81)


def test_baseline_is_the_fastest_window_so_far() -> None:
    detector = SlowdownDetector(warmup=0)
    for i in range(1, 6):
        detector.observe(StepTime(i, 200.0))
    for i in range(6, 11):
        detector.observe(StepTime(i, 100.0))
    assert detector.baseline_ms == 100.0
    warnings = [detector.observe(StepTime(i, 300.0)) for i in range(11, 16)]
    assert warnings[-1] is not None and warnings[-1].baseline_ms == 100.0
    assert warnings[-1].message.endswith("threshold ratio:2.00. Warning")


def test_a_restart_realigns_windows_and_keeps_the_baseline() -> None:
    detector = SlowdownDetector()
    for i in range(1, 13):  # warm-up 1-2, windows 3-7, 8-12
        detector.observe(StepTime(i, 100.0))
    # the restarted attempt resumes from iteration 10: warm-up 10-11, window 12-16
    out = [detector.observe(StepTime(i, 500.0)) for i in range(10, 17)]
    assert out[:-1] == [None] * 6
    assert out[-1] is not None
    assert (out[-1].first_iter, out[-1].last_iter, out[-1].baseline_ms) == (12, 16, 100.0)
