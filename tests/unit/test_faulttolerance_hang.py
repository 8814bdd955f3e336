"""Hang detection (R-33); the deployer's stack capture with real processes (py-spy),
the fault-tolerance report over it, and the trimming that keeps a capture's event small."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from runyard.contracts.stacks import (
    ProcessStacks,
    StackFrame,
    ThreadStack,
    WorkerStacks,
    bounded,
    size_of,
)
from runyard.deployer.runtime import group_members
from runyard.deployer.stacks import capture_group, capture_pid, py_spy_binary
from runyard.faulttolerance.hang import HangDetector
from runyard.faulttolerance.stacks import aggregate

T0 = datetime(2026, 11, 30, 2, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_hang_after_timeout_without_lines_or_steps() -> None:
    detector = HangDetector(timeout_s=30, started_at=at(0))
    detector.line(0, at(5), step=1)
    detector.line(1, at(8))
    assert detector.check(at(37)) is None
    verdict = detector.check(at(39))
    assert verdict is not None
    assert verdict.idle_s == pytest.approx(31)
    assert verdict.last_log_at == at(8) and verdict.last_step == 1
    assert verdict.last_line_by_worker == {0: at(5), 1: at(8)}
    assert "no progress for 31 s (timeout 30 s)" in verdict.describe(30)
    assert detector.check(at(60)) is None, "one verdict per idle spell"
    detector.line(0, at(61))
    assert detector.check(at(92)) is not None


def test_never_wrote_counts_from_the_start() -> None:
    detector = HangDetector(timeout_s=10, started_at=at(0))
    verdict = detector.check(at(10))
    assert verdict is not None and verdict.last_log_at is None
    assert "no log line yet" in verdict.describe(10)


def test_lines_arriving_late_do_not_move_progress_back() -> None:
    detector = HangDetector(timeout_s=10, started_at=at(0))
    detector.line(0, at(9))
    detector.line(1, at(3))
    assert detector.last_progress_at() == at(9)


SCRIPT = """
import sys, threading, time
def wait_for_peers():
    time.sleep(600)
def all_reduce_stuck():
    time.sleep(600)
threading.Thread(target=wait_for_peers, name="heartbeat", daemon=True).start()
print("ready", flush=True)
(all_reduce_stuck if sys.argv[1] == "odd" else wait_for_peers)()
"""


@pytest.fixture
def workers(tmp_path: Path):  # type: ignore[no-untyped-def]
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    procs = []
    for kind in ("same", "same", "odd"):
        # bash in front, as the runtime's wrapper: the group has a non-Python member
        proc = subprocess.Popen(
            ["bash", "-c", f'"{sys.executable}" "{script}" {kind}; exit $?'],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        procs.append(proc)
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
    # "ready" comes just before each main thread, and maybe its heartbeat thread, goes to
    # sleep; on a loaded machine a capture at once can catch one on its way there, and
    # take a worker like the others for the odd one out. A hung worker has long been
    # asleep when its stacks are captured.
    time.sleep(0.5)
    yield procs
    for proc in procs:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


pytestmark_spy = pytest.mark.skipif(py_spy_binary() is None, reason="py-spy is not installed")


@pytestmark_spy
async def test_captured_stack_shows_the_sleeping_frame(
    workers: list[subprocess.Popen[bytes]],
) -> None:
    stacks = await capture_group(workers[0].pid, group_members)
    assert len(stacks) == 1, "only the Python process of the group is dumped"
    (process,) = stacks
    assert process.error is None, process.error
    names = {t.thread_name: [f.name for f in t.frames] for t in process.threads}
    assert names["MainThread"][0] == "wait_for_peers"
    assert names["heartbeat"][0] == "wait_for_peers"
    assert process.threads[0].frames[0].filename.endswith("train.py")


@pytestmark_spy
async def test_report_puts_the_odd_rank_first(workers: list[subprocess.Popen[bytes]]) -> None:
    captured = await asyncio.gather(
        *(capture_group(p.pid, group_members, native=True) for p in workers)
    )
    report = aggregate("r1", "t1", 1, 1, T0, dict(enumerate(captured)))
    assert report.odd_ones_out == [2]
    assert report.frames_by_worker[2][0].startswith("all_reduce_stuck (train.py:")
    assert report.functions["wait_for_peers"]["workers"] == [0, 1, 2]
    assert report.functions["all_reduce_stuck"] == {"threads": 1, "workers": [2]}
    assert report.summary.startswith("worker 2 differs: all_reduce_stuck")
    raw = report.to_dict()
    raw_names = [f["name"] for f in raw["workers"]["0"][0]["threads"][0]["frames"]]
    assert "wait_for_peers" in raw_names  # raw stacks kept, native frames included


async def test_a_process_that_is_gone_gives_an_error() -> None:
    proc = await asyncio.create_subprocess_exec("true")
    await proc.wait()
    stacks = await capture_pid(proc.pid)
    assert stacks.threads == () and stacks.error


def test_aggregate_with_identical_workers_has_no_odd_one() -> None:
    frame = StackFrame(name="barrier", filename="/w/train.py", line=10)
    thread = ThreadStack(pid=1, thread_id=1, thread_name="MainThread", frames=(frame,))
    same = [ProcessStacks(pid=1, threads=(thread,))]
    report = aggregate("r", "t", 1, 1, T0, {0: same, 1: same})
    assert report.odd_ones_out == []
    assert report.frames_by_worker == {0: ["barrier (train.py:10)"], 1: ["barrier (train.py:10)"]}
    assert report.functions == {"barrier": {"threads": 2, "workers": [0, 1]}}


def _deep_worker(index: int, threads: int, depth: int) -> WorkerStacks:
    frames = tuple(
        StackFrame(name=f"f{d}", filename=f"/w/module_{d}.py", line=d) for d in range(depth)
    )
    stacks = tuple(
        ThreadStack(
            pid=7, thread_id=t, thread_name="MainThread" if t == 0 else f"t{t}", frames=frames
        )
        for t in range(threads)
    )
    return WorkerStacks(worker=index, processes=(ProcessStacks(pid=7, threads=stacks),))


def test_a_small_capture_is_kept_whole() -> None:
    workers = [_deep_worker(0, 2, 10)]
    kept, note = bounded(workers)
    assert kept == tuple(workers) and note == ""


def test_a_large_capture_keeps_the_innermost_frames_and_says_so() -> None:
    workers = [_deep_worker(i, 8, 500) for i in range(4)]
    budget = 64 * 1024
    assert size_of(workers) > budget
    kept, note = bounded(workers, budget)
    assert size_of(kept) <= budget
    first = kept[0].processes[0].threads[0].frames
    assert first[0].name == "f0", "the innermost frame says where the thread is"
    assert len(first) < 500 and "innermost frames per thread" in note and "500" in note


def test_a_capture_of_too_many_threads_keeps_the_main_thread() -> None:
    workers = [_deep_worker(0, 3000, 2)]
    kept, note = bounded(workers, 16 * 1024)
    assert size_of(kept) <= 16 * 1024
    threads = kept[0].processes[0].threads
    assert threads[0].thread_name == "MainThread" and "thread(s) per process" in note
