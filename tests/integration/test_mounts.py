"""Deployment mounts left below a folder are found and detached (`runyard.stack.mounts`),
and nothing else is: real mounts, so root only."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from runyard.stack.mounts import deployment_mounts_under, unmount_deployments_under

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root to mount"
)


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def test_left_mounts_are_detached_and_others_kept(tmp_path: Path) -> None:
    left = tmp_path / "left home" / "scratch" / "task-1" / "run1-a1"  # a space, escaped
    other = tmp_path / "other"
    for folder in (left / "w0" / "disk", left / "shm", other):
        folder.mkdir(parents=True)
    netns = left / "netns"
    netns.touch()
    subprocess.run(["unshare", f"--net={netns}", "true"], check=True)
    _mount("-t", "tmpfs", "runyard-shm", str(left / "shm"))
    _mount("-t", "tmpfs", "runyard-shm", str(other))  # the same kind, outside the roots
    plain = left / "w0" / "disk"
    _mount("-t", "tmpfs", "plain", str(plain))  # not a deployment's kind
    try:
        found = deployment_mounts_under([tmp_path / "left home"])
        assert found == [str(left / "netns"), str(left / "shm")]
        assert unmount_deployments_under([tmp_path / "left home"]) == 2
        assert not os.path.ismount(left / "shm") and not os.path.ismount(netns)
        assert deployment_mounts_under([tmp_path / "left home"]) == []
        assert os.path.ismount(other) and os.path.ismount(plain)
        shutil.rmtree(tmp_path / "left home" / "scratch" / "task-1" / "run1-a1" / "shm")
    finally:
        subprocess.run(["umount", "-l", str(other), str(plain)], check=False)
        unmount_deployments_under([tmp_path])
