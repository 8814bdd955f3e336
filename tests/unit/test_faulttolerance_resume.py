"""Resume detection (R-32): checkpoint-load lines of common frameworks, step and path."""

from __future__ import annotations

import pytest
from runyard.faulttolerance.resume import ResumeMatcher, extract_step

LOADS = [
    # (line, source, step, path)
    (
        " loading checkpoint from /mnt/ckpt/gpt at iteration 1000",
        "megatron",
        1000,
        "/mnt/ckpt/gpt",
    ),
    (
        "  successfully loaded checkpoint from /mnt/ckpt/gpt [ t 0/ 1, p 0/ 1 ] at iteration 2000",
        "megatron",
        2000,
        "/mnt/ckpt/gpt",
    ),
    (
        "[2026-11-30 02:00:00,123] [INFO] [engine.py:3012:_load_checkpoint] rank: 0 loading "
        "checkpoint: /ckpt/global_step300/mp_rank_00_model_states.pt",
        "deepspeed",
        300,
        "/ckpt/global_step300/mp_rank_00_model_states.pt",
    ),
    (
        "[INFO] [engine.py:3100:_load_zero_checkpoint] successfully read 8 ZeRO state_dicts "
        "for rank 0",
        "deepspeed",
        None,
        None,
    ),
    (
        "[INFO|trainer.py:2400] 2026-11-30 02:00:00,000 >> Loading model from "
        "/out/llama/checkpoint-500.",
        "transformers",
        500,
        "/out/llama/checkpoint-500",
    ),
    (
        "[INFO|trainer.py:2411] >>   Continuing training from checkpoint, will skip to saved "
        "global_step",
        "transformers",
        None,
        None,
    ),
    (
        "[INFO|trainer.py:2413] >>   Continuing training from global step 500",
        "transformers",
        500,
        None,
    ),
    (
        "[INFO|llamafactory.train.sft.workflow] Resuming training from /out/sft/checkpoint-1200.",
        "transformers",
        1200,
        "/out/sft/checkpoint-1200",
    ),
    (
        "=> loading checkpoint '/ckpt/model_best.pth.tar'",
        "pytorch",
        None,
        "/ckpt/model_best.pth.tar",
    ),
    (
        "=> loaded checkpoint '/ckpt/checkpoint.pth.tar' (epoch 3)",
        "pytorch",
        None,
        "/ckpt/checkpoint.pth.tar",
    ),
    ("Loading checkpoint: /mnt/ckpt/step_100.pt", "pytorch", 100, "/mnt/ckpt/step_100.pt"),
    ("resumed from /mnt/ckpt/last.pt at step 42", "pytorch", 42, "/mnt/ckpt/last.pt"),
    (
        "state = torch.load('/mnt/ckpt/iter_0000700/model.pt')",
        "pytorch",
        700,
        "/mnt/ckpt/iter_0000700/model.pt",
    ),
]

NOT_LOADS = [
    "WARNING: could not find the metadata file /ckpt/latest_checkpointed_iteration.txt",
    "    will not load any checkpoints and will start from random",
    "No checkpoint found in /out, starting from scratch",
    "saving checkpoint at iteration    1000 to /mnt/ckpt/gpt",
    "iteration 85/ 1000 | elapsed time per iteration (ms): 3101.0",
    "Saving model checkpoint to /out/checkpoint-500",
    "",
]


@pytest.mark.parametrize(("line", "source", "step", "path"), LOADS)
def test_checkpoint_load_lines(line: str, source: str, step: int | None, path: str | None) -> None:
    found = ResumeMatcher().match(line)
    assert found is not None, line
    assert (found.source, found.step, found.path) == (source, step, path)
    assert found.line == line.strip()


@pytest.mark.parametrize("line", NOT_LOADS)
def test_lines_that_are_not_a_resume(line: str) -> None:
    assert ResumeMatcher().match(line) is None


def test_custom_pattern_with_named_groups() -> None:
    matcher = ResumeMatcher(r"RESTORED ckpt=(?P<path>\S+) gstep=(?P<step>\d+)")
    found = matcher.match("2026-11-30 RESTORED ckpt=/vol/run7/ckpt-9 gstep=9000")
    assert found is not None
    assert (found.source, found.step, found.path) == ("custom", 9000, "/vol/run7/ckpt-9")


def test_custom_pattern_without_groups_still_extracts() -> None:
    found = ResumeMatcher(r"warm start").match("warm start from /vol/ckpt/checkpoint-77")
    assert found is not None and found.source == "custom"
    assert (found.step, found.path) == (77, "/vol/ckpt/checkpoint-77")


def test_step_from_text_wins_over_path() -> None:
    assert extract_step("loaded /ckpt/checkpoint-5 at iteration 9", "/ckpt/checkpoint-5") == 9
