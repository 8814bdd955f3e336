"""Process stacks of workers (SPEC R-33): py-spy dumps and a report across workers and ranks.

Capture: `py-spy dump --pid PID --json` for every live process of a worker's
process group (the launch command's `bash` wrappers are skipped: py-spy says
they are not Python). With `native=True` it asks for native frames
(`--native`) and falls back to Python frames when the kernel or the process
does not allow it. py-spy needs ptrace rights on the worker's processes:
same user, and `kernel.yama.ptrace_scope` <= 1 or CAP_SYS_PTRACE.

Report (`aggregate`): for each worker, the frame each of its Python threads
is in (the innermost one) and its main stack; function-call statistics (in
how many threads, of which workers, each function appears); the workers whose
main stack differs from the majority's first (the odd one out: in a hang,
usually the rank the others wait for); and the raw per-thread stacks.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

CAPTURE_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class Frame:
    name: str
    filename: str
    line: int

    def label(self) -> str:
        return f"{self.name} ({Path(self.filename).name}:{self.line})"

    @property
    def is_python(self) -> bool:
        """A Python frame (a native one, from `--native`, names a shared library)."""
        return self.filename.endswith(".py") or self.filename.startswith("<")


@dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread's stack, innermost frame first (as py-spy prints it)."""

    pid: int
    thread_id: int
    thread_name: str | None
    active: bool
    frames: tuple[Frame, ...]

    @property
    def python_frames(self) -> tuple[Frame, ...]:
        return tuple(f for f in self.frames if f.is_python)

    @property
    def top(self) -> str:
        """The innermost Python frame (native frames below it are kept in `frames`)."""
        python = self.python_frames
        return python[0].label() if python else "<no Python frame>"


@dataclass(frozen=True, slots=True)
class ProcessStacks:
    """What a dump of one process gave: its threads, or why there is none."""

    pid: int
    threads: tuple[ThreadStack, ...] = ()
    error: str | None = None


@dataclass
class StackReport:
    """The aggregated report of one capture, with the raw stacks kept."""

    report_id: str
    task_id: str
    run: int
    attempt: int
    captured_at: datetime
    #: Raw stacks per worker index: every process of the worker's group.
    workers: dict[int, list[ProcessStacks]]
    #: Worker -> the innermost frame of each of its Python threads.
    frames_by_worker: dict[int, list[str]] = field(default_factory=dict)
    #: Function -> {"threads": n, "workers": [indexes]}.
    functions: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Workers whose main stack is shared by the fewest workers come first.
    odd_ones_out: list[int] = field(default_factory=list)
    summary: str = ""

    def to_dict(self) -> dict[str, Any]:
        raw = asdict(self)
        raw["captured_at"] = self.captured_at.isoformat()
        raw["workers"] = {str(k): v for k, v in raw["workers"].items()}
        raw["frames_by_worker"] = {str(k): v for k, v in raw["frames_by_worker"].items()}
        return raw


