"""The local runtime's per-deployment network namespace: its own loopback is up,
whether `ip` brings it up or, where iproute2 is not installed, a bare interpreter."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from runyard.deployer.runtime import _make_namespaces, _release_namespaces, _Tools

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="namespaces need a root deployer"),
]

#: Listens and connects on 127.0.0.1: fails while the namespace's loopback is down.
PROBE = (
    "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen();"
    " socket.create_connection(s.getsockname(), timeout=2); print('up')"
)


@pytest.mark.parametrize("with_ip", [True, False], ids=["ip", "interpreter"])
def test_the_deployment_namespace_has_its_loopback_up(tmp_path: Path, with_ip: bool) -> None:
    tools = _Tools.find()
    if tools.missing():
        pytest.skip(f"{', '.join(tools.missing())} not installed")
    if with_ip and not tools.ip:
        pytest.skip("iproute2 is not installed")
    if not with_ip:
        tools = dataclasses.replace(tools, ip="")
    _make_namespaces(tmp_path, tools)
    try:
        inside = subprocess.run(
            [tools.nsenter, f"--net={tmp_path / 'netns'}", sys.executable, "-c", PROBE],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert inside.stdout.strip() == "up", inside.stderr
        host_net = Path("/proc/self/ns/net").readlink()
        kept = subprocess.run(
            [tools.nsenter, f"--net={tmp_path / 'netns'}", "readlink", "/proc/self/ns/net"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert kept.stdout.strip() != str(host_net), "a namespace of its own, not the host's"
    finally:
        _release_namespaces(tmp_path, tools)
    assert not os.path.ismount(tmp_path / "netns")
    assert not os.path.ismount(tmp_path / "ipcns")
