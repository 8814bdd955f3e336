"""Process stacks of workers (SPEC R-33), as `StacksCaptured` carries them.

The deployer, which owns the worker processes, dumps their stacks (py-spy)
into these models; the fault-tolerance service reads them back from the event
and keeps a report. Both read a capture the same way, so the reading lives
here, pure: the frame each thread is in (its innermost Python frame), which
functions appear in how many threads of which workers, the workers whose main
stack differs from the majority's (the odd one out: in a hang, usually the
rank the others wait for), and a one-line summary.

An event is at most 512 KiB (docs/limits.md): `bounded` trims a large dump
(outer frames first, then threads) to a byte budget and says what it cut.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

#: What the stacks of one event may take (half the event cap: room for the rest).
STACKS_BUDGET_BYTES = 256 * 1024
#: Frames kept per thread, tried in turn until the dump fits (None: all).
FRAME_LIMITS: tuple[int | None, ...] = (None, 256, 64, 16, 4, 1)
#: Threads kept per process once one frame per thread is still too much.
THREAD_LIMITS: tuple[int, ...] = (64, 8, 1)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StackFrame(_Model):
    """One frame: function, file and line (a native frame names a shared library)."""

    name: str
    filename: str
    line: int = 0

    def label(self) -> str:
        return f"{self.name} ({PurePath(self.filename).name}:{self.line})"

    @property
    def is_python(self) -> bool:
        return self.filename.endswith(".py") or self.filename.startswith("<")


class ThreadStack(_Model):
    """One thread's stack, innermost frame first (as py-spy prints it)."""

    pid: int
    thread_id: int
    thread_name: str | None = None
    active: bool = False
    frames: tuple[StackFrame, ...] = ()

    @property
    def python_frames(self) -> tuple[StackFrame, ...]:
        return tuple(f for f in self.frames if f.is_python)

    @property
    def top(self) -> str:
        """The innermost Python frame (native frames below it are kept in `frames`)."""
        python = self.python_frames
        return python[0].label() if python else "<no Python frame>"


class ProcessStacks(_Model):
    """What a dump of one process gave: its threads, or why there is none."""

    pid: int
    threads: tuple[ThreadStack, ...] = ()
    error: str | None = None


class WorkerStacks(_Model):
    """Every Python process of one worker (its process group)."""

    worker: int = Field(ge=0)
    processes: tuple[ProcessStacks, ...] = ()


@dataclass(frozen=True, slots=True)
class StackDigest:
    """How a capture reads across workers (see the module docstring)."""

    #: Worker -> the innermost frame of each of its Python threads (main thread first).
    frames_by_worker: dict[int, list[str]]
    #: Function -> {"threads": n, "workers": [indexes]}, most frequent first.
    functions: dict[str, dict[str, Any]]
    #: Workers whose main stack is shared by the fewest workers come first.
    odd_ones_out: list[int]
    summary: str


def by_worker(workers: Iterable[WorkerStacks]) -> dict[int, list[ProcessStacks]]:
    return {w.worker: list(w.processes) for w in workers}


def digest(workers: Mapping[int, Sequence[ProcessStacks]]) -> StackDigest:
    """The digest of a capture: frames per worker, function counts, odd ones out."""
    frames: dict[int, list[str]] = {}
    threads_with: Counter[str] = Counter()
    workers_with: dict[str, set[int]] = defaultdict(set)
    for index, processes in sorted(workers.items()):
        threads = sorted(
            (t for p in processes for t in p.threads), key=lambda t: t.thread_name != "MainThread"
        )
        frames[index] = [t.top for t in threads] or [p.error or "no stack" for p in processes]
        for thread in threads:
            for name in {f.name for f in thread.python_frames}:
                threads_with[name] += 1
                workers_with[name].add(index)
    functions = {
        name: {"threads": count, "workers": sorted(workers_with[name])}
        for name, count in threads_with.most_common()
    }
    odd = _odd_ones_out(workers)
    return StackDigest(frames, functions, odd, _summary(frames, odd))


def _main_stack(processes: Iterable[ProcessStacks]) -> tuple[str, ...]:
    """A worker's signature: the function names of its main threads, innermost first."""
    names: list[str] = []
    for process in processes:
        for thread in process.threads:
            if thread.thread_name in (None, "MainThread") or thread.thread_id == process.pid:
                names.extend(f.name for f in thread.python_frames)
                names.append("|")
    return tuple(names)


def _odd_ones_out(workers: Mapping[int, Sequence[ProcessStacks]]) -> list[int]:
    signatures = {index: _main_stack(processes) for index, processes in workers.items()}
    sizes = Counter(signatures.values())
    if len(sizes) <= 1:
        return []
    majority = sizes.most_common(1)[0][0]
    odd = [i for i, sig in signatures.items() if sig != majority]
    return sorted(odd, key=lambda i: (sizes[signatures[i]], i))


def _summary(frames: Mapping[int, list[str]], odd: Sequence[int]) -> str:
    parts = [f"worker {i} differs: {', '.join(frames[i][:2])}" for i in odd]
    parts += [f"worker {i}: {', '.join(f[:2])}" for i, f in sorted(frames.items()) if i not in odd]
    return "; ".join(parts)[:1000] or "no stack"


def size_of(workers: Sequence[WorkerStacks]) -> int:
    """Bytes the stacks take in an event's JSON."""
    return sum(len(w.model_dump_json()) for w in workers) + len(workers) + 2


def bounded(
    workers: Sequence[WorkerStacks], budget: int = STACKS_BUDGET_BYTES
) -> tuple[tuple[WorkerStacks, ...], str]:
    """`workers` within `budget` bytes, and a note saying what was cut ("" if nothing).

    Outer frames go first (the innermost ones say where a thread is), then
    threads beyond the first of each process (the main thread is kept)."""
    deepest = max(
        (len(t.frames) for w in workers for p in w.processes for t in p.threads), default=0
    )
    for limit in FRAME_LIMITS:
        trimmed = tuple(_trim(w, limit, None) for w in workers)
        if size_of(trimmed) <= budget:
            if limit is None or limit >= deepest:
                return trimmed, ""
            return trimmed, (
                f"stacks cut to their {limit} innermost frames per thread (the deepest had "
                f"{deepest}) to keep the event under {budget // 1024} KiB"
            )
    for threads in THREAD_LIMITS:
        trimmed = tuple(_trim(w, 1, threads) for w in workers)
        if size_of(trimmed) <= budget:
            return trimmed, (
                f"stacks cut to the innermost frame of the first {threads} thread(s) per "
                f"process to keep the event under {budget // 1024} KiB"
            )
    empty = tuple(WorkerStacks(worker=w.worker) for w in workers)
    return empty, f"stacks left out: over {budget // 1024} KiB even cut to one frame"


def _trim(worker: WorkerStacks, frames: int | None, threads: int | None) -> WorkerStacks:
    processes = tuple(
        p.model_copy(
            update={
                "threads": tuple(
                    t.model_copy(update={"frames": t.frames[:frames]})
                    for t in (p.threads if threads is None else _main_first(p.threads)[:threads])
                )
            }
        )
        for p in worker.processes
    )
    return worker.model_copy(update={"processes": processes})


def _main_first(threads: Sequence[ThreadStack]) -> tuple[ThreadStack, ...]:
    return tuple(sorted(threads, key=lambda t: t.thread_name != "MainThread"))
