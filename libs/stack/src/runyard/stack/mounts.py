"""The mounts a sandboxed deployment leaves below a folder when its deployer goes
without releasing them.

A local deployment keeps its network and IPC namespaces alive by bind mounts on two
files in its scratch folder, and mounts its /dev/shm (a tmpfs) and each worker's
system disk (a loop-mounted ext4) there. A deployer killed with its deployments up
leaves them for its successor, which adopts or discards them (`LocalRuntime.recover`).
A stack that has no successor (a benchmark's or a test's throwaway home) must unmount
them itself: a mounted file cannot be deleted, and every mount namespace made later on
the host copies them (each worker's sandbox then detaches them all, one by one).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

#: What a sandboxed deployment mounts in its folder (the mount's file system and source,
#: as /proc/self/mountinfo writes them after its ` - ` separator).
DEPLOYMENT_MOUNTS = (" - nsfs ", " - tmpfs runyard-shm ", " - ext4 /dev/loop")

_ESCAPE = re.compile(r"\\([0-7]{3})")


def deployment_mounts_under(roots: Iterable[Path]) -> list[str]:
    """Mount points of deployment mounts at or below any of `roots`, deepest first."""
    wanted = [Path(root) for root in roots]
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) < 5 or not any(kind in line for kind in DEPLOYMENT_MOUNTS):
            continue
        where = _ESCAPE.sub(lambda m: chr(int(m[1], 8)), fields[4])
        if any(Path(where).is_relative_to(root) for root in wanted):
            found.append(where)
    return sorted(set(found), key=lambda p: (-p.count("/"), p))


def unmount_deployments_under(roots: Iterable[Path]) -> int:
    """Detach (`umount -l`) every deployment mount below `roots`; the number found.
    Does nothing where this process may not unmount (not root) or has no umount."""
    umount = shutil.which("umount")
    if umount is None or os.geteuid() != 0:
        return 0
    found = deployment_mounts_under(roots)
    for start in range(0, len(found), 64):
        subprocess.run(
            [umount, "-l", *found[start : start + 64]],
            capture_output=True,
            timeout=60,
            check=False,
        )
    return len(found)
