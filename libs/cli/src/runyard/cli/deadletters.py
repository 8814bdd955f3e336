"""`runyard dead-letters`: what the relay and the consumers parked, and a retry.

    runyard dead-letters                      every dead-lettered message, oldest first
    runyard dead-letters --json               the same as a JSON list
    runyard dead-letters --retry EVENT_ID     publish that event to its topic again

It reads the broker and the event store directly (`--bootstrap`, else
KAFKA_BOOTSTRAP_SERVERS or the stack `runyard up` started; `--dsn`, else
DATABASE_URL or that stack), as `runyard tail` does: it is for operators who
hold their credentials, not a gateway route. The list is the dead-letter
topic itself, read from the beginning without a consumer group
(`runyard.messaging.deadletters`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Annotated, Any
from uuid import UUID

import typer
from runyard.cli.dsn import DsnOpt, stack_dsn
from runyard.cli.main import app, err, out, show_json, table
from runyard.cli.terminal import markup, remember_json

BootstrapOpt = Annotated[
    str | None,
    typer.Option(
        "--bootstrap", help="the broker (default KAFKA_BOOTSTRAP_SERVERS, or `runyard up`'s)"
    ),
]
JsonOut = Annotated[bool, typer.Option("--json", help="Print JSON.", callback=remember_json)]
_COLUMNS = ["parked", "by", "event", "stream", "version", "position", "type", "size", "reason"]


def kafka_settings(bootstrap: str | None, home: str = ".runyard") -> Any:
    """The broker: `--bootstrap`, KAFKA_BOOTSTRAP_SERVERS, else .runyard/env's."""
    from runyard.messaging import KafkaSettings

    settings = KafkaSettings.from_env()
    found = bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or _stack_bootstrap(home)
    return dataclasses.replace(settings, bootstrap=found) if found else settings


def _stack_bootstrap(home: str) -> str | None:
    from pathlib import Path

    env = Path(home) / "env"
    for line in env.read_text().splitlines() if env.exists() else ():
        key, _, value = line.partition("=")
        if key == "KAFKA_BOOTSTRAP_SERVERS":
            return value
    return None


@app.command("dead-letters")
def dead_letters(
    retry: Annotated[
        str | None, typer.Option("--retry", help="publish this event (id) to its topic again")
    ] = None,
    max_message_bytes: Annotated[
        int, typer.Option(help="largest message to send, as the relay's max_message_bytes")
    ] = 1024 * 1024,
    as_json: JsonOut = False,
    bootstrap: BootstrapOpt = None,
    dsn: DsnOpt = None,
) -> None:
    """Dead-lettered messages (relay and consumers), or `--retry` one event once fixed.

    Reads the dead-letter topic and the event store directly. A retry reads the event
    from the store by id and publishes it as the relay does; consumers that already
    handled it skip it (inbox), the others handle it once. Exit 1 when the broker still
    cannot take it, with the reason.

    runyard dead-letters --retry 0193c1de-...
    """
    kafka = kafka_settings(bootstrap)
    if retry is not None:
        _retry(retry, kafka, stack_dsn(dsn), max_message_bytes, as_json=as_json)
        return
    from runyard.messaging.deadletters import read_dead_letters

    letters = asyncio.run(read_dead_letters(kafka))
    if as_json:
        show_json([letter.as_json() for letter in letters])
        return
    table("dead letters", _COLUMNS, [_row(d) for d in letters])
    err.print(f"{len(letters)} dead-lettered message(s) on {markup(kafka.topics.dead_letter)}")


def _row(letter: Any) -> list[Any]:
    return [
        letter.parked_at.strftime("%Y-%m-%d %H:%M:%S"),
        letter.source,
        letter.event_id or "",
        letter.stream_id or "",
        "" if letter.stream_version is None else letter.stream_version,
        "" if letter.global_position is None else letter.global_position,
        letter.type or "",
        "" if letter.size is None else letter.size,
        letter.reason,
    ]


def _retry(event_id: str, kafka: Any, dsn: str, max_bytes: int, *, as_json: bool) -> None:
    from runyard.messaging.deadletters import RepublishFailed

    try:
        uuid = UUID(event_id)
    except ValueError as exc:
        err.print(f"[red]error:[/red] not an event id: {markup(event_id)}")
        raise typer.Exit(2) from exc
    try:
        sent = asyncio.run(_republish(uuid, kafka, dsn, max_bytes))
    except RepublishFailed as exc:
        err.print(f"[red]not published[/red] {markup(exc.event_id)}: {markup(exc.reason)}")
        raise typer.Exit(1) from exc
    if as_json:
        show_json(dataclasses.asdict(sent))
        return
    out.print(
        f"published {markup(sent.event_id)} ({markup(sent.type)} of {markup(sent.stream_id)},"
        f" position {sent.global_position}, {sent.size} bytes) to"
        f" {markup(sent.topic)}[{sent.partition}]@{sent.offset};"
        " consumers that already had it skip it",
        highlight=False,
    )


async def _republish(event_id: UUID, kafka: Any, dsn: str, max_bytes: int) -> Any:
    import asyncpg
    from runyard.messaging.deadletters import load_stored, republish

    conn = await asyncpg.connect(dsn)
    try:
        stored = await load_stored(conn, event_id)
    finally:
        await conn.close()
    return await republish(stored, kafka, max_message_bytes=max_bytes)
