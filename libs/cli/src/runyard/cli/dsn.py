"""The event store the CLI's direct-read commands use (`--dsn`): shared by them and
importing nothing of the CLI, so any of them may be imported first."""

from __future__ import annotations

from typing import Annotated

import typer

DsnOpt = Annotated[
    str | None,
    typer.Option("--dsn", help="the event store (default DATABASE_URL, or `runyard up`'s)"),
]


def stack_dsn(dsn: str | None) -> str:
    """`dsn` when given, else the event store of DATABASE_URL or `runyard up`."""
    if dsn:
        return dsn
    from runyard.stack.up import stack_dsn as running_stack_dsn

    return running_stack_dsn()
