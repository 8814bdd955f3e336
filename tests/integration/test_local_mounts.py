"""The local sandbox's mounts on the real kernel: made in batches, one `mount --all` each
(`runyard.deployer.runtime._mount_lines`), in a mount namespace of the test's own.

A batch's tests (is this hidden path a folder, a file, or gone?) run before its
mounts, so the batches are cut where an earlier mount changes what a later test
would see: the view is the one the mounts made one by one would give.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from runyard.deployer.runtime import _Mount, _mount_batches, _mount_lines, _Tools

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts need a root deployer"),
]

TMPFS = "size=1m,mode=0755,nosuid,nodev"


def hide(path: Path) -> _Mount:
    """What the sandbox does with a hidden path: a tmpfs over a folder, /dev/null over
    a file, nothing when it is not there (at that point of the sequence)."""
    file = _Mount("/dev/null", str(path), "none", "bind")
    return _Mount("runyard-hidden", str(path), "tmpfs", TMPFS, test="-d", otherwise=file)


def bind(source: Path | str, target: Path, options: str = "") -> _Mount:
    return _Mount(str(source), str(target), "none", f"bind,X-mount.mkdir{options}")


def mounted(
    mounts: list[_Mount], tmp_path: Path, then: str, opened: dict[int, Path] | None = None
) -> subprocess.CompletedProcess[str]:
    """In a new mount namespace: open `opened` (descriptor -> folder), make `mounts`,
    then run the shell command `then`."""
    tools = _Tools.find()
    if not tools.unshare or not tools.mount:
        pytest.skip("util-linux (unshare, mount) is not installed")
    lines = [f"exec {fd}<{shlex.quote(str(path))}" for fd, path in (opened or {}).items()]
    lines += _mount_lines(mounts, tmp_path / "fstab", tools.mount)
    script = "".join(f"{line} || exit 112\n" for line in lines) + then
    return subprocess.run(
        [tools.unshare, "--mount", "--propagation", "private", "bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_paths_with_any_character_are_mounted_where_they_say(tmp_path: Path) -> None:
    odd = "a b\tc#d'e$HOME\\f\ng é"
    source, target, read_only = tmp_path / f"src {odd}", tmp_path / f"dst {odd}", tmp_path / "ro"
    source.mkdir()
    (source / "marker").write_text("from the source\n")
    write = f"touch {shlex.quote(str(read_only / 'new'))} 2>/dev/null"
    done = mounted(
        [bind(source, target), bind(source, read_only, ",ro")],
        tmp_path,
        f"cat {shlex.quote(str(target / 'marker'))}; {write} && echo writable || echo read-only",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "from the source\nread-only\n"
    assert not (target / "marker").exists(), "mounted in the namespace only"


def test_each_hidden_path_is_looked_at_after_the_mounts_before_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "scratch" / "deep").mkdir(parents=True)
    (data / "token").write_text("secret\n")
    (data / "kept").mkdir()
    (data / "kept" / "own").write_text("mine\n")
    (data / "kept" / "inner-secret").write_text("hidden again\n")
    mounts = [
        hide(data),
        hide(data / "scratch"),  # gone once `data` is covered: nothing to do, no failure
        bind("/proc/self/fd/20", data / "kept"),  # opened before: bound back
        hide(data / "kept" / "inner-secret"),  # there again once `kept` is back: a file
    ]
    assert [len(b) for b in _mount_batches(mounts)] == [1, 2, 1]
    done = mounted(
        mounts,
        tmp_path,
        f"ls -A {data}; cat {data}/kept/own; wc -c < {data}/kept/inner-secret",
        opened={20: data / "kept"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["kept", "mine", "0"]


def test_a_failed_mount_fails_the_whole_setup(tmp_path: Path) -> None:
    done = mounted(
        [bind(tmp_path / "missing", tmp_path / "target"), hide(tmp_path)],
        tmp_path,
        "echo launched",
    )
    assert done.returncode == 112
    assert "launched" not in done.stdout


def test_batches_are_cut_only_where_a_test_depends_on_an_earlier_mount() -> None:
    shm, tmp = bind("/s/shm", Path("/dev/shm")), bind("/s/tmp", Path("/tmp"))
    var_tmp = _Mount("/s/tmp", "/var/tmp", "none", "bind", test="-d")
    under_tmp, root, made = hide(Path("/tmp/x/data")), hide(Path("/root")), bind("/a", Path("/b/c"))
    assert _mount_batches([shm, var_tmp, tmp, root]) == [[shm, var_tmp, tmp, root]]
    assert _mount_batches([tmp, under_tmp, root]) == [[tmp], [under_tmp, root]]
    # a folder above an earlier target may be made by it (X-mount.mkdir)
    above = hide(Path("/b"))
    assert _mount_batches([made, above]) == [[made], [above]]
    assert _mount_batches([under_tmp, tmp]) == [[under_tmp, tmp]], "no test: it joins"
