"""Free ports for listeners that bind later (runyard.stack.ports): below the kernel's
ephemeral range, so no bind to port 0 or outgoing connection can take one meanwhile."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from runyard.stack import ports
from runyard.stack.ports import free_port


def ephemeral_start() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_a_port_is_below_the_ephemeral_range_free_and_never_given_twice() -> None:
    given = [free_port() for _ in range(300)]
    assert len(set(given)) == len(given)
    assert all(ports.LOWEST <= port < ephemeral_start() for port in given)
    for port in given[:20]:  # each can be listened on
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
            sock.listen()


def test_kernel_picked_ports_never_meet_a_picked_one() -> None:
    """What made a listener fail with "address in use": a port found by binding port 0,
    then taken by another bind to port 0 before its listener bound it."""
    picked = {free_port() for _ in range(50)}
    held = []
    try:
        for _ in range(200):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            held.append(sock)
        assert not picked & {sock.getsockname()[1] for sock in held}
    finally:
        for sock in held:
            sock.close()


def test_a_port_held_now_is_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    busy_port, free = free_port(), free_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", busy_port))
        ports._given -= {busy_port, free}
        choices = iter([busy_port, busy_port, free])
        monkeypatch.setattr(ports._random, "choice", lambda _: next(choices))
        assert free_port() == free


def test_without_room_below_the_ephemeral_range_the_kernel_picks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ports, "_ephemeral_start", lambda: ports.LOWEST + 10)
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
    assert port >= ephemeral_start()
