"""The local runtime's mounts on the host, made by system call.

A deployment's /dev/shm (a tmpfs) and each sandboxed worker's system disk (an ext4
image on a loop device) are mounted at allocate and unmounted with the namespaces.
Each was a `mount` or `umount` program: starting one costs a few milliseconds of CPU
(mapping and relocating it), more than the mount itself, three or four times per
worker. Here they are the calls those programs make: `mount(2)`, the loop device's
`LOOP_CTL_GET_FREE` and `LOOP_CONFIGURE` (with autoclear, as `mount -o loop` sets it:
the device is freed when its file system is unmounted) and `umount2(2)` with
`MNT_DETACH` (`umount -l`).

Every function raises OSError naming the call and what it was given; a kernel without
`LOOP_CONFIGURE` (before Linux 5.8) raises `Unsupported`, and the caller runs the
program instead.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
from pathlib import Path

#: <linux/mount.h> and <sys/mount.h>.
MS_NOSUID = 0x2
MS_NODEV = 0x4
MNT_DETACH = 0x2
#: <linux/loop.h>.
LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LO_FLAGS_AUTOCLEAR = 4
#: `struct loop_info64`'s name field (`lo_file_name`).
LO_NAME_SIZE = 64

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]  # fmt: skip
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


class Unsupported(OSError):
    """This kernel lacks a call these mounts need: run the program instead."""


def mount(source: str, target: Path, fstype: str, flags: int, data: str) -> None:
    """`mount(2)`: OSError with the target and the kernel's reason when it fails."""
    done = _libc.mount(source.encode(), os.fsencode(target), fstype.encode(), flags, data.encode())
    if done != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount {fstype} on {target}: {os.strerror(code)}")


def mount_tmpfs(name: str, target: Path, flags: int, data: str) -> None:
    """A tmpfs called `name` at `target` (`mount -t tmpfs -o <data> <name> <target>`)."""
    mount(name, target, "tmpfs", flags, data)


def mount_image(image: Path, target: Path, fstype: str, flags: int, data: str) -> None:
    """The file system in `image` at `target` through a free loop device of its own
    (`mount -t <fstype> -o loop,<data> <image> <target>`). The device is freed when the
    file system is unmounted, or here at once when the mount fails."""
    back = os.open(image, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
        try:
            device = _configured_loop(control, back, image)
        finally:
            os.close(control)
    finally:
        os.close(back)
    fd, path = device
    try:
        mount(path, target, fstype, flags, data)
    finally:
        # Autoclear: with the mount failed this last close frees the device; with it
        # made the device stays until the file system is unmounted.
        os.close(fd)


def _configured_loop(control: int, back: int, image: Path) -> tuple[int, str]:
    """A free loop device (its open fd and path) set up on the file `back`; another
    process taking the device first is tried again on the next free one."""
    name = os.fsencode(image)[-(LO_NAME_SIZE - 1) :]
    # struct loop_info64: device, inode, rdevice, offset, sizelimit, number,
    # encrypt_type, encrypt_key_size, flags, file_name, crypt_name, encrypt_key, init.
    info = struct.pack(
        "=5Q4I64s64s32s2Q", 0, 0, 0, 0, 0, 0, 0, 0, LO_FLAGS_AUTOCLEAR, name, b"", b"", 0, 0
    )
    # struct loop_config: fd, block_size, info, reserved.
    config = struct.pack("=2I", back, 0) + info + bytes(64)
    for _ in range(16):
        number = fcntl.ioctl(control, LOOP_CTL_GET_FREE)
        path = f"/dev/loop{number}"
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.ioctl(fd, LOOP_CONFIGURE, config)
        except OSError as exc:
            os.close(fd)
            if exc.errno == errno.EBUSY:  # taken between the two calls: the next one
                continue
            if exc.errno in (errno.EINVAL, errno.ENOTTY):
                raise Unsupported(exc.errno, f"LOOP_CONFIGURE on {path}: {exc.strerror}") from exc
            raise OSError(exc.errno, f"LOOP_CONFIGURE on {path}: {exc.strerror}") from exc
        return fd, path
    raise OSError(errno.EBUSY, "no free loop device after 16 tries")


def detach(targets: list[Path]) -> None:
    """`umount -l` of each target: detached now, gone once nothing uses it. All are
    tried; OSError for the first that fails (one not mounted any more is no failure)."""
    failed: OSError | None = None
    for target in targets:
        if _libc.umount2(os.fsencode(target), MNT_DETACH) != 0:
            code = ctypes.get_errno()
            if code != errno.EINVAL and failed is None:  # EINVAL: not a mount point
                failed = OSError(code, f"umount {target}: {os.strerror(code)}")
    if failed is not None:
        raise failed
