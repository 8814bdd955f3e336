"""The local runtime's host mounts by system call (`runyard.deployer.mounts`), on real
loop devices and file systems: what `mount -o loop`, `mount -t tmpfs` and `umount -l`
did, nothing left behind when a mount fails, and the `mount` program again on a kernel
without LOOP_CONFIGURE."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from runyard.deployer import mounts
from runyard.deployer import runtime as runtime_module
from runyard.deployer.runtime import LocalRuntime

from tests.integration.test_deployer import local_config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0
        or not Path("/dev/loop-control").exists()
        or not shutil.which("mkfs.ext4")
        or not shutil.which("losetup"),
        reason="mounts need root, loop devices, mkfs.ext4 and losetup",
    ),
]

SIZE = 16 * 2**20


def ext4_image(path: Path) -> Path:
    runtime_module._make_ext4(shutil.which("mkfs.ext4") or "", path, SIZE)
    return path


def loops_of(image: Path) -> list[str]:
    """The loop devices set up on `image` (`losetup -j`)."""
    done = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True)
    return [line.split(":")[0] for line in done.stdout.splitlines()]


def mount_of(target: Path) -> tuple[str, str, str] | None:
    """(source, type, options) of the mount at `target` in this mount namespace."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        source, at, fstype, options, *_ = line.split()
        if at == str(target):
            return source, fstype, options
    return None


def gone(image: Path) -> bool:
    """Whether the loop device of `image` was freed (autoclear runs on its last
    release, which may follow a lazy unmount by a moment)."""
    deadline = time.monotonic() + 10
    while loops_of(image) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not loops_of(image)


def test_an_image_is_mounted_on_a_loop_device_freed_when_it_is_unmounted(
    tmp_path: Path,
) -> None:
    image, target = ext4_image(tmp_path / "disk.img"), tmp_path / "disk"
    target.mkdir()
    flags = mounts.MS_NOSUID | mounts.MS_NODEV
    mounts.mount_image(image, target, "ext4", flags, "noinit_itable,discard")
    try:
        [device] = loops_of(image)
        source, fstype, options = mount_of(target) or ("", "", "")
        assert (source, fstype) == (device, "ext4")
        assert {"nosuid", "nodev", "discard"} <= set(options.split(","))
        (target / "written").write_text("yes")
        assert (target / "written").read_text() == "yes"
    finally:
        mounts.detach([target])
    assert mount_of(target) is None
    assert gone(image)


def test_a_failed_mount_leaves_no_loop_device_and_says_where(tmp_path: Path) -> None:
    image, target = tmp_path / "zeros.img", tmp_path / "disk"
    target.mkdir()
    with open(image, "wb") as file:
        file.truncate(SIZE)  # no file system in it
    with pytest.raises(OSError, match=f"mount ext4 on {target}"):
        mounts.mount_image(image, target, "ext4", 0, "")
    assert mount_of(target) is None
    assert gone(image)
    with pytest.raises(OSError):  # no such image: nothing set up either
        mounts.mount_image(tmp_path / "missing.img", target, "ext4", 0, "")


def test_a_tmpfs_gets_its_options_and_detach_takes_what_is_mounted(tmp_path: Path) -> None:
    shm, plain = tmp_path / "shm", tmp_path / "plain"
    shm.mkdir()
    plain.mkdir()
    mounts.mount_tmpfs("runyard-test", shm, mounts.MS_NOSUID | mounts.MS_NODEV, "size=1m,mode=0700")
    source, fstype, options = mount_of(shm) or ("", "", "")
    assert (source, fstype) == ("runyard-test", "tmpfs")
    assert {"nosuid", "nodev", "size=1024k", "mode=700"} <= set(options.split(","))
    # A folder that is no mount point is no failure; the mount beside it goes all the same.
    mounts.detach([plain, shm])
    assert mount_of(shm) is None
    with pytest.raises(OSError, match=r"umount .*missing"):
        mounts.detach([tmp_path / "missing"])


def test_without_loop_configure_the_runtime_mounts_disks_with_the_mount_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel before Linux 5.8 answers LOOP_CONFIGURE with EINVAL or ENOTTY: the
    runtime says so once and mounts its disks by the `mount` program from then on."""
    runtime = LocalRuntime(local_config(tmp_path))
    if not runtime.namespaces:
        pytest.skip("sandboxed workers need a root deployer with util-linux")
    monkeypatch.setattr(mounts, "LOOP_CONFIGURE", 0x4CFF)  # no such loop ioctl: ENOTTY
    for n in range(2):
        image, target = ext4_image(tmp_path / f"disk{n}.img"), tmp_path / f"disk{n}"
        target.mkdir()
        runtime._mount_disk(image, target)
        try:
            assert runtime._loop_program
            [device] = loops_of(image)
            assert mount_of(target) == (device, "ext4", mount_of(target)[2])  # type: ignore[index]
        finally:
            mounts.detach([target])
        assert gone(image)
