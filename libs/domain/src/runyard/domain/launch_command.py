"""Launch command checks (R-14): warnings, never rejections.

The task's final state is the launch command's exit status alone (R-21), and
the command runs in a login shell (`bash --login -c`) that does not read
`~/.bashrc`. Three patterns make a failed training look like a success, or a
good one fail before it starts:

- a pipe into `tee` (or any pipe out of the training command) without
  `set -o pipefail`: the pipeline's status is `tee`'s, not the training's;
- commands after the training command (`echo done`, `sleep`, uploads, an
  `|| echo failed`) that run after a failure and end the task with their own
  status, unless the training status is kept (`set -e`, `rc=$?` ... `exit $rc`,
  `|| exit 1`);
- `conda activate` before conda is initialised in that shell.

These are heuristics over a light shell split (quotes, `$(...)` and comments
are understood; here-documents are not); a command that hides its training in
a script is judged only by what the launch command itself shows.

Pure functions of the command's text: the submission rules call them on every
spec, and the gateway's console on the submit form while it is being filled in.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from runyard.domain.warnings import SubmissionWarning, WarningCode

#: At most this many warnings of one kind: a long command with many pipes gets a few,
#: not one per pipe (warnings travel in the task's events).
MAX_WARNINGS_PER_CHECK = 3
#: How much of a simple command a warning quotes.
_QUOTE = 200
_SEPARATORS = ("&&", "||", "|&", ";", "\n", "|", "&")
_SEPARATOR_STARTS = frozenset("&|;\n")
_PREFIX_WORDS = frozenset(
    {
        "if",
        "then",
        "else",
        "elif",
        "do",
        "while",
        "until",
        "!",
        "{",
        "(",
        "time",
        "exec",
        "nohup",
        "env",
        "stdbuf",
    }
)
_LAUNCHERS = re.compile(
    r"python[0-9.]*|torchrun|deepspeed|accelerate|mpirun|mpiexec|horovodrun|llamafactory-cli"
)
_SHELLS = frozenset({"bash", "sh", "zsh"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)
_ERREXIT = re.compile(r"set\s+(?:-\w*e\w*\b|.*-o\s+errexit\b)")
_PIPEFAIL = re.compile(r"set\s.*\bpipefail\b")
_EXIT_WITH_STATUS = re.compile(r"exit\s+(?!0\b)[\"']?(?:\$(?!\?)|[1-9])")
_EXIT_LAST_STATUS = re.compile(r"exit\s+[\"']?\$\?")
_CONDA_ACTIVATE = re.compile(r"\b(?:conda|mamba|micromamba)\s+activate\b")
_CONDA_INIT = re.compile(
    r"shell(?:\.\w+)?\s+hook|profile\.d/\w+\.sh|(?:source|\.)\s+\S*\.bashrc|bash\s+-i\b"
)


@dataclass(frozen=True)
class Segment:
    """One simple command of the launch command and the separators around it."""

    text: str
    #: The separator that follows it: `;`, a newline, `&&`, `||`, `|`, `&`, or "" at the end.
    after: str


def command_warnings(command: str) -> list[SubmissionWarning]:
    """Every R-14 warning for this launch command, in the order of the checks."""
    segments = split_command(command)
    return [
        *_pipe_warnings(segments),
        *_masked_failure_warnings(segments),
        *_conda_warnings(segments),
    ]


def split_command(command: str) -> list[Segment]:
    """Split a launch command into simple commands at `;`, newlines, `&&`, `||`, `|`, `&`."""
    return list(_split(command))


@functools.lru_cache(maxsize=8)
def _split(command: str) -> tuple[Segment, ...]:
    # Cached: every check of one submission (R-13, R-14, launch paths) splits the same text.
    pieces = _Splitter(command.replace("\\\n", " ")).run()
    segments: list[Segment] = []
    for text, after in pieces:
        if text.strip():
            segments.append(Segment(text.strip(), after))
        elif segments and after and segments[-1].after in ("\n", ";"):
            segments[-1] = Segment(segments[-1].text, after)
    return tuple(segments)


class _Splitter:
    """A small shell scanner: quotes, `$(...)`, backticks and comments, nothing more."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.stack: list[str] = []
        self.current: list[str] = []
        self.pieces: list[tuple[str, str]] = []

    def run(self) -> list[tuple[str, str]]:
        while self.i < len(self.text):
            self._step()
        self.pieces.append(("".join(self.current), ""))
        return self.pieces

    def _step(self) -> None:
        if not self.stack and self._separator():
            return
        if not self.stack and self._comment():
            return
        char = self.text[self.i]
        if char == "\\" and self._top() != "'":
            self._take(2)
        elif self.text.startswith("$(", self.i) and self._top() not in ("'", "`"):
            self.stack.append("$(")
            self._take(2)
        else:
            self._track(char)
            self._take(1)

    def _separator(self) -> bool:
        if self.text[self.i] not in _SEPARATOR_STARTS:
            return False
        for sep in _SEPARATORS:
            if self.text.startswith(sep, self.i) and not self._is_redirection(sep):
                self.pieces.append(("".join(self.current), "|" if sep == "|&" else sep))
                self.current = []
                self.i += len(sep)
                return True
        return False

    def _is_redirection(self, sep: str) -> bool:
        previous = self.text[self.i - 1] if self.i else ""
        following = self.text[self.i + 1 : self.i + 2]
        return sep == "&" and (previous in ("<", ">") or following == ">")

    def _comment(self) -> bool:
        starts_word = self.i == 0 or self.text[self.i - 1] in " \t\n;&|"
        if self.text[self.i] != "#" or not starts_word:
            return False
        end = self.text.find("\n", self.i)
        self.i = len(self.text) if end < 0 else end
        return True

    def _track(self, char: str) -> None:
        top = self._top()
        if top == "'":
            if char == "'":
                self.stack.pop()
        elif top == "`":
            if char == "`":
                self.stack.pop()
        elif top == '"':
            self._track_double_quoted(char)
        else:
            self._track_code(char)

    def _track_double_quoted(self, char: str) -> None:
        if char == '"':
            self.stack.pop()
        elif char == "`":
            self.stack.append("`")

    def _track_code(self, char: str) -> None:
        if char in "'\"`":
            self.stack.append(char)
        elif char == "(" and self.stack:
            self.stack.append("(")
        elif char == ")" and self.stack:
            self.stack.pop()

    def _top(self) -> str:
        return self.stack[-1] if self.stack else ""

    def _take(self, n: int) -> None:
        self.current.append(self.text[self.i : self.i + n])
        self.i += n


