"""Free TCP ports for listeners that bind later (a platform's services on one host beside
others: tests, benchmarks, the Slurm test cluster).

A port found by binding port 0 comes from the kernel's ephemeral range
(net.ipv4.ip_local_port_range), the range it also hands to every other bind to port
0 and to every outgoing connection. Between the pick and the listener's own bind, any
of those may take it, and the listener then fails with "address in use". So
`free_port` picks at random below that range, where the kernel never hands out a
port by itself, and checks that nothing holds the port now. A port it has given
once is not given again by this process. Only another program picking fixed ports
the same way could still meet it, one pick in about 17,000.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: The lowest port picked: above the well-known and most registered service ports.
LOWEST = 15000
#: Ports picked per call before the kernel is asked instead (all of them busy).
TRIES = 64

_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_given: set[int] = set()
_random = random.SystemRandom()  # not the seeded module state that tests reset


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing holds now and the kernel does not hand out by
    itself (see the module docstring); a kernel-picked one when the range below the
    ephemeral ports is too small or full."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    below = range(LOWEST, _ephemeral_start())
    for _ in range(TRIES if len(below) >= 1000 else 0):
        port = _random.choice(below)
        if port not in _given and _bindable(family, host, port):
            _given.add(port)
            return port
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(family: socket.AddressFamily, host: str, port: int) -> bool:
    """Whether a listener could bind `port` now: no SO_REUSEADDR, so a port that a
    closing connection still holds (TIME_WAIT) counts as taken too."""
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
