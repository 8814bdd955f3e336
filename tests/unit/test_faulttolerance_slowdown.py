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
    window_bounds,
    window_of,
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


SEED_SLOW = {83: 9000.0, 84: 9400.0, 85: 9465.0, 86: 9600.0, 87: 9860.0}
SEED_SLOWER = {88: 16000.0, 89: 16500.0, 90: 16704.0, 91: 17000.0, 92: 17316.0}
SEED_LINES = [
    SPEC_LINE,
    "Smoothed mean (iters 88-92: 16704.00 ms, baseline: 3101.00 ms), threshold ratio:4.39. Warning",
]


def seed_ms(iteration: int) -> float:
    """The seed's example: 3101 ms up to 82, then two slow windows."""
    return {**SEED_SLOW, **SEED_SLOWER}.get(iteration, 3101.0)


def seed_megatron_log() -> list[str]:
    """A resumed Megatron-LM run: its log starts at iteration 3 and ends at 92."""
    lines = ["building GPT model ...", " loading checkpoint from /ckpt at iteration 2"]
    for it in range(3, 93):
        lines.append(megatron_line(it, seed_ms(it)))
        if it == 50:
            lines.append(" [after training is done] datetime: 2026-11-30 02:00:50")
    return lines


def tqdm_line(step: int, seconds: float, total: int = 1000) -> str:
    """A transformers Trainer (LLaMA-Factory) progress bar as it reaches the log."""
    percent = step * 100 // total
    return f"{percent:3d}%|▍         | {step}/{total} [01:23<45:06, {seconds:5.2f}s/it]"


def run_detector(lines: list[str]) -> list[str]:
    parser, detector = StepTimeParser(), SlowdownDetector()
    warnings = []
    for line in lines:
        sample = parser.feed(line)
        if sample is not None:
            warnings += [w.message for w in detector.observe(sample)]
    return warnings


def test_the_seed_megatron_log_gives_exactly_the_seed_lines() -> None:
    assert run_detector(seed_megatron_log()) == SEED_LINES


def test_windows_start_at_the_first_logged_iteration() -> None:
    """A fresh run logged from iteration 1 has windows 1-5, ..., 81-85, 86-90: the
    seed's slow spell then straddles them (the seed's log starts at 3); 91-92 stay open."""
    lines = [megatron_line(it, seed_ms(it)) for it in range(1, 93)]
    assert run_detector(lines) == [
        "Smoothed mean (iters 81-85: 6813.40 ms, baseline: 3101.00 ms), "
        "threshold ratio:1.20. Warning",
        "Smoothed mean (iters 86-90: 13732.80 ms, baseline: 3101.00 ms), "
        "threshold ratio:3.43. Warning",
    ]
    slow_81_85 = [megatron_line(it, 9000.0 if 81 <= it <= 85 else 3000.0) for it in range(1, 91)]
    assert run_detector(slow_81_85) == [
        "Smoothed mean (iters 81-85: 9000.00 ms, baseline: 3000.00 ms), "
        "threshold ratio:2.00. Warning",
    ]


def test_llamafactory_progress_bars_give_the_same_windows() -> None:
    """tqdm prints seconds per step to 2 decimals: 3.10 s, then the seed's slow spell."""
    slow = [9.00, 9.40, 9.47, 9.60, 9.86, 16.00, 16.50, 16.70, 17.00, 17.32]
    lines = ["***** Running training *****", "  Num examples = 8,000"]
    for step in range(3, 93):
        seconds = slow[step - 83] if step >= 83 else 3.10
        lines.append(tqdm_line(step, seconds))
        lines.append(tqdm_line(step, seconds))  # a redraw of the same step
    assert run_detector(lines) == [
        "Smoothed mean (iters 83-87: 9466.00 ms, baseline: 3100.00 ms), "
        "threshold ratio:2.05. Warning",
        "Smoothed mean (iters 88-92: 16704.00 ms, baseline: 3100.00 ms), "
        "threshold ratio:4.39. Warning",
    ]


def test_llamafactory_trainer_log_records_are_judged_per_window() -> None:
    """Records every 5 steps: one step time per window, from the elapsed difference."""
    lines = []
    elapsed = 0.0
    for step in range(5, 101, 5):
        elapsed += 5 * (3.0 if step <= 80 else 9.0)
        whole = int(elapsed)
        stamp = f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"
        lines.append(
            f'{{"current_steps": {step}, "total_steps": 100, "loss": 1.5, '
            f'"elapsed_time": "{stamp}"}}'
        )
    # samples at 10, 15, ...: the anchor is 10, warm-up 10 and 15; windows 20-24 (20),
    # 25-29 (25), ...; the window of 85 is judged when 90 comes, ..., the one of 100
    # stays open
    assert run_detector(lines) == [
        f"Smoothed mean (iters {first}-{first + 4}: 9000.00 ms, baseline: 3000.00 ms), "
        "threshold ratio:2.00. Warning"
        for first in (85, 90, 95)
    ]