def program(segment: Segment) -> list[str]:
    """The words of a simple command from its program on (keywords, `A=b` prefixes dropped)."""
    text = segment.text
    # Short segments are cached (each check asks again); long ones are rare and would
    # make the cache large.
    return list(_short_program(text) if len(text) <= 512 else _program(text))


@functools.lru_cache(maxsize=2048)
def _short_program(text: str) -> tuple[str, ...]:
    return _program(text)


def _program(text: str) -> tuple[str, ...]:
    words = _words(text)
    first = 0
    while first < len(words) and (
        words[first] in _PREFIX_WORDS or _ASSIGNMENT.fullmatch(words[first])
    ):
        first += 1
    return tuple(words[first:])


def _words(text: str) -> list[str]:
    """The words of a simple command as a POSIX shell reads them (quotes and backslashes
    removed); text with an unclosed quote is split on blanks. Linear in the text
    (`shlex` grows each token one character at a time: quadratic on one long word)."""
    words: list[str] = []
    word: list[str] = []
    in_word, quote, i = False, "", 0
    while i < len(text):
        char = text[i]
        if quote == "'":
            quote = "" if char == "'" else quote
            if quote:
                word.append(char)
        elif quote == '"':
            if char == "\\" and text[i + 1 : i + 2] in ('"', "\\", "$", "`"):
                i += 1
                word.append(text[i])
            elif char == '"':
                quote = ""
            else:
                word.append(char)
        elif char in " \t\n":
            if in_word:
                words.append("".join(word))
                word, in_word = [], False
        else:
            in_word = True
            if char in "'\"":
                quote = char
            elif char == "\\" and i + 1 < len(text):
                i += 1
                word.append(text[i])
            else:
                word.append(char)
        i += 1
    if quote:
        return text.split()
    if in_word:
        words.append("".join(word))
    return words


def is_training(segment: Segment) -> bool:
    """Whether this simple command looks like the one that runs the training."""
    words = program(segment)
    if not words:
        return False
    name = words[0].rsplit("/", 1)[-1]
    if _LAUNCHERS.fullmatch(name):
        return not _is_tooling(words[1:])
    if name in _SHELLS:
        return any(not w.startswith("-") for w in words[1:])
    return name.endswith((".sh", ".py"))


def _is_tooling(args: list[str]) -> bool:
    return args[:2] == ["-m", "pip"] or (bool(args) and args[0] in ("-V", "--version"))


def _pipe_warnings(segments: list[Segment]) -> list[SubmissionWarning]:
    warnings: list[SubmissionWarning] = []
    pipefail_from = _first_set(segments, _PIPEFAIL)
    for i, segment in enumerate(segments[:pipefail_from]):
        if segment.after != "|":
            continue
        into = program(segments[i + 1]) if i + 1 < len(segments) else []
        into_tee = bool(into) and into[0] == "tee"
        if into_tee or is_training(segment):
            warnings.append(_pipe_warning(segment, segments[i + 1].text))
            if len(warnings) == MAX_WARNINGS_PER_CHECK:
                break
    return warnings


