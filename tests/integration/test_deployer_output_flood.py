"""A worker that floods its output (the local runtime, real processes, no database):
it is read at the configured pace, the stretch reading falls behind on is skipped
with one notice line in its place, its exit is reported without waiting for all it
wrote, and the file read again gives the very lines published, with their numbers."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest
from runyard.contracts.task_events import WorkerPlacement
from runyard.deployer import outputs
from runyard.deployer.runtime import (
    MAX_IN_FLIGHT,
    OUTPUT_BACKLOG_BYTES,
    OUTPUT_LINES_PER_S,
    Deployment,
    LocalRuntime,
    LocalRuntimeConfig,
    OnOutput,
    OutputLine,
)

from tests.integration.test_deployer import make_spec

pytestmark = pytest.mark.integration

#: Lines the worker writes (about 6.9 MB), far more than 2,000 lines/s lets through
#: before reading falls 256 KiB behind.
LINES = 1_000_000


@contextlib.asynccontextmanager
async def worker(
    tmp_path: Path,
    task_id: str,
    command: str,
    sink: OnOutput,
    *,
    lines_per_s: int = OUTPUT_LINES_PER_S,
    backlog: int = OUTPUT_BACKLOG_BYTES,
) -> AsyncIterator[tuple[LocalRuntime, Deployment]]:
    """One worker of `task_id` running `command`, its output to `sink`; the runtime and
    deployment once it exited 0 and its output was handed over (stopped and cleaned
    up after)."""
    config = LocalRuntimeConfig(
        scratch_root=tmp_path / "scratch",
        volumes_root=tmp_path / "volumes",
        images={"bash-only": Path("/usr")},
        grace_s=2.0,
        output_lines_per_s=lines_per_s,
        output_backlog_bytes=backlog,
    )
    runtime = LocalRuntime(config)
    placement = (WorkerPlacement(index=0, node="n", gpus=(0,)),)
    deployment = Deployment(task_id, 1, 1, make_spec(command), placement)
    exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def on_exit(key: object, worker: int, code: int, at: datetime) -> None:
        exited.set_result(code)

    for step in (runtime.allocate, runtime.pull_image, runtime.mount_storage, runtime.init_env):
        await step(deployment)
    await runtime.start_workers(deployment, sink, on_exit)
    try:
        assert await asyncio.wait_for(exited, 120) == 0
        await runtime.flush_output(deployment.key)
        yield runtime, deployment
    finally:
        await runtime.stop(deployment.key, 1.0)
        await runtime.cleanup(deployment.key)


async def test_a_flooding_worker_is_read_at_its_pace_and_skipped_where_behind(
    tmp_path: Path,
) -> None:
    published: list[OutputLine] = []

    async def on_output(line: OutputLine) -> None:
        published.append(line)

    command = f"seq 1 {LINES}; echo last line >&2"
    limits = {"lines_per_s": 2_000, "backlog": 256 * 1024}
    async with worker(tmp_path, "flood", command, on_output, **limits) as (runtime, _):
        stdout = [line for line in published if line.stream == "stdout"]
        numbers = [line.seq for line in stdout]
        assert numbers == list(range(len(stdout)))  # no gap: a skip takes one number
        notices = [line.line for line in stdout if line.line.startswith("[runyard] ")]
        assert notices and all("bytes of this worker's stdout were not read" in n for n in notices)
        assert "2,000 lines/s" in notices[0]
        written = [int(line.line) for line in stdout if not line.line.startswith("[runyard] ")]
        assert written == sorted(written) and written[-1] == LINES  # the end is always read
        assert len(written) < LINES // 2
        assert [line.line for line in published if line.stream == "stderr"] == ["last line"]

        worker_dir = runtime.config.scratch_root / "flood" / "run1-a1" / "w0"
        assert len(outputs.read_skips(worker_dir)["stdout"]) == len(notices)
        again = [
            (seq, outputs.text(raw))
            for seq, raw in outputs.numbered_lines(worker_dir / "stdout.log", complete=True)
        ]
        assert again == [(line.seq, line.line) for line in stdout]  # as a new deployer reads it


class Sink:
    """A pipelined sink (`runtime.PipelinedSink`) whose confirmations come later, in
    order; the confirmation of line `fail_at` fails once, as a broker going away."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.confirmed: list[tuple[int, str]] = []
        self.calls = 0

    async def __call__(self, line: OutputLine) -> None:
        assert line.seq is not None
        self.calls += 1
        self.confirmed.append((line.seq, line.line))

    async def submit(self, line: OutputLine) -> asyncio.Future[None]:
        confirm: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def settle() -> None:
            assert line.seq is not None
            if line.seq == self.fail_at:
                self.fail_at = -1
                confirm.set_exception(ConnectionError("the broker went away"))
            else:
                self.confirmed.append((line.seq, line.line))
                confirm.set_result(None)

        asyncio.get_running_loop().call_later(0.001, settle)
        return confirm


async def test_lines_are_published_many_at_once_and_again_after_a_failure(
    tmp_path: Path,
) -> None:
    sink = Sink(fail_at=5_000)
    async with worker(tmp_path, "piped", "seq 1 20000", sink) as (runtime, _):
        # Every line; those out when one failed may come twice (the log store drops those).
        first = {seq: text for seq, text in sink.confirmed}
        assert first == {seq: str(seq + 1) for seq in range(20_000)}
        # The order of the file, but for lines that were out when one failed: they may
        # be confirmed before it (the store orders lines by the time they were read).
        firsts = list(dict.fromkeys(seq for seq, _ in sink.confirmed))
        assert firsts[:5_000] == list(range(5_000)) and sorted(firsts) == list(range(20_000))
        assert all(abs(seq - at) <= MAX_IN_FLIGHT for at, seq in enumerate(firsts))
        # The failed line and those out after it, again one by one (no more than were out).
        assert 1 <= sink.calls <= MAX_IN_FLIGHT
        offsets = runtime.config.scratch_root / "piped/run1-a1/w0/offsets.json"
        saved = json.loads(offsets.read_text())
        assert saved["seq"]["stdout"] == 20_000


async def test_a_skipped_stretch_gives_its_disk_space_back(tmp_path: Path) -> None:
    """A worker that writes 64 MB of short lines at once is read at its pace: the stretch
    reading skips is never read again (its notice stands for it), so it leaves the host's
    disk; what a new deployer reads of the file is what was published."""
    published: list[OutputLine] = []

    async def on_output(line: OutputLine) -> None:
        published.append(line)

    size = 64_000_000
    command = f"yes | head -c {size}"
    limits = {"lines_per_s": 50_000, "backlog": 256 * 1024}
    async with worker(tmp_path, "holes", command, on_output, **limits) as (runtime, _):
        worker_dir = runtime.config.scratch_root / "holes" / "run1-a1" / "w0"
        stdout = worker_dir / "stdout.log"
        assert stdout.stat().st_size == size
        assert stdout.stat().st_blocks * 512 < size // 8, "the skipped stretch is still on disk"
        lines = [line for line in published if line.stream == "stdout"]
        assert any(line.line.startswith("[runyard] ") for line in lines)
        again = [
            (seq, outputs.text(raw)) for seq, raw in outputs.numbered_lines(stdout, complete=True)
        ]
        assert again == [(line.seq, line.line) for line in lines]
