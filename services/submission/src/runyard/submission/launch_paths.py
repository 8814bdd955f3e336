"""Files the launch command reads from where a worker cannot see them (R-14 style warning).

A worker runs on its own machine (on the local runtime: in its own mount
namespace, with its own /tmp). It sees the image, the volumes the task mounts,
public data and its own working directory, never the files of the machine the
task was submitted from. `python /tmp/train.py`, written on a laptop where
/tmp/train.py exists, fails on the worker with `launch.script_missing`; this
check says so at submission instead, as a warning (the file may still be
made by the launch command itself, or baked into a particular image).

To keep false alarms rare, only paths in places that belong to one machine or
one user are judged (`USER_LOCAL_TREES`: /tmp, /home, /root, /mnt, ...), never
system trees an image provides (/usr, /opt, /etc, /bin, /dev/null, /proc ...),
and never a path under one of the task's mount paths or public data. And only
paths the command reads as code or configuration:

- the program itself (`/home/me/run.sh --lr 1`);
- the script of an interpreter (`python /tmp/train.py`, `bash /home/me/run.sh`,
  `source /root/env.sh`) and the directory of `cd`;
- any argument with a code or config suffix (`torchrun ... /tmp/train.py`,
  `--deepspeed=/home/me/ds.json`), except the value of an output-like option
  (the storage rules judge those) or a redirection's target.

A path the command mentioned earlier, itself or a folder above it (`mkdir -p
/tmp/w && cd /tmp/w`, `git clone URL /tmp/code && python /tmp/code/train.py`),
is taken as made by the command and not reported.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator

from runyard.contracts.resources import PUBLIC_DATA_PATH
from runyard.contracts.spec import TaskSpec, VolumeMount
from runyard.domain.launch_command import program, split_command
from runyard.submission.warnings import SubmissionWarning, WarningCode

#: Folders whose content belongs to one machine or user: a worker has its own, or none.
USER_LOCAL_TREES = ("/tmp", "/var/tmp", "/dev/shm", "/home", "/Users", "/root", "/mnt", "/media")
#: Suffixes of files a command reads as code or configuration.
CODE_SUFFIXES = (
    ".py",
    ".sh",
    ".bash",
    ".ipynb",
    ".yaml",
    ".yml",
    ".json",
    ".toml",
    ".cfg",
    ".ini",
    ".conf",
)
#: Programs whose first operand is a file (or, for `cd`, a folder) they need.
_TAKES_A_SCRIPT = re.compile(r"python[0-9.]*|bash|sh|zsh|source|\.|cd")
#: Options after which an interpreter has no script operand (`python -m x`, `bash -c '...'`).
_NO_SCRIPT = frozenset({"-m", "-c"})
#: Programs whose arguments are not files they need (they make, print or test them).
_NOT_READING = frozenset(
    {"echo", "printf", "mkdir", "touch", "tee", "rm", "test", "[", "git", "wget", "curl"}
    | {"tar", "unzip", "chmod", "chown", "export", "ls"}
)
#: Programs whose last argument is where they copy to.
_COPYING = frozenset({"cp", "mv", "ln", "install", "rsync", "scp"})
#: A redirection operator, alone (`>`, `2>>`, `&>`, `<`) or before its target (`>/tmp/x`).
_REDIRECTION = re.compile(r"\d*(?:>>?|&>>?|>&|<<?<?)")
#: Output-like options, whose value the command writes rather than reads.
_OUTPUT_OPTION = re.compile(
    r"-[oO]|-{1,2}[\w-]*(?:out|save|log|ckpt|checkpoint|tensorboard)[\w-]*", re.IGNORECASE
)


def launch_path_warnings(spec: TaskSpec) -> list[SubmissionWarning]:
    """A `command.path_not_on_worker` warning per path the workers will not find."""
    mentioned: list[str] = []
    warnings: list[SubmissionWarning] = []
    reported: set[str] = set()
    for segment in split_command(spec.command):
        words = program(segment)
        reads = set(_read_paths(words))
        for word in words:
            token = _token(word)
            path = _absolute(token)
            if path is None:
                continue
            if token in reads and path not in reported and _unseen(path, spec, mentioned):
                reported.add(path)
                warnings.append(_warning(token, spec.mounts))
            mentioned.append(path)
    return warnings


def _token(word: str) -> str:
    """The path part of a word: the value of `--opt=value`, the target of `>/tmp/x`."""
    if word.startswith("-") and "=" in word:
        return word.partition("=")[2]
    match = _REDIRECTION.match(word)
    return word[match.end() :] if match is not None and match.end() > 0 else word


def _read_paths(words: list[str]) -> Iterator[str]:
    """The words of one simple command that name a file or folder it reads."""
    if not words:
        return
    yield words[0]
    name = words[0].rsplit("/", 1)[-1]
    if name in _NOT_READING:
        return
    if _TAKES_A_SCRIPT.fullmatch(name):
        operand = _first_operand(words[1:])
        if operand is not None:
            yield operand
    args = words[1:-1] if name in _COPYING else words[1:]
    previous = ""
    for word in args:
        option, value = previous, word
        if word.startswith("-") and "=" in word:
            option, _, value = word.partition("=")
        written = _REDIRECTION.fullmatch(previous) or _OUTPUT_OPTION.fullmatch(option)
        if not written and value.endswith(CODE_SUFFIXES):
            yield value
        previous = word


def _first_operand(args: list[str]) -> str | None:
    for arg in args:
        if arg in _NO_SCRIPT:
            return None
        if not arg.startswith("-"):
            return arg
    return None


def _absolute(word: str) -> str | None:
    """`word` normalised when it is an absolute path (`//x` and `/a/../b` included)."""
    if not word.startswith("/"):
        return None
    normal = posixpath.normpath(word)
    return "/" + normal.lstrip("/")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _unseen(path: str, spec: TaskSpec, mentioned: list[str]) -> bool:
    """Whether `path` is in a user-local tree, on no mount, and not made earlier by the command."""
    tree = next((t for t in USER_LOCAL_TREES if path.startswith(t + "/")), None)
    if tree is None:
        return False
    mounts = [_absolute(m.mount_path) or m.mount_path for m in spec.mounts]
    if any(_under(path, m) for m in [*mounts, PUBLIC_DATA_PATH.rstrip("/")]):
        return False
    return not any(_under(path, earlier) and earlier != tree for earlier in mentioned)


def _warning(path: str, mounts: tuple[VolumeMount, ...]) -> SubmissionWarning:
    where = mounts[0].mount_path if mounts else "/mnt/code"
    return SubmissionWarning(
        code=WarningCode.COMMAND_PATH_NOT_ON_WORKER,
        field="command",
        message=(
            f"`{path}` is neither in the image nor on a volume the task mounts: workers do not "
            "see the files of the machine you submit from (their /tmp and home folders are "
            "their own), so the command will not find it unless it makes it itself; put the "
            f"code in the image, or on a volume mounted by the task (e.g. under {where})"
        ),
    )
