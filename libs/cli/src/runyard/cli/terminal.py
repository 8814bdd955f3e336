"""Text from the server, made safe for a terminal, and tables that survive a pipe.

Names, ids, reasons, user names and descriptions come from other people (a
task's creator, a tenant's admin, a worker's output). Printed as they are, a
newline in a user name forges a whole line of `runyard events` or `runyard
tail`, and an escape sequence in a task name can move the cursor, retitle the
window or hide text. Everything the CLI prints that it did not write itself
goes through `clean` (or `clean_output` for a worker's own output lines):

- C0 and C1 control characters, DEL, and the Unicode line/paragraph
  separators are shown as escapes (`\\n`, `\\r`, `\\t`, `\\x1b`, `\\x85`,
  `\\u2028`), so one value stays on one line and sends no control sequence;
- bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069, U+200E,
  U+200F, U+061C) are shown as `\\uXXXX`, so text cannot be reordered on
  screen to read differently from what it is.

Backslashes are left as they are: the point is that nothing is hidden or
forged, not that every value round-trips.

`markup` also escapes rich markup (`[red]`), for values put into a string
that rich interprets. `render_table` prints a rich table on a terminal and
plain tab-separated lines, never cut or wrapped, when the output is a pipe
or a file (`runyard events ID | grep ...`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from typing import Any

from rich.console import Console
from rich.highlighter import JSONHighlighter
from rich.markup import escape as escape_markup
from rich.table import Table
from rich.text import Text

#: Characters that are bidirectional controls: they reorder what follows on screen.
_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
#: Every character `clean` escapes: C0 (tab and newline too), DEL, C1, line and
#: paragraph separators, bidirectional controls.
_UNSAFE = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029{_BIDI}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: Terminal escape sequences: CSI (`ESC [ ... final`), OSC/DCS/APC/PM/SOS strings
#: up to BEL or ST, and two-character escapes; also their 8-bit C1 forms.
_ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]"
)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def clean(value: object) -> str:
    """`value` as one line of inert text: control and bidi characters shown as escapes.

    None is the empty string (an absent column), anything else its `str`.
    """
    if value is None:
        return ""
    return _UNSAFE.sub(_escape, str(value))


def clean_output(line: str) -> str:
    """A worker's output line for a terminal: escape sequences removed, the rest `clean`.

    Colours and cursor moves of the user's own program are dropped (they would
    act on the reader's terminal); tabs are kept, as a program printed them.
    """
    return "\t".join(clean(part) for part in _ESCAPE_SEQUENCE.sub("", line).split("\t"))


def markup(value: object) -> str:
    """`clean(value)` with rich markup escaped, for f-strings printed with markup on."""
    return escape_markup(clean(value))


#: Columns of ids, by their header: never cut or folded on a terminal (the other
#: columns are narrowed instead), so an id can be selected and pasted whole.
ID_COLUMNS = frozenset({"id", "task", "group", "correlation id"})


def render_table(
    console: Console, title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]
) -> None:
    """A table: rich on a terminal; on a pipe or file, a header line and one line per row.

    The plain form separates columns with a tab and never cuts, folds or pads a
    value, so every row is one whole line for grep, cut or awk -F'\\t'. Every
    cell is `clean`ed (a cell cannot hold a tab or a newline) and never read as
    markup. On a terminal, the values of `ID_COLUMNS` stay whole on one line; the
    other columns fold to fit its width.
    """
    cells = [[clean(v) for v in row] for row in rows]
    if not console.is_terminal:  # written as is: rich would expand the tabs to spaces
        lines = ["\t".join(columns), *("\t".join(row) for row in cells)]
        console.file.write("".join(f"{line}\n" for line in lines))
        console.file.flush()
        return
    grid = Table(title=title)
    for at, column in enumerate(columns):
        if column in ID_COLUMNS:  # at its full width, on one line, whatever the terminal's
            longest = max((len(row[at]) for row in cells if at < len(row)), default=0)
            grid.add_column(column, no_wrap=True, overflow="ignore", min_width=longest)
        else:
            grid.add_column(column, overflow="fold")
    for row in cells:
        grid.add_row(*[Text(cell) for cell in row])
    console.print(grid)


#: What `print_json` escapes inside JSON strings (C0 is escaped by `json.dumps` itself).
_UNSAFE_IN_JSON = re.compile(f"[\\x7f-\\x9f\\u2028\\u2029{_BIDI}]")


def json_text(data: Any) -> str:
    """`data` as indented JSON, non-ASCII text kept readable, but no character that acts
    on a terminal: C1, DEL, separators and bidi controls become `\\uXXXX` (valid JSON)."""
    text = json.dumps(data, indent=2, ensure_ascii=False)
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


#: Whether the command running was given `--json` (set as the option is read, by
#: `remember_json`): its refusals are then JSON as well.
JSON_WANTED: ContextVar[bool] = ContextVar("runyard_cli_json", default=False)


def remember_json(value: bool) -> bool:
    """The `--json` option's callback: notes for the command whether JSON was asked."""
    JSON_WANTED.set(bool(value))
    return value


def print_json(console: Console, data: Any) -> None:
    """`data` as JSON (`json_text`), coloured on a terminal, never wrapped."""
    text = JSONHighlighter()(json_text(data))
    text.no_wrap = True
    text.overflow = None
    console.print(text, soft_wrap=True)
