"""First error (R-42): which line looks like the first failure, and which layer
it most likely comes from.

Pure: no I/O. The store (`LogStore.first_error`) reads the lines; the rules
here decide:

1. A Python traceback names the failure best. Each worker's *final*
   traceback is the last one it printed, leaving out launcher wrappers
   (`ChildFailedError`, `CalledProcessError`: torchrun, accelerate and
   deepspeed print the real traceback above them) and preferring the worker's
   own exception over "the peer went away" (`Connection closed by peer`, an
   aborted NCCL communicator), which is what the other ranks print when one
   dies. The first error is the final traceback of the failing worker: an own
   exception before a peer loss, then the latest attempt, then the earliest
   (`choose_traceback`).
2. Without one, the earliest error line (`is_error`) that is not a warning
   (`is_warning`: `UserWarning: ...`, `WARNING`, torch's `[W ...]`);
   a warning only when nothing else is there.

`classify(block)` takes the error line and the lines of the same worker that
follow it (a traceback names its exception at the end) and returns the first
rule, in the order of `RULES`, that matches one of them.

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
from datetime import datetime
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


#: The first line of a Python traceback.
TRACEBACK = "Traceback (most recent call last)"
#: torch's prefix of an uncaught exception's lines in a process group (`[rank0]: `).
_RANK_PREFIX = re.compile(r"^\[(rank|default)\d+\]: ?")
#: The same prefix in Postgres regex syntax (the store groups tracebacks by it).
SQL_RANK_PREFIX = r"^\[(?:rank|default)[0-9]+\]: ?"
#: Terminal escapes (colours, cursor moves).
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]")
#: Lines that warn: `UserWarning: ...` (Python), `WARNING`/`WARN` (loggers, NCCL),
#: `[W socket.cpp:...]` / `[W1201 ...]` (torch's C++), `W1201 12:00:00` (glog).
_WARNING = re.compile(r"\b\w*Warning\b|\bWARN(ING)?\b|^\[W[\d ]|^W\d{4} \d|^\s*warnings\.warn\(")
#: Exceptions of launchers that wrap a worker's own failure (printed above them).
_LAUNCHER = re.compile(r"\b(ChildFailedError|CalledProcessError)\b")
#: Exceptions a rank raises because another rank went away.
_PEER_LOSS = re.compile(
    r"Connection (closed|reset) by peer|NCCL communicator was aborted|Broken pipe|"
    r"DistNetworkError|ECONNRESET|the remote (side|end) closed",
    re.IGNORECASE,
)


def is_error(line: str) -> bool:
    """Whether `line` looks like a failure (and not a benign mention)."""
    return bool(_CANDIDATE.search(line)) and not _BENIGN.search(line)


def is_warning(line: str) -> bool:
    """Whether `line` is a warning: never the first error when an error follows."""
    return bool(_WARNING.search(bare(line)))


def rank_prefix(line: str) -> str:
    """torch's `[rankN]: ` prefix of `line`, or ""."""
    found = _RANK_PREFIX.match(line)
    return found.group(0) if found else ""


def bare(line: str) -> str:
    """`line` as the program wrote it: no rank prefix, no terminal escapes."""
    return _ANSI.sub("", _RANK_PREFIX.sub("", line, count=1))


def is_traceback(line: str) -> bool:
    return TRACEBACK in line


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
        "training.host_memory",
        "training_code",
        r"^runyard: out of memory: |Detected \d+ oom[-_]kill events?",
        "the worker took more host memory than its spec gives it: choose a spec with more"
        " memory, or have the code take less (fewer DataLoader workers, smaller caches)",
    ),
    _rule(
        "platform.nccl",
        "platform",
        r"Watchdog caught collective operation timeout|NCCL (error|WARN)|ncclSystemError|"
        r"ncclRemoteError|ncclInternalError|NCCL communicator was aborted|"
        r"Connection (reset|refused|closed) by peer|socketTimeout|DistNetworkError",
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
        r"Expected .* to have|mat1 and mat2|\bNaN\b|\binf\b",
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


def traceback_exception(lines: Sequence[str], limit: int = 200) -> int | None:
    """In `lines` (a traceback's first line, then the same rank's next lines), the
    index of the line naming the exception: the first one not indented as a frame.
    None when the traceback is not complete or not as Python writes it."""
    if not lines or not is_traceback(lines[0]):
        return None
    for i, line in enumerate(lines[1:limit], start=1):
        text = bare(line)
        if text[:1].isspace():
            continue  # a frame: `  File "...", line N, in f`, its source, `^^^^`
        if not text.strip() or is_traceback(text):
            return None
        return i
    return None


def error_block(lines: Sequence[str], limit: int = 60) -> list[str]:
    """The error line and what explains it: a traceback up to its exception line
    (at most `limit` lines), any other error line with the two lines after it."""
    if lines and is_traceback(lines[0]):
        end = traceback_exception(lines, limit)
        return list(lines[: (end + 1) if end is not None else limit])
    return list(lines[:3])


@dataclass(frozen=True, slots=True)
class Traceback:
    """A traceback the store found: where, when, and the line naming its exception."""

    attempt: int
    worker: int
    at: datetime
    id: int
    #: The exception line (None: the traceback never got to it).
    exception: str | None

    @property
    def weight(self) -> int:
        """How surely it names the failure: 3 the program's own exception, 2 a
        traceback cut short, 1 a peer that went away, 0 a launcher's wrapper."""
        if self.exception is None or is_traceback(self.exception):
            return 2
        text = bare(self.exception)
        if _LAUNCHER.search(text):
            return 0
        return 1 if _PEER_LOSS.search(text) else 3


def choose_traceback(tracebacks: Sequence[Traceback]) -> Traceback | None:
    """The traceback of the failing worker near its exit (see the module docstring):
    each worker's final traceback (its last of its best weight, launchers never),
    then the best weight, the latest attempt, the earliest time."""
    final: dict[tuple[int, int], Traceback] = {}
    for tb in sorted(tracebacks, key=lambda t: (t.at, t.id)):
        if tb.weight == 0:
            continue
        seen = final.get((tb.attempt, tb.worker))
        if seen is None or tb.weight >= seen.weight:
            final[(tb.attempt, tb.worker)] = tb
    if not final:
        return None
    return min(final.values(), key=lambda t: (-t.weight, -t.attempt, t.at, t.id))
