"""`runyard up`'s banner written into a pipe or a log file: every line whole."""

from __future__ import annotations

import io
import json
import os
import socket
import sys
import threading
from pathlib import Path

import pytest
from runyard.stack import up
from runyard.stack.embedded import EmbeddedPostgres, PortTaken
from runyard.stack.ports import free_port


def test_the_banner_keeps_each_line_whole_whatever_the_width(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = tmp_path / ("a-home-folder-with-a-long-name-" * 3) / ".runyard"
    stack = up.Stack(
        home=home,
        dsn="postgresql://runyard_app:s3cret@127.0.0.1:55432/runyard",
        bootstrap="127.0.0.1:59092",
    )
    settings: dict[str, object] = {
        "http_host": "127.0.0.1",
        "http_port": 8080,
        "grpc_host": "127.0.0.1",
        "grpc_port": 50051,
        "token": "ry_" + "x" * 43,
    }
    written = io.StringIO()
    monkeypatch.setattr(sys, "argv", [".venv/bin/runyard", "up"])  # as `make up` runs it
    monkeypatch.setattr(up.console, "file", written)
    monkeypatch.setattr(up.console, "width", 40)  # narrower than any line below

    up._print_banner(stack, settings, {"relay": "pid 1  http://127.0.0.1:8101"})

    lines = written.getvalue().splitlines()
    assert f"  dev token  ry_{'x' * 43}  (also in {home / 'token'})" in lines
    assert "  postgres   postgresql://runyard_app:***@127.0.0.1:55432/runyard" in lines
    tools = "  services:  .venv/bin/runyard ps    event log:  .venv/bin/runyard tail"
    assert f"{tools}    stop: Ctrl-C" in lines
    assert "s3cret" not in written.getvalue()


@pytest.mark.parametrize(
    ("argv0", "cli"),
    [
        ("/opt/runyard/.venv/bin/runyard", "/opt/runyard/.venv/bin/runyard"),
        ("runyard", "runyard"),
        ("/usr/lib/python3/runpy.py", "runyard"),  # `python -m ...`: the command's name
    ],
)
def test_the_banner_names_the_command_as_it_was_run(
    monkeypatch: pytest.MonkeyPatch, argv0: str, cli: str
) -> None:
    monkeypatch.setattr(sys, "argv", [argv0, "up"])
    assert up._cli() == cli


def test_up_refuses_to_start_without_its_config_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Started outside the checkout, `runyard up` used to come up with no pool and say
    nothing; it stops before anything starts and says where to run it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RUNYARD_CONFIG", raising=False)
    with pytest.raises(SystemExit) as stopped:
        up.main(home=str(tmp_path / ".runyard"))
    message = str(stopped.value)
    assert f"no config folder at infra/config, from {tmp_path}" in message
    assert "RUNYARD_CONFIG" in message and "Runyard checkout" in message
    assert not (tmp_path / ".runyard").exists()  # nothing was started or written

    monkeypatch.setenv("RUNYARD_CONFIG", str(tmp_path / "mine"))
    with pytest.raises(SystemExit, match=r"no config folder at .*/mine \(RUNYARD_CONFIG\)"):
        up.main(home=str(tmp_path / ".runyard"))
    os.mkdir(tmp_path / "mine")
    up.check_config(tmp_path / "mine")  # a folder is enough: its files are each optional


def test_up_refuses_ports_another_program_holds_naming_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second `runyard up` in another folder met the first's ports: Postgres failed
    to bind and the command ended in a traceback. The services' ports are checked
    before anything starts; each taken one is named, with how to move it."""
    monkeypatch.delenv("RUNYARD_ENDPOINTS", raising=False)
    with socket.socket() as held, socket.socket() as grpc:
        for sock in (held, grpc):
            sock.bind(("127.0.0.1", 0))
            sock.listen()
        relay = held.getsockname()[1]
        monkeypatch.setenv("RUNYARD_ENDPOINTS", json.dumps({"relay": f"http://127.0.0.1:{relay}"}))
        settings = {"http_host": "127.0.0.1", "http_port": free_port(), "grpc_host": "127.0.0.1"}
        with pytest.raises(SystemExit) as stopped:
            up.check_ports({**settings, "grpc_port": grpc.getsockname()[1]}, wait_s=0.3)
        message = str(stopped.value)
        assert f"relay 127.0.0.1:{relay}" in message
        assert f"gateway gRPC 127.0.0.1:{grpc.getsockname()[1]}" in message
        assert "RUNYARD_ENDPOINTS" in message and "--http-port" in message
        assert "gateway 127.0.0.1" not in message  # free: not named
    # An address that is not this machine's is not checked (nothing here can take it).
    endpoints = {name: f"http://127.0.0.1:{free_port()}" for name in up.DEFAULT_PORTS}
    endpoints |= {"relay": "http://192.0.2.1:8101", "logs": "http://no-such-host.invalid:8106"}
    endpoints["submission-grpc"] = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("RUNYARD_ENDPOINTS", json.dumps(endpoints))
    up.check_ports({**settings, "grpc_port": free_port()}, wait_s=0)  # no SystemExit
    for bad in ("{not json", "[1]"):
        monkeypatch.setenv("RUNYARD_ENDPOINTS", bad)
        with pytest.raises(SystemExit, match="RUNYARD_ENDPOINTS"):
            up.check_ports({**settings, "grpc_port": free_port()}, wait_s=0)


def test_the_embedded_postgres_refuses_a_port_another_program_holds(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        pg = EmbeddedPostgres(tmp_path / "pg", port=port)
        with pytest.raises(PortTaken, match=f"127.0.0.1:{port}: the embedded PostgreSQL cannot"):
            pg.start()
        assert pg.postmaster_pid() is None  # nothing left running


def test_a_port_let_go_of_meanwhile_is_no_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A service a crashed `runyard up` left may still be exiting when the next one
    starts: its port is looked at again until it is free."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    endpoints = {name: f"http://127.0.0.1:{free_port()}" for name in up.DEFAULT_PORTS}
    endpoints |= {
        "relay": f"http://127.0.0.1:{port}",
        "submission-grpc": f"127.0.0.1:{free_port()}",
    }
    monkeypatch.setenv("RUNYARD_ENDPOINTS", json.dumps(endpoints))
    settings = {"http_host": "127.0.0.1", "http_port": free_port(), "grpc_host": "127.0.0.1"}
    threading.Timer(0.3, held.close).start()
    up.check_ports({**settings, "grpc_port": free_port()}, wait_s=10)  # no SystemExit
