"""Processes the embedded stack starts, found again (and only them) after a crash.

A pid names a process only while it lives: once it exits, the kernel may give
the number to any other program. So a pid file written here holds the boot id
and the process' start time (clock ticks since boot, /proc/<pid>/stat) beside
the pid, and a process counts as the one recorded only when all three match;
otherwise the file is stale and nothing is signalled. Signals go through a
pidfd opened before the check, so the process checked is the one signalled.

Also here: `die_with_parent` (the kernel ends a child when its parent dies,
where it can) and `exclusive` (one `runyard up` per home). Identities and
`die_with_parent` need Linux (/proc, prctl, pidfd); elsewhere no identity is
found (so none is recorded nor signalled) and children are not tied.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

_PROC = Path("/proc")

#: Sets PR_SET_PDEATHSIG, checks that the parent did not die before that, then
#: becomes the program: the setting survives exec (not the fork a daemon does).
_DIE_WITH_PARENT = """\
import ctypes, os, sys
if ctypes.CDLL(None, use_errno=True).prctl(1, int(sys.argv[1]), 0, 0, 0) != 0:
    sys.exit("prctl(PR_SET_PDEATHSIG) failed: errno %d" % ctypes.get_errno())
if os.getppid() != int(sys.argv[2]):
    sys.exit("not started: the process that started it has exited")
os.execv(sys.argv[3], sys.argv[3:])
"""


def boot_id() -> str:
    """This boot's id: start ticks restart from 0 at each boot."""
    return (_PROC / "sys/kernel/random/boot_id").read_text().strip()


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first),
    or None when there is no such process."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text.rpartition(")")[2].split()  # the name may hold spaces and ")"


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot; None when it is gone
    or has exited and waits to be reaped (a zombie runs nothing)."""
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of proc(5), `starttime`


def command_line(pid: int) -> list[str] | None:
    """The arguments `pid` runs with (None when it is gone)."""
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return [arg.decode(errors="replace") for arg in raw.split(b"\0")[:-1]]


@dataclass(frozen=True)
class ProcessIdentity:
    """One process over its whole life: no other process, now or later, has
    the same pid, boot id and start time."""

    pid: int
    boot_id: str
    start_ticks: int

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity | None:
        """The identity of the running process `pid`, or None."""
        ticks = start_ticks(pid)
        return None if ticks is None else cls(pid, boot_id(), ticks)

    def running(self) -> bool:
        """Whether this very process still runs (not another one with its pid)."""
        return ProcessIdentity.of(self.pid) == self


def write_pid_file(path: Path, identity: ProcessIdentity) -> None:
    """Record `identity` in `path` (mode 0600; replaced whole, never half written)."""
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(identity), out)
    os.replace(partial, path)


def read_pid_file(path: Path) -> ProcessIdentity | None:
    """The identity `path` records; None when it is missing or not one of ours
    (an unreadable file names no process that could safely be signalled)."""
    try:
        data = json.loads(path.read_text())
        return ProcessIdentity(int(data["pid"]), str(data["boot_id"]), int(data["start_ticks"]))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def end_process(
    identity: ProcessIdentity, sig: int = signal.SIGKILL, timeout: float = 10.0
) -> bool:
    """Send `sig` to the process `identity` names, if it still is that process,
    and wait until it has exited. Returns whether it was signalled."""
    try:
        pidfd = os.pidfd_open(identity.pid)
    except ProcessLookupError:
        return False
    try:
        # Checked after the pidfd is open: if the pid still is that process
        # now, the pidfd refers to it, whatever happens to the number later.
        if not identity.running():
            return False
        try:
            signal.pidfd_send_signal(pidfd, sig)
        except ProcessLookupError:
            return False  # it exited meanwhile
        readable, _, _ = select.select([pidfd], [], [], timeout)  # readable once it exited
        if not readable:
            raise TimeoutError(
                f"process {identity.pid} still runs {timeout:.0f}s after signal {sig}:"
                f" end it (kill -9 {identity.pid}) and start again"
            )
        return True
    finally:
        os.close(pidfd)


def end_recorded(path: Path, sig: int = signal.SIGKILL) -> int | None:
    """End the process the pid file `path` records, if that very process still
    runs (a previous run crashed before it could), and remove the file.
    Returns the pid ended, None when there was nothing to end."""
    identity = read_pid_file(path)
    ended = identity is not None and end_process(identity, sig)
    path.unlink(missing_ok=True)
    return identity.pid if ended and identity is not None else None


def die_with_parent(argv: list[str], sig: int = signal.SIGKILL) -> list[str]:
    """`argv`, run so that the kernel sends it `sig` when the thread starting
    it (this process' main thread) ends, even by kill -9.

    Only from the main thread: the kernel ties the signal to the thread that
    forks, and a helper thread ending would end the child too. From any other
    thread, or on another system than Linux, `argv` is returned as it is."""
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return argv
    launcher = [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT]
    return [*launcher, str(int(sig)), str(os.getpid()), *argv]


class AlreadyRunning(RuntimeError):
    """Another process holds the lock; `holder` is the pid it wrote (or "")."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is locked by process {holder or '(unknown)'}")
        self.path = path
        self.holder = holder


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created 0600) while the block runs;
    raise AlreadyRunning at once when another process holds it.

    The kernel drops the lock when its holder dies, kill -9 included, so a
    crash never leaves it behind; the pid written into the file only names
    the holder in the error. The descriptor is not inherited (close-on-exec)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise AlreadyRunning(path, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
