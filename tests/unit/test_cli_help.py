"""`runyard --help` lists every command with a summary of one line."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from runyard.cli.main import app

#: Longest summary: the rich command list wraps longer ones onto a second line.
MAX_SUMMARY = 90


def commands(group: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every command under `group` (typer's click), by its full name."""
    for name, command in getattr(group, "commands", {}).items():
        yield prefix + name, command
        yield from commands(command, f"{prefix}{name} ")


def test_every_command_has_a_one_line_summary() -> None:
    found = dict(commands(typer.main.get_command(app)))
    assert {"submit", "logs", "whatif", "alerts add", "group create"} <= set(found)
    for name, command in found.items():
        text = inspect.cleandoc(command.short_help or command.help or "")
        summary = text.split("\n\n")[0]
        if command.hidden:  # a second name of a listed command (`tokens ls`)
            continue
        assert summary, f"runyard {name} has no help"
        # The command list prints the first paragraph with its line breaks.
        assert "\n" not in summary, f"runyard {name}: {summary!r}"
        assert len(summary) <= MAX_SUMMARY, f"runyard {name}: {len(summary)} characters"


def test_listing_commands_take_both_ls_and_list() -> None:
    found = dict(commands(typer.main.get_command(app)))
    for group in ("group", "alerts", "admin tokens"):
        first, second = (found[f"{group} {name}"].callback for name in ("ls", "list"))
        # Typer wraps each command's function: the same function under both names.
        assert first.__wrapped__ is second.__wrapped__, group


def test_group_create_help_says_how_to_name_a_group_and_add_to_it() -> None:
    """The file's group_id names the group; sent again, its items join that group."""
    from typer.testing import CliRunner

    shown = CliRunner().invoke(app, ["group", "create", "--help"], env={"COLUMNS": "200"})
    text = " ".join(shown.stdout.split())
    assert shown.exit_code == 0, shown.output
    assert "with the same group_id adds its tasks to that group, up to 1000 tasks" in text, text


def test_bracketed_text_of_a_help_is_printed() -> None:
    """Rich reads `[word]` in a help text as markup and drops it: `--set`'s help printed
    "true/false and  are read as YAML" (the `[lists]` gone). Every bracketed word of a
    command's or option's help is printed."""
    import re

    from typer.testing import CliRunner

    bracketed = re.compile(r"\[[a-z][^\]]*\]")
    for name, command in commands(typer.main.get_command(app)):
        texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
        wanted = [m for text in texts for m in bracketed.findall(text)]
        if not wanted:
            continue
        shown = CliRunner().invoke(app, [*name.split(), "--help"], env={"COLUMNS": "250"})
        printed = " ".join(shown.stdout.split())
        for words in wanted:
            assert " ".join(words.split()) in printed, (name, words)


@pytest.mark.parametrize(
    ("command", "example"),
    [
        ("stop", "runyard stop ID && runyard watch ID"),
        ("stop", "runyard group stop GROUP"),
        ("capacity", "runyard capacity dev-a100"),
    ],
)
def test_stop_and_capacity_help_show_examples(command: str, example: str) -> None:
    """As `runyard audit --help` and `runyard whatif --help`: what to type, whole."""
    from typer.testing import CliRunner

    shown = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert example in shown.stdout, shown.stdout