def _pipe_warning(segment: Segment, into: str) -> SubmissionWarning:
    return SubmissionWarning(
        code=WarningCode.COMMAND_PIPE_WITHOUT_PIPEFAIL,
        field="command",
        message=(
            f"`{_quote(segment.text)} | {_quote(into)}` without `set -o pipefail`: the task "
            f"gets the exit status of `{_quote(into)}`, so a failed training can end as "
            "success; "
            "add `set -o pipefail` at the top of the launch command"
        ),
    )


def _first_set(segments: list[Segment], option: re.Pattern[str]) -> int:
    """The index of the first segment that sets `option` (len(segments) if none)."""
    return next((i for i, s in enumerate(segments) if option.match(s.text)), len(segments))


def _set_before(segments: list[Segment], index: int, option: re.Pattern[str]) -> bool:
    return _first_set(segments, option) < index


def _quote(text: str) -> str:
    """A segment as a warning quotes it: long ones are cut, so warnings stay small."""
    return text if len(text) <= _QUOTE else text[: _QUOTE - 3] + "..."


def _masked_failure_warnings(segments: list[Segment]) -> list[SubmissionWarning]:
    training = [i for i, s in enumerate(segments) if is_training(s)]
    if not training:
        return []
    end = _pipeline_end(segments, training[-1])
    masking = _masking_segment(segments, training[-1], end)
    if masking is None:
        return []
    return [_masked_failure_warning(segments[training[-1]], masking)]


def _pipeline_end(segments: list[Segment], index: int) -> int:
    while segments[index].after == "|" and index + 1 < len(segments):
        index += 1
    return index


def _masking_segment(segments: list[Segment], start: int, end: int) -> Segment | None:
    """The command that would end the task after a failed training, if its status is lost."""
    chained = segments[end].after == "&&"
    while segments[end].after == "&&" and end + 1 < len(segments):
        end = _pipeline_end(segments, end + 1)
    if segments[end].after == "||":
        return _rescue_masking(segments, end + 1)
    rest = segments[end + 1 :]
    if not rest or _keeps_status(rest):
        return None
    # `set -e` does not stop the shell for a command followed by `&&`.
    protected = not chained and _set_before(segments, start, _ERREXIT)
    return None if protected else rest[0]


def _rescue_masking(segments: list[Segment], first: int) -> Segment | None:
    """After `train || ...`: masking unless the rescue exits with a failure status."""
    rescue = segments[first : _group_end(segments, first) + 1]
    if any(_EXIT_WITH_STATUS.match(_bare(s)) or _EXIT_LAST_STATUS.match(_bare(s)) for s in rescue):
        return None
    return rescue[0] if rescue else None


def _group_end(segments: list[Segment], first: int) -> int:
    if first >= len(segments) or not segments[first].text.startswith(("{", "(")):
        return first
    closer = "}" if segments[first].text.startswith("{") else ")"
    for i in range(first, len(segments)):
        if segments[i].text.endswith(closer):
            return i
    return len(segments) - 1


def _keeps_status(rest: list[Segment]) -> bool:
    if _EXIT_LAST_STATUS.match(_bare(rest[0])):
        return True
    return any(_EXIT_WITH_STATUS.match(_bare(s)) for s in rest)


def _bare(segment: Segment) -> str:
    return segment.text.lstrip("{( ").rstrip("}) ;")


def _masked_failure_warning(training: Segment, masking: Segment) -> SubmissionWarning:
    return SubmissionWarning(
        code=WarningCode.COMMAND_MASKS_FAILURE,
        field="command",
        message=(
            f"`{_quote(masking.text)}` runs after the training command "
            f"`{_quote(training.text)}` and sets "
            "the task's exit status: if training fails the task can still end as success; "
            "keep the training status (`rc=$?` right after it, end with `exit $rc`) "
            "or put `set -e` at the top"
        ),
    )


def _conda_warnings(segments: list[Segment]) -> list[SubmissionWarning]:
    for segment in segments:
        if _CONDA_INIT.search(segment.text):
            return []  # initialised before any activation that follows
        if _CONDA_ACTIVATE.search(segment.text):
            return [_conda_warning(segment)]
    return []


def _conda_warning(segment: Segment) -> SubmissionWarning:
    return SubmissionWarning(
        code=WarningCode.COMMAND_CONDA_NOT_INITIALISED,
        field="command",
        message=(
            f"`{_quote(segment.text)}` before conda is initialised: the launch command runs in a "
            "login shell, which does not read ~/.bashrc, so `conda activate` fails; first run "
            '`eval "$(conda shell.bash hook)"` or `source <conda>/etc/profile.d/conda.sh`, '
            "or build the image with `conda init --system`"
        ),
    )
