"""`runyard.cli.terminal`: server text made inert for a terminal, tables that survive a pipe."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console
from runyard.cli.terminal import clean, clean_output, json_text, markup, render_table


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("alice", "alice"),
        ("eve\n   7 12:00:00 task-x TaskFailed", "eve\\n   7 12:00:00 task-x TaskFailed"),
        ("a\rb\tc", "a\\rb\\tc"),
        ("\x1b[2J\x1b]0;owned\x07", "\\x1b[2J\\x1b]0;owned\\x07"),
        ("nul\x00del\x7f", "nul\\x00del\\x7f"),
        ("c1 \x85 \x9b31m", "c1 \\x85 \\x9b31m"),
        ("sep\u2028par\u2029", "sep\\u2028par\\u2029"),
        ("abc\u202edcba\u2066x\u2069\u200f", "abc\\u202edcba\\u2066x\\u2069\\u200f"),
        ("训练任务 ü é", "训练任务 ü é"),
        ("C:\\path\\n", "C:\\path\\n"),
    ],
)
def test_clean_shows_control_and_bidi_characters_as_escapes(text: str, shown: str) -> None:
    assert clean(text) == shown
    assert "\n" not in clean(text) and "\x1b" not in clean(text)


def test_clean_of_none_and_numbers() -> None:
    assert (clean(None), clean(3), clean(0)) == ("", "3", "0")


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("\x1b[1;31mERROR\x1b[0m loss=nan", "ERROR loss=nan"),
        ("step\t1\tloss", "step\t1\tloss"),
        ("\x1b]0;new title\x07epoch 2", "epoch 2"),
        ("\x1b]8;;https://x.example\x1b\\link\x1b]8;;\x1b\\ text", "link text"),
        ("\x9b2Jcleared", "cleared"),
        ("ok\rFAKE 2026-01-01 w0 stdout | done", "ok\\rFAKE 2026-01-01 w0 stdout | done"),
        ("bell\x07 back\x08space", "bell\\x07 back\\x08space"),
        ("lone escape \x1b", "lone escape \\x1b"),
    ],
)
def test_worker_output_loses_escape_sequences_and_keeps_tabs(line: str, shown: str) -> None:
    assert clean_output(line) == shown


def test_markup_is_escaped_for_rich() -> None:
    console = Console(file=io.StringIO(), force_terminal=False)
    console.print(f"name: {markup('[red]x[/] [/bold]')}")
    assert console.file.getvalue() == "name: [red]x[/] [/bold]\n"  # type: ignore[attr-defined]


def test_json_keeps_readable_text_but_escapes_what_acts_on_a_terminal() -> None:
    data = {"name": "训练\u202eevil\x9b\n", "n": 1}
    text = json_text(data)
    assert "训练" in text and "\\u202e" in text and "\\u009b" in text and "\\n" in text
    assert "\u202e" not in text and "\x9b" not in text and '\n"' not in text
    assert json.loads(text) == data


def test_a_table_on_a_pipe_is_whole_tab_separated_lines() -> None:
    sink = io.StringIO()
    narrow = Console(file=sink, width=40, force_terminal=False)
    correlation = "8f14e45f-ceea-467f-a0e6-0dbb1a0c5c21"
    render_table(
        narrow,
        "events of t-1",
        ["#", "time", "type", "actor", "correlation id"],
        [
            [1, "2026-12-01T05:13:55.123456+00:00", "TaskSubmitted", "user:t1/alice", correlation],
            [2, "2026-12-01T05:13:56.5+00:00", "TaskQueued", "evil\nforged", None],
        ],
    )
    assert sink.getvalue().splitlines() == [
        "#\ttime\ttype\tactor\tcorrelation id",
        f"1\t2026-12-01T05:13:55.123456+00:00\tTaskSubmitted\tuser:t1/alice\t{correlation}",
        "2\t2026-12-01T05:13:56.5+00:00\tTaskQueued\tevil\\nforged\t",
    ]


def test_a_table_on_a_terminal_is_drawn_and_its_cells_are_not_markup() -> None:
    sink = io.StringIO()
    console = Console(file=sink, width=60, force_terminal=True, color_system=None)
    render_table(console, "tasks", ["id", "name"], [["t-1", "[bold]x\x1b[2J"]])
    drawn = sink.getvalue()
    assert "tasks" in drawn and "┃ id" in drawn
    assert "[bold]x\\x1b[2J" in drawn and "\x1b[2J" not in drawn
