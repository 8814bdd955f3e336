"""A worker's output files: cut into the same numbered lines however they are read,
and what is kept of them once the worker is gone.

Lines: a worker's `stdout.log` and `stderr.log` are cut at each newline, and a
line longer than `LINE_MAX` bytes into pieces of `LINE_MAX` bytes (the last
piece of a line keeps what is left), each piece a line of its own; an
unfinished last line counts only once the worker is gone. The cut depends on
the bytes alone, not on how they arrived, so the runtime's tail (reading as the
worker writes) and `numbered_lines` (reading a whole file again) give every
line the same number (`seq`), and the log store drops a line published twice.

Time marks: lines read again carry no time of their own (the files have none),
so the runtime writes, with each saved offset, when it had published up to
which number of each stream (`Marks`: at most `MAX_MARKS`, every other one
dropped when there are more, so older marks thin out while the recent ones,
those of the lines a broker loss can take, stay about a second apart). A
line published again gets the time of the first mark after it: within about a
second of when it was first read.

Kept outputs: when a deployment is cleaned up and output is kept
(`LocalRuntimeConfig.keep_output`), everything the worker had (home, tmp,
work, its environment file, the namespaces) goes at once, but its output
files, offsets and exit status stay in `<scratch_root>/<task>/run<r>-a<a>/`,
whose `state.json` says `finished` and how many numbered lines each stream
holds, until the log service has stored every one of them (the deployer's
`OutputKeeper`). Such a folder is never adopted again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger("runyard.deployer.outputs")

#: The longest line (bytes) a worker's output gives; longer ones are cut.
LINE_MAX = 64 * 1024
#: How much of a file `numbered_lines` reads at once.
READ_SIZE = 1024 * 1024
#: Time marks kept per worker (older ones thinned past this many).
MAX_MARKS = 512
Stream = Literal["stdout", "stderr"]
STREAMS: tuple[Stream, Stream] = ("stdout", "stderr")
#: What a kept worker folder holds: its output, where publishing got, its exit status.
KEPT_FILES = frozenset({"stdout.log", "stderr.log", "offsets.json", "exit_status"})

DeploymentKey = tuple[str, int, int]


class LineSplitter:
    """Cuts a stream of bytes that starts at `offset` of a file (a line boundary)
    into lines, each with the offset just after it in the file."""

    def __init__(self, offset: int = 0) -> None:
        self._pending = b""
        self._offset = offset  # where the next chunk starts in the file

    def feed(self, chunk: bytes) -> list[tuple[bytes, int]]:
        data = self._pending + chunk
        start = self._offset - len(self._pending)  # where `data` starts in the file
        self._offset += len(chunk)
        lines: list[tuple[bytes, int]] = []
        pos = 0
        while (newline := data.find(b"\n", pos)) != -1:
            while newline - pos > LINE_MAX:
                lines.append((data[pos : pos + LINE_MAX], start + pos + LINE_MAX))
                pos += LINE_MAX
            lines.append((data[pos:newline], start + newline + 1))
            pos = newline + 1
        while len(data) - pos > LINE_MAX:  # no newline in sight: a full piece is a line
            lines.append((data[pos : pos + LINE_MAX], start + pos + LINE_MAX))
            pos += LINE_MAX
        self._pending = data[pos:]
        return lines

    def finish(self) -> list[tuple[bytes, int]]:
        """The unfinished last line, once nothing more can come."""
        rest, self._pending = self._pending, b""
        return [(rest, self._offset)] if rest else []

    @property
    def line_start(self) -> int:
        """Where the line not yet cut starts in the file (every byte before it is in a
        line given out)."""
        return self._offset - len(self._pending)


@dataclass(frozen=True, order=True)
class Skip:
    """A stretch [start, end) of an output file left unread, and the line given out in
    its place (`notice`, with the number the first skipped line would have had).

    The runtime skips when a worker writes faster than its output is read (a worker
    that floods its output must not hold the deployer, nor the log pipeline, for every
    other task). `start` is where a line starts; `end` is after a newline, or where the
    runtime gave up looking for one. Saved with the offsets (`offsets.json`), so a file
    read again gives the same numbered lines (`numbered_lines`)."""

    start: int
    end: int
    notice: str

    def to_json(self) -> list[Any]:
        return [self.start, self.end, self.notice]

    @classmethod
    def from_json(cls, raw: Any) -> Skip | None:
        if (
            isinstance(raw, list)
            and len(raw) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) for v in raw[:2])
            and 0 <= raw[0] <= raw[1]
            and isinstance(raw[2], str)
        ):
            return cls(raw[0], raw[1], raw[2])
        return None


def skip_notice(skipped: int, stream: Stream, lines_per_s: int) -> str:
    """The line published in place of `skipped` bytes of a worker's `stream`."""
    return (
        f"[runyard] {skipped:,} bytes of this worker's {stream} were not read: it wrote"
        f" more than {lines_per_s:,} lines/s for too long (docs/limits.md, Worker output)"
    )