def test_windows_are_aligned_to_iteration_numbers_from_the_anchor() -> None:
    assert [window_of(i, 3) for i in (1, 2, 3, 7, 8, 82, 83, 87, 88, 92)] == [
        None,
        None,
        0,
        0,
        1,
        15,
        16,
        16,
        17,
        17,
    ]
    assert window_bounds(16, 3) == (83, 87) and window_bounds(17, 3) == (88, 92)
    assert [window_of(i, 1) for i in (1, 5, 6, 81, 85, 86)] == [0, 0, 1, 16, 16, 17]
    assert window_bounds(16, 1) == (81, 85)


def test_every_slow_window_warns_and_the_warm_up_is_per_attempt() -> None:
    detector = SlowdownDetector()
    # anchor 10; warm-up 10 and 11 (slow: ignored); window 10-14 judged on 12-14
    samples = [StepTime(10, 900.0), StepTime(11, 900.0)]
    samples += [StepTime(i, 100.0) for i in range(12, 20)]
    samples += [StepTime(i, 300.0) for i in range(20, 35)]
    warnings = [w for s in samples for w in detector.observe(s)]
    assert [(w.first_iter, w.last_iter) for w in warnings] == [(20, 24), (25, 29), (30, 34)]
    assert {w.baseline_ms for w in warnings} == {100.0}


def test_a_window_is_judged_when_the_log_jumps_past_it() -> None:
    """With a log interval of 10 the samples are 10, 20, ...: each window holds one."""
    detector = SlowdownDetector(warmup=0)
    out = [detector.observe(StepTime(i, ms)) for i, ms in ((10, 100.0), (20, 100.0), (30, 500.0))]
    assert out[:2] == [[], []]  # anchor 10: 10-14 judged at 20 (the baseline), 20-24 open
    assert out[2] == []  # 20-24 judged at 30: not slow; 30-34 open
    (warning,) = detector.observe(StepTime(40, 100.0))
    assert (warning.first_iter, warning.last_iter, warning.mean_ms) == (30, 34, 500.0)


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
    fast = [StepTime(i, 100.0) for i in range(3, 8)]  # window 3-7: the baseline
    edge = [StepTime(i, 180.0) for i in range(8, 13)]  # window 8-12: ratio 0.80 exactly
    assert [detector.observe(s) for s in fast + edge] == [[]] * 10
    (slow,) = [w for i in range(13, 18) for w in detector.observe(StepTime(i, 181.0))]
    assert (slow.first_iter, slow.last_iter) == (13, 17)
    assert slow.ratio == pytest.approx(0.81)


def test_baseline_is_the_fastest_window_so_far() -> None:
    detector = SlowdownDetector(warmup=0)
    for i in range(3, 8):
        detector.observe(StepTime(i, 200.0))
    for i in range(8, 13):
        detector.observe(StepTime(i, 100.0))
    assert detector.baseline_ms == 100.0
    (warning,) = [w for i in range(13, 18) for w in detector.observe(StepTime(i, 300.0))]
    assert warning.baseline_ms == 100.0
    assert warning.message == (
        "Smoothed mean (iters 13-17: 300.00 ms, baseline: 100.00 ms), threshold ratio:2.00. Warning"
    )


def test_a_restart_starts_a_warm_up_drops_the_open_window_and_keeps_the_baseline() -> None:
    detector = SlowdownDetector()
    for i in range(1, 14):  # anchor 1, warm-up 1-2, 1-5 and 6-10 judged, 11-15 left open
        assert detector.observe(StepTime(i, 100.0 if i < 11 else 900.0)) == []
    # the restarted attempt resumes from iteration 9: warm-up 9-10, then 11-15 again,
    # in the run's windows (the anchor stays 1)
    out = [detector.observe(StepTime(i, 500.0)) for i in range(9, 16)]
    assert out[:-1] == [[]] * 6
    (warning,) = out[-1]
    assert (warning.first_iter, warning.last_iter) == (11, 15)
    assert (warning.mean_ms, warning.baseline_ms) == (500.0, 100.0)  # 900s were dropped
    assert detector.anchor == 1
