"""First error (R-42): which line looks like the first failure, and which layer
it most likely comes from.

Pure: no I/O. `is_error(line)` says whether a line is an error candidate;
`classify(block)` takes the error line and the lines of the same worker that
follow it (a Python traceback names its exception at the end) and returns the
first rule, in the order of `RULES`, that matches one of them.

Layers:
- platform: the machine, the GPUs, the network, the host's limits;
- image: what the container image brings (packages, CUDA/cuDNN/NCCL libraries, conda);
- training_code: the user's program (data, model, loss, checkpoints, its exceptions);
- launch_command: how the program is started (script path, permissions,
  working directory, exit codes of the launcher).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Layer = Literal["platform", "image", "training_code", "launch_command", "unknown"]

#: Words that make a line an error candidate (case-insensitive, whole words).
ERROR_WORDS = (
    r"error|errors|exception|traceback|failed|failure|fatal|no such file|permission denied"
    r"|cuda|nccl|oom|out of memory|killed|segmentation fault|core dumped|abort(ed)?"
    r"|command not found|cannot open|not found|could not find|timed? ?out|errno"
)
#: Exception names glued to other words: ModuleNotFoundError, EnvironmentNameNotFound.
_GLUED = r"(error|exception|notfound|failure)"
#: The same test in Postgres regex syntax, to narrow candidates in SQL.
SQL_CANDIDATE = rf"\m({ERROR_WORDS})|\w{_GLUED}\M"
_CANDIDATE = re.compile(rf"\b({ERROR_WORDS})|\w{_GLUED}\b", re.IGNORECASE)
#: Lines that carry an error word but report no failure.
_BENIGN = re.compile(
    r"NCCL INFO|\b0 errors?\b|\bno errors?\b|errors?=0\b|error_rate|"
    r"\bcuda(:\d+)? (is )?available\b|using (device )?cuda|cuda version|"
    r"\bwarn(ing)?\b(?!.*error)|torch\.cuda\.is_available",
    re.IGNORECASE,
)


_RANK_PREFIX = re.compile(r"^\[(rank|default)\d+\]:")


def is_error(line: str) -> bool:
    """Whether `line` looks like a failure (and not a benign mention)."""
    return bool(_CANDIDATE.search(line)) and not _BENIGN.search(line)


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    layer: Layer
    pattern: re.Pattern[str]
    why: str


def _rule(rule_id: str, layer: Layer, pattern: str, why: str) -> Rule:
    return Rule(rule_id, layer, re.compile(pattern, re.IGNORECASE), why)


#: Most specific first; the first rule matching any line of the block wins.
RULES: tuple[Rule, ...] = (
    _rule(
        "launch.script_missing",
        "launch_command",
        r"can't open file .*No such file or directory|python\d?(\.\d+)?: can't open file",
        "the launch command names a script that is not in the image or the mounts",
    ),
    _rule(
        "launch.working_directory",
        "launch_command",
        r"\bcd: .*(No such file or directory|Not a directory)|cd: can't cd to|"
        r"chdir.*No such file",
        "the launch command changes to a directory that does not exist",
    ),
    _rule(
        "launch.command_not_found",
        "launch_command",
        r": command not found|: not found$|exec: .*: not found|"
        r"(bash|sh): [^:]+: No such file or directory",
        "the launch command runs a program that does not exist",
    ),
    _rule(
        "image.cuda_library",
        "image",
        r"lib(cudart|cudnn|cublas|nccl|cuda|nvrtc|cufft|curand|cusparse)[\w.]*\.so[\w.]*: "
        r"cannot open shared object file|cuDNN version incompatibility|"
        r"undefined symbol: .*(cuda|nccl|cudnn)",
        "a CUDA, cuDNN or NCCL library is missing or mismatched in the image",
    ),
    _rule(
        "image.missing_package",
        "image",
        r"ModuleNotFoundError|No module named|ImportError|cannot import name",
        "a Python package the code imports is missing from the image",
    ),
    _rule(
        "image.conda",
        "image",
        r"conda activate|CondaError|EnvironmentNameNotFound|"
        r"Could not find conda environment|CommandNotFoundError: Your shell has not been",
        "the image's conda environment does not exist or cannot be activated",
    ),
    _rule(
        "platform.gpu",
        "platform",
        r"no CUDA-capable device|CUDA driver version is insufficient|"
        r"NVIDIA-SMI has failed|NVML|uncorrectable ECC|Xid|GPU is lost|"
        r"CUDA error: (unknown error|initialization error|all CUDA-capable devices are busy)",
        "the node's GPUs or driver are not usable",
    ),
    _rule(
        "training.cuda_oom",
        "training_code",
        r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED",
        "the model or batch does not fit in GPU memory: lower the batch size or shard",
    ),
    _rule(
        "platform.nccl",
        "platform",
        r"Watchdog caught collective operation timeout|NCCL (error|WARN)|ncclSystemError|"
        r"ncclRemoteError|ncclInternalError|NCCL communicator was aborted|"
        r"Connection (reset|refused) by peer|socketTimeout",
        "collective communication between workers failed (network, peers, or a hung rank)",
    ),
    _rule(
        "launch.permission",
        "launch_command",
        r"Permission denied|PermissionError|EACCES|Operation not permitted",
        "the command may not execute or write a path (output dir, script mode, mount)",
    ),
    _rule(
        "platform.resources",
        "platform",
        r"No space left on device|Out of memory: Killed process|oom-kill|"
        r"^Killed$|Bus error|shm|Disk quota exceeded",
        "the node ran out of host memory, shared memory or disk",
    ),
    _rule(
        "training.checkpoint",
        "training_code",
        r"checkpoint|state_dict|torch\.load|torch\.save|safetensors|\.ckpt|\.pt\b",
        "loading or saving a checkpoint failed",
    ),
    _rule(
        "training.data",
        "training_code",
        r"dataset|dataloader|collate|__getitem__|sampler|DataLoader worker",
        "the data pipeline (dataset, collator, DataLoader) failed",
    ),
    _rule(
        "training.model",
        "training_code",
        r"\bforward\b|\bbackward\b|\bloss\b|shape mismatch|size mismatch|"
        r"Expected .* to have|mat1 and mat2|NaN|inf",
        "the model's forward, backward or loss failed",
    ),
    _rule(
        "launch.exit_code",
        "launch_command",
        r"exit(ed)? (with )?(code|status)|exitcode|ChildFailedError|returned non-zero",
        "the launcher reported a worker's exit code without the cause",
    ),
    _rule(
        "training.exception",
        "training_code",
        r"Traceback \(most recent call last\)|^\w+(Error|Exception)\b",
        "the training program raised an exception",
    ),
)


@dataclass(frozen=True, slots=True)
class Classification:
    layer: Layer
    rule: str
    why: str
    #: The line of the block the rule matched.
    evidence: str


UNKNOWN = Classification("unknown", "none", "no rule matched the error lines", "")


def classify(block: Sequence[str]) -> Classification:
    """The likely layer of the failure whose first line is `block[0]`."""
    for rule in RULES:
        for line in block:
            if rule.pattern.search(line):
                return Classification(rule.layer, rule.id, rule.why, line)
    return UNKNOWN


def error_block(lines: Sequence[str], limit: int = 60) -> list[str]:
    """The error line and what explains it: a traceback up to its exception line
    (at most `limit` lines), any other error line with the two lines after it."""
    block = list(lines[:1])
    traceback = bool(lines) and "Traceback (most recent call last)" in lines[0]
    for line in lines[1 : limit if traceback else 3]:
        block.append(line)
        bare = _RANK_PREFIX.sub("", line)
        if traceback and bare and not bare[0].isspace() and not bare.startswith("Traceback"):
            break  # the exception line closes a traceback
    return block