def read_skips(worker_dir: Path) -> dict[str, list[Skip]]:
    """The skips saved in a worker folder's `offsets.json`, per stream, in file order."""
    try:
        saved = json.loads((worker_dir / "offsets.json").read_text())
        raw = saved.get("skips") if isinstance(saved, dict) else None
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    found: dict[str, list[Skip]] = {}
    for stream in STREAMS:
        entries = raw.get(stream)
        if not isinstance(entries, list):
            continue
        skips = sorted(s for e in entries if (s := Skip.from_json(e)) is not None)
        if skips:
            found[stream] = skips
    return found


def numbered_lines(
    path: Path, *, complete: bool, skips: Sequence[Skip] | None = None
) -> Iterator[tuple[int, bytes]]:
    """Every line of an output file with its number, from the start; the unfinished
    last line too when the file is `complete` (its worker is gone). A skipped stretch
    (`skips`; default: those saved beside the file) gives its notice line instead,
    numbered as the runtime's tail numbered it."""
    if skips is None:
        skips = read_skips(path.parent).get(path.stem, [])
    splitter = LineSplitter()
    seq = 0
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below, around the generator's yields)
    except FileNotFoundError:
        return
    with f:
        for skip in (*skips, None):
            stop = None if skip is None else skip.start
            while True:
                size = READ_SIZE if stop is None else min(READ_SIZE, stop - f.tell())
                chunk = f.read(size) if size > 0 else b""
                if not chunk:
                    break
                for raw, _ in splitter.feed(chunk):
                    yield seq, raw
                    seq += 1
            if skip is None:
                break
            # `start` ends a line the tail gave out: a last piece of LINE_MAX bytes it
            # cut seeing more bytes after it, which this read, ending here, holds back.
            for raw, _ in splitter.finish():
                yield seq, raw
                seq += 1
            yield seq, skip.notice.encode()
            seq += 1
            f.seek(skip.end)
            splitter = LineSplitter(skip.end)
    if complete:
        for raw, _ in splitter.finish():
            yield seq, raw


@dataclass
class Marks:
    """When publishing had reached which line of each stream: [time, stdout, stderr]."""

    entries: list[list[float]] = field(default_factory=list)

    def add(self, next_seq: Mapping[str, int | None], now: float | None = None) -> None:
        numbers = [float(next_seq.get(s) or 0) for s in STREAMS]
        if self.entries and self.entries[-1][1:] == numbers:
            return
        self.entries.append([time.time() if now is None else now, *numbers])
        if len(self.entries) > MAX_MARKS:  # every other one goes; the last one stays
            self.entries = self.entries[-1::-2][::-1]

    def time_of(self, stream: str, seq: int) -> float | None:
        """When line `seq` of `stream` had been published (None: never, as far as known)."""
        column = 1 + STREAMS.index(stream)
        for entry in self.entries:
            if entry[column] > seq:
                return entry[0]
        return None

    @classmethod
    def from_json(cls, raw: Any) -> Marks:
        if not isinstance(raw, list):
            return cls()
        entries = [
            [float(x) for x in e]
            for e in raw
            if isinstance(e, list) and len(e) == 3 and all(isinstance(x, int | float) for x in e)
        ]
        return cls(entries)


def read_marks(worker_dir: Path) -> Marks:
    try:
        saved = json.loads((worker_dir / "offsets.json").read_text())
    except (OSError, ValueError):
        return Marks()
    return Marks.from_json(saved.get("marks") if isinstance(saved, dict) else None)


