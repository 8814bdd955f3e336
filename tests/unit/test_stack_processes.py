"""Pid files that only ever name the process they recorded (runyard.stack.processes).

Real processes (`sleep`, a Python parent): a pid file whose process is gone
and whose pid now runs something else must never lead to a signal.
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from runyard.stack.processes import (
    AlreadyRunning,
    ProcessIdentity,
    die_with_parent,
    end_recorded,
    exclusive,
    read_pid_file,
    write_pid_file,
)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """An innocent process, standing for whatever program got a recycled pid."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _exited_within(pid: int, timeout: float) -> bool:
    """Whether `pid` exits within `timeout` s (any process, not only a child)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([pidfd], [], [], timeout)
        return bool(readable)
    finally:
        os.close(pidfd)


def test_an_identity_names_its_process_only_while_it_runs(
    sleeper: subprocess.Popen[bytes],
) -> None:
    identity = ProcessIdentity.of(sleeper.pid)
    assert identity is not None and identity.running()
    sleeper.kill()
    os.waitid(os.P_PID, sleeper.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
    assert not identity.running()  # a zombie runs nothing
    sleeper.wait()
    assert not identity.running() and ProcessIdentity.of(sleeper.pid) is None


def test_the_recorded_process_is_ended_and_its_file_removed(
    sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    pid_file = tmp_path / "broker.pid"
    identity = ProcessIdentity.of(sleeper.pid)
    assert identity is not None
    write_pid_file(pid_file, identity)
    assert pid_file.stat().st_mode & 0o777 == 0o600
    assert read_pid_file(pid_file) == identity
    assert end_recorded(pid_file) == sleeper.pid
    assert sleeper.wait(timeout=10) == -signal.SIGKILL
    assert not pid_file.exists()


def _started_earlier(identity: ProcessIdentity) -> ProcessIdentity:
    return dataclasses.replace(identity, start_ticks=identity.start_ticks - 1)


def _before_a_reboot(identity: ProcessIdentity) -> ProcessIdentity:
    return dataclasses.replace(identity, boot_id="00000000-0000-0000-0000-000000000000")


@pytest.mark.parametrize("recorded", [_started_earlier, _before_a_reboot])
def test_a_pid_now_used_by_another_program_is_never_signalled(
    sleeper: subprocess.Popen[bytes],
    tmp_path: Path,
    recorded: Callable[[ProcessIdentity], ProcessIdentity],
) -> None:
    """The file names the sleeper's pid, but a process that started at
    another time or boot: the one a crashed owner recorded, long gone."""
    pid_file = tmp_path / "broker.pid"
    identity = ProcessIdentity.of(sleeper.pid)
    assert identity is not None
    write_pid_file(pid_file, recorded(identity))
    assert end_recorded(pid_file) is None
    assert sleeper.poll() is None  # still running: not signalled
    assert not pid_file.exists()  # and the stale file is gone


@pytest.mark.parametrize(
    "content",
    [f"{os.getpid()}\n", "", '{"pid": "x"}', "[1, 2]"],
    ids=["a bare pid", "empty", "a pid not a number", "not an object"],
)
def test_a_pid_file_without_an_identity_ends_nothing(tmp_path: Path, content: str) -> None:
    """A bare pid (here the test's own) is not enough to signal anything."""
    pid_file = tmp_path / "broker.pid"
    pid_file.write_text(content)
    assert read_pid_file(pid_file) is None
    assert end_recorded(pid_file) is None
    assert not pid_file.exists()


_PARENT = """\
import subprocess, sys, time
from runyard.stack.processes import die_with_parent
child = subprocess.Popen(die_with_parent(["sleep", "60"]))
print(child.pid, flush=True)
time.sleep(60)
"""


def test_a_child_started_to_die_with_its_parent_dies_on_kill_9_of_the_parent() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, start_new_session=True
    ) as parent:
        try:
            assert parent.stdout is not None
            child_pid = int(parent.stdout.readline())
            child = ProcessIdentity.of(child_pid)
            assert child is not None and child.running(), f"child {child_pid} is not running"
        finally:
            parent.kill()
    assert _exited_within(child_pid, timeout=30), f"child {child_pid} outlived its parent"
    assert not child.running(), f"{child} still runs"


def test_only_the_main_thread_ties_a_child_to_its_own_life() -> None:
    """The kernel signals the child when the thread that forked it ends: from
    another thread, the command is left as it is."""
    argv = ["sleep", "1"]
    assert die_with_parent(argv)[-2:] == argv and die_with_parent(argv) != argv
    seen: list[list[str]] = []
    thread = threading.Thread(target=lambda: seen.append(die_with_parent(argv)))
    thread.start()
    thread.join()
    assert seen == [argv]


def test_a_second_holder_is_refused_and_told_who_holds_the_lock(tmp_path: Path) -> None:
    lock = tmp_path / "up.lock"
    with exclusive(lock):
        with pytest.raises(AlreadyRunning) as refused, exclusive(lock):
            pass
        assert refused.value.holder == str(os.getpid())
    with exclusive(lock):  # released at the end of the block
        pass


_HOLDER = """\
import sys, time
from pathlib import Path
from runyard.stack.processes import exclusive
with exclusive(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""


def test_the_lock_of_a_killed_holder_is_free_at_once(tmp_path: Path) -> None:
    lock = tmp_path / "up.lock"
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(lock)], stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            with pytest.raises(AlreadyRunning) as refused, exclusive(lock):
                pass
            assert refused.value.holder == str(holder.pid)
        finally:
            holder.kill()
    with exclusive(lock):  # no stale lock after kill -9
        pass
