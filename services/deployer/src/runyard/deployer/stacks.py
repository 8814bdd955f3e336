"""Stacks of the local runtime's workers (SPEC R-33): py-spy dumps of their processes.

`py-spy dump --pid PID --json` for every live Python process of a worker: its
process group and every descendant, also one in a session of its own (torchrun's
ranks); the launch command's `bash` wrappers are skipped: py-spy says they are
not Python. With `native=True` it asks for native frames
(`--native`) and falls back to Python frames when the kernel or the process
does not allow it. py-spy needs ptrace rights on the worker's processes: same
user, and `kernel.yama.ptrace_scope` <= 1 or CAP_SYS_PTRACE (the deployer
starts the workers, so it has them).

A process py-spy cannot dump gives a `ProcessStacks` with `error` saying why,
never an exception: a report with one worker missing still helps.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from runyard.contracts.stacks import ProcessStacks, StackFrame, ThreadStack

#: One py-spy try (two with the native fallback): both fit in the 20 s the
#: fault-tolerance service waits for a capture.
CAPTURE_TIMEOUT_S = 8.0


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
            StackFrame(
                name=f.get("name") or "?",
                filename=f.get("filename") or "?",
                line=int(f.get("line") or 0),
            )
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
    return ProcessStacks(pid=pid, threads=tuple(threads))


async def capture_pid(
    pid: int, *, native: bool = False, timeout_s: float = CAPTURE_TIMEOUT_S
) -> ProcessStacks:
    """The stacks of one process; `error` says why not when py-spy could not dump it."""
    binary = py_spy_binary()
    if binary is None:
        return ProcessStacks(pid=pid, error="py-spy is not installed")
    tries = [["--native"], []] if native else [[]]
    error = "py-spy gave nothing"
    for extra in tries:
        args = [binary, "dump", "--pid", str(pid), "--json", *extra]
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            async with asyncio.timeout(timeout_s):
                out, err = await proc.communicate()
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
    return ProcessStacks(pid=pid, error=error)


def _first_error_line(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("Error:"):
            return line.removeprefix("Error:").strip()
    return text.strip().splitlines()[0] if text.strip() else ""


def _is_python(pid: int) -> bool:
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return True  # let py-spy decide
    return "python" in Path(exe).name


async def capture_group(
    pgid: int, members: Callable[[int], list[int]], *, native: bool = False
) -> list[ProcessStacks]:
    """Stacks of every Python process of one worker (`members(pgid)`: its process group
    and what its processes started, see `runtime.worker_processes`), in that order."""
    pids = [pid for pid in members(pgid) if _is_python(pid)]
    if not pids:
        message = "no Python process in the worker"
        return [ProcessStacks(pid=pgid, error=message)]
    return list(await asyncio.gather(*(capture_pid(pid, native=native) for pid in pids)))
