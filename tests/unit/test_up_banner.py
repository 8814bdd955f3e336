"""`runyard up`'s banner written into a pipe or a log file: every line whole."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from runyard.stack import up


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
    monkeypatch.setattr(up.console, "file", written)
    monkeypatch.setattr(up.console, "width", 40)  # narrower than any line below

    up._print_banner(stack, settings, {"relay": "pid 1  http://127.0.0.1:8101"})

    lines = written.getvalue().splitlines()
    assert f"  dev token  ry_{'x' * 43}  (also in {home / 'token'})" in lines
    assert "  postgres   postgresql://runyard_app:***@127.0.0.1:55432/runyard" in lines
    tools = "  services:  .venv/bin/runyard ps    event log:  .venv/bin/runyard tail"
    assert f"{tools}    stop: Ctrl-C" in lines
    assert "s3cret" not in written.getvalue()