def py_spy_binary() -> str | None:
    """py-spy next to this interpreter (a virtualenv), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.exists():
        return str(beside)
    return shutil.which("py-spy")


def parse_dump(pid: int, raw: str) -> ProcessStacks:
    """The threads of `py-spy dump --json` output."""
    threads = []
    for t in json.loads(raw):
        frames = tuple(
            Frame(f.get("name") or "?", f.get("filename") or "?", int(f.get("line") or 0))
            for f in t.get("frames", [])
        )
        threads.append(
            ThreadStack(
                pid=int(t.get("pid", pid)),
                thread_id=int(t.get("os_thread_id") or t.get("thread_id") or 0),
                thread_name=t.get("thread_name"),
                active=bool(t.get("active")),
                frames=frames,
            )
        )
    return ProcessStacks(pid, tuple(threads))


async def capture_pid(
    pid: int, *, native: bool = False, timeout_s: float = CAPTURE_TIMEOUT_S
) -> ProcessStacks:
    """The stacks of one process; `error` says why not when py-spy could not dump it."""
    binary = py_spy_binary()
    if binary is None:
        return ProcessStacks(pid, error="py-spy is not installed")
    tries = [["--native"], []] if native else [[]]
    error = "py-spy gave nothing"
    for extra in tries:
        args = [binary, "dump", "--pid", str(pid), "--json", *extra]
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            error = f"py-spy timed out after {timeout_s:.0f} s"
            continue
        if proc.returncode == 0:
            try:
                return parse_dump(pid, out.decode(errors="replace"))
            except (ValueError, TypeError) as exc:
                error = f"unreadable py-spy output: {exc}"
                continue
        error = _first_error_line(err.decode(errors="replace")) or f"py-spy exit {proc.returncode}"
    return ProcessStacks(pid, error=error)


def _first_error_line(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("Error:"):
            return line.removeprefix("Error:").strip()
    return text.strip().splitlines()[0] if text.strip() else ""


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (Linux /proc); [pgid] when /proc says nothing."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return [pgid]
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(name))
    return sorted(members) or [pgid]


def _is_python(pid: int) -> bool:
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return True  # let py-spy decide
    return "python" in Path(exe).name


async def capture_worker(pgid: int, *, native: bool = False) -> list[ProcessStacks]:
    """Stacks of every Python process of one worker's process group."""
    pids = [pid for pid in group_members(pgid) if _is_python(pid)]
    if not pids:
        return [ProcessStacks(pgid, error="no Python process in the worker's process group")]
    return list(await asyncio.gather(*(capture_pid(pid, native=native) for pid in pids)))


def _main_stack(processes: Iterable[ProcessStacks]) -> tuple[str, ...]:
    """A worker's signature: the function names of its main threads, innermost first."""
    names: list[str] = []
    for process in processes:
        for thread in process.threads:
            if thread.thread_name in (None, "MainThread") or thread.thread_id == process.pid:
                names.extend(f.name for f in thread.python_frames)
                names.append("|")
    return tuple(names)


def aggregate(
    report_id: str,
    task_id: str,
    run: int,
    attempt: int,
    captured_at: datetime,
    workers: Mapping[int, list[ProcessStacks]],
) -> StackReport:
    """The report over the workers' raw stacks: frames per worker, counts, odd one out."""
    report = StackReport(report_id, task_id, run, attempt, captured_at, dict(workers))
    threads_with: Counter[str] = Counter()
    workers_with: dict[str, set[int]] = defaultdict(set)
    for index, processes in sorted(workers.items()):
        threads = sorted(
            (t for p in processes for t in p.threads), key=lambda t: t.thread_name != "MainThread"
        )
        report.frames_by_worker[index] = [t.top for t in threads] or [
            p.error or "no stack" for p in processes
        ]
        for process in processes:
            for thread in process.threads:
                for name in {f.name for f in thread.python_frames}:
                    threads_with[name] += 1
                    workers_with[name].add(index)
    report.functions = {
        name: {"threads": count, "workers": sorted(workers_with[name])}
        for name, count in threads_with.most_common()
    }
    report.odd_ones_out = _odd_ones_out(workers)
    report.summary = _summary(report)
    return report


def _odd_ones_out(workers: Mapping[int, list[ProcessStacks]]) -> list[int]:
    signatures = {index: _main_stack(processes) for index, processes in workers.items()}
    sizes = Counter(signatures.values())
    if len(sizes) <= 1:
        return []
    majority = sizes.most_common(1)[0][0]
    odd = [i for i, sig in signatures.items() if sig != majority]
    return sorted(odd, key=lambda i: (sizes[signatures[i]], i))


def _summary(report: StackReport) -> str:
    parts = []
    for index in report.odd_ones_out:
        parts.append(f"worker {index} differs: {', '.join(report.frames_by_worker[index][:2])}")
    for index, frames in sorted(report.frames_by_worker.items()):
        if index not in report.odd_ones_out:
            parts.append(f"worker {index}: {', '.join(frames[:2])}")
    return "; ".join(parts)[:1000]