def text(raw: bytes) -> str:
    """A line as published: UTF-8 (what is not becomes U+FFFD), without a trailing CR."""
    return raw.decode("utf-8", "replace").rstrip("\r")


@dataclass(frozen=True)
class OutputStream:
    """One output stream of one worker, whose lines [0, published) were published."""

    key: DeploymentKey
    worker: int
    stream: Stream
    path: Path
    published: int
    marks: Marks


@dataclass(frozen=True)
class KeptOutput:
    """The output files of a finished deployment, kept until their lines are stored."""

    key: DeploymentKey
    root: Path
    #: How many numbered lines each (worker, stream) holds.
    lines: Mapping[tuple[int, Stream], int]
    #: When the deployment finished (unix time).
    kept_at: float
    #: Kept from a deployment an earlier deployer left (`salvage`): lines past its
    #: saved offsets may never have been published, so what is missing goes out at once.
    salvaged: bool = False

    def path(self, worker: int, stream: str) -> Path:
        return self.root / f"w{worker}" / f"{stream}.log"


def keep(
    root: Path,
    key: DeploymentKey,
    lines: Mapping[tuple[int, Stream], int],
    *,
    salvaged: bool = False,
) -> KeptOutput:
    """Remove all of a cleaned-up deployment's folder but its workers' output files,
    and mark it `finished` (never adopted again)."""
    for child in list(root.iterdir()) if root.is_dir() else []:
        if child.is_dir() and not child.is_symlink() and child.name.startswith("w"):
            for item in child.iterdir():
                if item.name not in KEPT_FILES:
                    _remove(item)
        elif child.name != "state.json":
            _remove(child)
    kept = KeptOutput(key, root, dict(lines), time.time(), salvaged)
    state = {
        "task_id": key[0],
        "run": key[1],
        "attempt": key[2],
        "phase": "finished",
        "finished_at": kept.kept_at,
        "lines": [[w, s, n] for (w, s), n in sorted(kept.lines.items())],
        "salvaged": salvaged,
    }
    tmp = root / "state.json.tmp"
    tmp.write_text(json.dumps(state))
    tmp.replace(root / "state.json")
    return kept


def load_kept(scratch_root: Path) -> dict[DeploymentKey, KeptOutput]:
    """The kept outputs an earlier deployer left (`finished` in their state.json)."""
    found: dict[DeploymentKey, KeptOutput] = {}
    for state_file in sorted(scratch_root.glob("*/run*-a*/state.json")):
        try:
            raw = json.loads(state_file.read_text())
            if raw.get("phase") != "finished":
                continue
            key: DeploymentKey = (str(raw["task_id"]), int(raw["run"]), int(raw["attempt"]))
            lines = {(int(w), _stream(s)): int(n) for w, s, n in raw.get("lines", [])}
            found[key] = KeptOutput(
                key,
                state_file.parent,
                lines,
                float(raw["finished_at"]),
                raw.get("salvaged") is True,
            )
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("unreadable kept output %s", state_file)
    return found


def salvage(root: Path, key: DeploymentKey) -> KeptOutput | None:
    """Keep the output files of a deployment an earlier deployer left and this one will
    not go on with (its workers ended), as `keep` does, with every numbered line of
    each file (numbered as its follower numbers them): the earlier deployer may have
    read none, some or all of them, published or not. None (and the folder removed)
    when its workers wrote nothing."""
    lines: dict[tuple[int, Stream], int] = {}
    for worker_dir in sorted(root.glob("w*")) if root.is_dir() else []:
        if not worker_dir.name[1:].isdigit() or worker_dir.is_symlink():
            continue
        for stream in STREAMS:
            count = sum(1 for _ in numbered_lines(worker_dir / f"{stream}.log", complete=True))
            if count:
                lines[(int(worker_dir.name[1:]), stream)] = count
    if not lines:
        forget(root)
        return None
    return keep(root, key, lines, salvaged=True)


def forget(root: Path) -> None:
    """Remove a kept output's folder (and its task's folder, when that is empty)."""
    shutil.rmtree(root, ignore_errors=True)
    with contextlib.suppress(OSError):
        root.parent.rmdir()


def _stream(name: object) -> Stream:
    if name not in STREAMS:
        raise ValueError(f"not an output stream: {name!r}")
    return name


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
