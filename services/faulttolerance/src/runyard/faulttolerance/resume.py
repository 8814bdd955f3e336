"""Resume detection after a restart (SPEC R-32): did the training code load its checkpoint?

The platform restarts processes; it cannot restore their memory. After a
restart the fault-tolerance service reads the new attempt's log lines and
looks for a checkpoint-load line. Recognised (case-insensitive):

- PyTorch scripts: `Loading checkpoint: /ckpt/step_100.pt`, `=> loading
  checkpoint '/ckpt/model.pth.tar'`, `=> loaded checkpoint '...' (epoch 3)`,
  `Resuming from checkpoint /ckpt/last.pt at step 100`, `torch.load(...)`
  echoed by the script, `Loaded checkpoint ... step 100`;
- Megatron-LM: ` loading checkpoint from /ckpt at iteration 1000`,
  ` successfully loaded checkpoint from /ckpt [ t 0/ 1, p 0/ 1 ] at iteration 1000`;
- DeepSpeed: `rank: 0 loading checkpoint: /ckpt/global_step100/mp_rank_00_model_states.pt`,
  `Loading DeepSpeed checkpoint ...`, `successfully read 8 ZeRO state_dicts
  for rank 0`, `load_checkpoint` traces;
- transformers Trainer / LLaMA-Factory: `Loading model from /out/checkpoint-500.`,
  `  Continuing training from checkpoint, will skip to saved global_step`,
  `  Continuing training from global step 500`, `Resuming training from
  /out/checkpoint-500.`;
- the task's own `resume_pattern` (spec `fault_tolerance.resume_pattern`); its
  named groups `step` and `path`, when present, give the step and path. It is
  a user's pattern, so it runs with RE2 (`runyard.faulttolerance.patterns`:
  linear time, refused when RE2 cannot compile it).

Lines that say a checkpoint was *not* loaded (Megatron's `will not load any
checkpoints and will start from random`, `no checkpoint found`) never count.
The step comes from `at iteration N`, `global step N`, `step N`,
`checkpoint-N`, `global_stepN` or `iter_000N` in the line or its path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from runyard.faulttolerance.patterns import UserMatch, compile_user_pattern

_FLAGS: Final = re.IGNORECASE

PATTERNS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    (
        "megatron",
        re.compile(r"\b(?:successfully )?loaded? checkpoint from .+ at iteration \d+", _FLAGS),
    ),
    (
        "megatron",
        re.compile(r"\bloading (?:distributed )?checkpoint from \S+ at iteration \d+", _FLAGS),
    ),
    ("deepspeed", re.compile(r"\brank:?\s*\d+,? loading checkpoint", _FLAGS)),
    ("deepspeed", re.compile(r"\bloading (?:deepspeed|zero|universal) checkpoint", _FLAGS)),
    ("deepspeed", re.compile(r"\bsuccessfully read \d+ zero state_dicts", _FLAGS)),
    ("deepspeed", re.compile(r"\bload_checkpoint\b.*\b(?:loaded|loading|from)\b", _FLAGS)),
    (
        "transformers",
        re.compile(r"\bcontinuing training from (?:checkpoint|global step \d+)", _FLAGS),
    ),
    ("transformers", re.compile(r"\bloading model from \S*checkpoint", _FLAGS)),
    (
        "transformers",
        re.compile(r"\bresuming (?:training )?from (?:checkpoint\b|\S*checkpoint)", _FLAGS),
    ),
    ("pytorch", re.compile(r"=> load(?:ing|ed) checkpoint\b", _FLAGS)),
    ("pytorch", re.compile(r"\bload(?:ing|ed) (?:model |training )?checkpoint\b", _FLAGS)),
    ("pytorch", re.compile(r"\bresum(?:ing|ed) from\b", _FLAGS)),
    ("pytorch", re.compile(r"\btorch\.load\(", _FLAGS)),
)

NEGATIVE: Final = re.compile(
    r"will not load|not loading|no checkpoint|could not find|not found|"
    r"start(?:ing)? from (?:random|scratch)|failed to load|no such file",
    _FLAGS,
)

_STEP: Final[tuple[re.Pattern[str], ...]] = (
    re.compile(r"\bat iteration\s+(\d+)", _FLAGS),
    re.compile(r"\bglobal[ _]step\s*(\d+)", _FLAGS),
    re.compile(r"checkpoint-(\d+)", _FLAGS),
    re.compile(r"\biter_0*(\d+)", _FLAGS),
    re.compile(r"\bstep[ _=:]*(\d+)", _FLAGS),
    re.compile(r"\biteration\s+(\d+)", _FLAGS),
)
_QUOTED_PATH: Final = re.compile(r"""['"](?P<path>[^'"]*[/\\][^'"]*)['"]""")
_BARE_PATH: Final = re.compile(r"(?P<path>(?:[A-Za-z]:)?(?:~|\.{1,2})?/[^\s'\",;()\[\]]+)")


@dataclass(frozen=True, slots=True)
class ResumeLine:
    """A checkpoint-load line: which family matched, and the step and path when it has them."""

    source: str
    line: str
    step: int | None = None
    path: str | None = None


class ResumeMatcher:
    """Finds checkpoint-load lines; `extra` is the task's own regular expression, if any.

    `extra` is compiled with RE2; `UserPatternError` when RE2 refuses it.
    """

    def __init__(self, extra: str | None = None) -> None:
        self.extra = compile_user_pattern(extra) if extra else None

    def match(self, line: str) -> ResumeLine | None:
        text = line.strip()
        if not text:
            return None
        if self.extra is not None:
            found = self.extra.search(text)
            if found is not None:
                return _from_custom(text, found)
        if NEGATIVE.search(text):
            return None
        for source, pattern in PATTERNS:
            if pattern.search(text):
                path = extract_path(text)
                return ResumeLine(source, text, extract_step(text, path), path)
        return None


def _from_custom(text: str, found: UserMatch) -> ResumeLine:
    groups = found.groupdict()
    path = groups.get("path") or extract_path(text)
    raw_step = groups.get("step")
    step = int(raw_step) if raw_step and raw_step.isdigit() else extract_step(text, path)
    return ResumeLine("custom", text, step, path)


def extract_path(line: str) -> str | None:
    """The checkpoint path named in the line: a quoted path first, else a bare one."""
    quoted = _QUOTED_PATH.search(line)
    if quoted is not None:
        return quoted["path"]
    bare = _BARE_PATH.search(line)
    if bare is None:
        return None
    return bare["path"].rstrip(".:")


def extract_step(line: str, path: str | None = None) -> int | None:
    """The step (iteration) the line says it resumes from, from its text or its path."""
    rest = line.replace(path, " ") if path else line
    for pattern in _STEP:
        found = pattern.search(rest)
        if found is not None:
            return int(found.group(1))
    if path:
        for pattern in _STEP:
            found = pattern.search(path)
            if found is not None:
                return int(found.group(1))
    return None
