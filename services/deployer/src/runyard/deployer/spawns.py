"""Sandboxed workers started from a thread that is already behind their seccomp filter.

A sandboxed worker's shell runs behind a seccomp filter (no kernel keyring, no user
namespace, no io_uring: `runtime._WORKER_FILTER`) at the workers' nice value. A filter
is inherited by every process started after it is set, through `exec` and the change of
user; so is a nice value. They were set by an interpreter started for each worker
between the privilege drop and its shell: about 8 ms of CPU a worker (starting Python
and ctypes), the largest single cost of starting one.

A seccomp filter and a nice value belong to one thread of a process. `FilteredSpawns`
keeps one thread of the deployer that sets both on itself once and from then on only
starts workers' wrappers: each wrapper, its root setup (`nsenter`, `unshare`, the
mounts) and the worker after the drop are behind the filter and at that nice value from
their first instruction, while the deployer's other threads (its event loop, `sbatch`
of a Slurm pool in the same process, the mounts at allocate) are not. The setup as root
needs none of what the filter refuses.

A process started from that thread is not asyncio's: `Spawned` learns of its exit from
a pidfd watched by the event loop (Linux 5.3), reaped by its `Popen`. Where the filter
or a pidfd cannot be had, `FilteredSpawns.start` says why and the runtime starts the
interpreter per worker as before.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import logging
import os
import signal
import struct
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

#: <linux/prctl.h>, <linux/seccomp.h>.
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


class Spawned:
    """A process started by `FilteredSpawns`: its pid, and its exit code once known
    (negative: the signal that ended it, as asyncio's processes say it)."""

    def __init__(self, popen: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self.pid = popen.pid
        self._popen = popen
        self._loop = loop
        self._exit: asyncio.Future[int] = loop.create_future()
        self._pidfd: int | None = os.pidfd_open(popen.pid)
        loop.add_reader(self._pidfd, self._reap)

    def _reap(self) -> None:
        code = self._popen.poll()
        if code is None:  # woken before the exit could be collected: watched on
            return
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        if not self._exit.done():
            self._exit.set_result(code)

    async def wait(self) -> int:
        """The exit code, once the process ended (and was reaped)."""
        return await asyncio.shield(self._exit)


class FilteredSpawns:
    """One thread of this process, behind `program` (a seccomp filter, raw BPF of
    `count` instructions) and at `nice`, that starts processes (`spawn`)."""

    def __init__(self, program: bytes, count: int, nice: int) -> None:
        self._program = program
        self._count = count
        self._nice = nice
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        #: The filtered thread's id (the kernel's), once started.
        self.thread_id: int | None = None

    def start(self) -> str | None:
        """Make the thread and set its filter and nice value; None when it has them,
        else why not (the thread is then gone and `spawn` may not be used)."""
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="runyard-spawns")
        try:
            pool.submit(self._set_up).result(timeout=30)
        except Exception as exc:
            pool.shutdown(wait=False)
            return str(exc)
        if not hasattr(os, "pidfd_open"):
            pool.shutdown(wait=False)
            return "no pidfd_open here"
        try:
            os.close(os.pidfd_open(os.getpid()))
        except OSError as exc:
            pool.shutdown(wait=False)
            return f"pidfd_open: {exc.strerror}"
        self._pool = pool
        return None

    def _set_up(self) -> None:
        """On the pool's thread: the filter and the nice value, for it alone."""
        code = ctypes.create_string_buffer(self._program)
        fprog = ctypes.create_string_buffer(
            struct.pack("HxxxxxxP", self._count, ctypes.addressof(code))
        )
        libc = ctypes.CDLL(None, use_errno=True)
        # Without SECCOMP_FILTER_FLAG_TSYNC (the prctl has no flags): this thread only.
        where = ctypes.c_void_p(ctypes.addressof(fprog))
        if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, where, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"seccomp: {os.strerror(ctypes.get_errno())}")
        self.thread_id = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, self.thread_id, self._nice)

    async def spawn(
        self,
        args: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        stdout: IO[Any],
        stderr: IO[Any],
    ) -> Spawned:
        """Start `args` from the filtered thread, in a session of its own, stdin from
        /dev/null (as `asyncio.create_subprocess_exec` would)."""
        assert self._pool is not None, "FilteredSpawns.start first"
        loop = asyncio.get_running_loop()
        # The thread's own copies: the caller may close its files once this returns or
        # is cancelled, while the thread may still be about to start the process.
        out, err = os.dup(stdout.fileno()), os.dup(stderr.fileno())

        def popen() -> subprocess.Popen[bytes]:
            try:
                return subprocess.Popen(
                    list(args),
                    cwd=cwd,
                    env=dict(env),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
            finally:
                os.close(out)
                os.close(err)

        try:
            starting = loop.run_in_executor(self._pool, popen)
        except BaseException:
            os.close(out)
            os.close(err)
            raise
        try:
            started = await asyncio.shield(starting)
        except asyncio.CancelledError:
            # It starts all the same: ended at once and reaped, never left unwatched.
            starting.add_done_callback(lambda done: _end(done, loop))
            raise
        return Spawned(started, loop)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


def _end(
    starting: asyncio.Future[subprocess.Popen[bytes]], loop: asyncio.AbstractEventLoop
) -> None:
    """SIGKILL the process group a cancelled `spawn` started anyway, and reap it."""
    if starting.cancelled() or starting.exception() is not None:
        return
    popen = starting.result()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGKILL)
    Spawned(popen, loop)  # reaped when it is gone (the loop's reader holds it till then)
