"""The thread that starts sandboxed workers behind their seccomp filter
(`runyard.deployer.spawns`), with real processes: the filter and the nice value are that
thread's alone, what it starts inherits both, exits are seen and reaped, and a start
cancelled halfway leaves no process behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from runyard.deployer import runtime as runtime_module
from runyard.deployer.spawns import FilteredSpawns

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0 or os.uname().machine not in ("x86_64", "aarch64"),
        reason="the workers' filter needs root (CAP_SYS_ADMIN) and knows x86-64 and arm64",
    ),
]

#: What a process says of itself: its seccomp mode (2: a filter) and nice value, and
#: whether it may make a user namespace.
PROBE = (
    'grep "^Seccomp:" /proc/self/status | tr -d "\\t";'
    ' echo "nice:$(nice)"; unshare -U true 2>/dev/null && echo userns:yes || echo userns:no'
)


def seccomp_of(tid: int) -> str:
    status = Path(f"/proc/self/task/{tid}/status").read_text()
    return next(line.split()[1] for line in status.splitlines() if line.startswith("Seccomp:"))


def made() -> FilteredSpawns:
    space: dict[str, object] = {}
    exec(runtime_module._FILTER_PROGRAM, space)  # the runtime's own filter
    program, instructions = space["raw"], space["prog"]
    assert isinstance(program, bytes) and isinstance(instructions, list)
    spawns = FilteredSpawns(program, len(instructions), 7)
    assert spawns.start() is None
    return spawns


async def run(spawns: FilteredSpawns, command: str, out: Path) -> int:
    with out.open("wb") as file:
        started = await spawns.spawn(
            ["bash", "-c", command], cwd=out.parent, env=dict(os.environ), stdout=file, stderr=file
        )
    return await started.wait()


async def test_only_the_spawning_thread_is_filtered_and_what_it_starts_inherits_it(
    tmp_path: Path,
) -> None:
    spawns = made()
    try:
        assert await run(spawns, PROBE, tmp_path / "out") == 0
        assert (tmp_path / "out").read_text().split() == ["Seccomp:2", "nice:7", "userns:no"]
        # The thread itself, and none of the others (the event loop's here).
        assert spawns.thread_id is not None and spawns.thread_id != threading.get_native_id()
        assert seccomp_of(spawns.thread_id) == "2"
        assert seccomp_of(threading.get_native_id()) == "0"
        assert os.getpriority(os.PRIO_PROCESS, spawns.thread_id) == 7
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) != 7
        # What the event loop's thread starts: neither.
        probe = await asyncio.create_subprocess_exec(
            "bash", "-c", PROBE, stdout=asyncio.subprocess.PIPE
        )
        said, _ = await probe.communicate()
        assert said.decode().split()[0::2] == ["Seccomp:0", "userns:yes"]
    finally:
        spawns.close()


async def test_exits_are_seen_as_asyncio_would_say_them(tmp_path: Path) -> None:
    spawns = made()
    try:
        codes = await asyncio.gather(
            run(spawns, "exit 3", tmp_path / "a"),
            run(spawns, "true", tmp_path / "b"),
            run(spawns, "kill -9 $$", tmp_path / "c"),
        )
        assert list(codes) == [3, 0, -signal.SIGKILL]
    finally:
        spawns.close()


async def test_a_start_cancelled_halfway_leaves_no_process(tmp_path: Path) -> None:
    spawns = made()
    marker = f"runyard-spawn-test-{os.getpid()}"
    try:
        for _ in range(5):
            task = asyncio.create_task(run(spawns, f"exec -a {marker} sleep 60", tmp_path / "o"))
            await asyncio.sleep(0)  # submitted to the thread
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        def gone() -> None:
            while subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0:
                time.sleep(0.05)

        await asyncio.wait_for(asyncio.to_thread(gone), 10)
    finally:
        spawns.close()
        await asyncio.to_thread(subprocess.run, ["pkill", "-9", "-f", marker], check=False)


def test_the_interpreter_filter_is_the_spawning_threads_program() -> None:
    """The script a worker's interpreter runs (and Slurm's workers) installs the very
    program the spawning thread does."""
    assert runtime_module._FILTER_PROGRAM in runtime_module._WORKER_FILTER
