"""`runyard projections`: how far every read model and consumer has read the log.

    runyard projections           position, the log's end, lag (events behind), last error
    runyard projections --json

It reads Postgres directly (`checkpoints`, `consumer_positions`, the event
log; `runyard.messaging.progress`) and the broker: the dead-letter topic for
the last error (the latest reason each consumer or the relay parked a message
with) and the topics' partition counts; `--no-broker` skips the broker. Like
`runyard tail`, it is for operators who hold the database's credentials, not
a gateway route."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Annotated, Any

import typer
from runyard.cli.deadletters import BootstrapOpt, JsonOut, kafka_settings
from runyard.cli.dsn import DsnOpt, stack_dsn
from runyard.cli.main import app, err, show_json, table
from runyard.cli.terminal import markup

_COLUMNS = ["reader", "kind", "position", "log end", "lag", "updated", "last error"]


@app.command()
def projections(
    broker: Annotated[
        bool,
        typer.Option(
            help="read the broker: each reader's last error (dead-letter topic) and the"
            " topics' partition counts (else the counts Runyard creates them with)"
        ),
    ] = True,
    as_json: JsonOut = False,
    bootstrap: BootstrapOpt = None,
    dsn: DsnOpt = None,
) -> None:
    """Every read model and consumer: its position, the log's end, its lag, last error.

    Lag is the number of events after its position (for a consumer, in the partitions
    of the topics it reads); 0 when it is caught up.
    """
    letters, counts = _from_broker(bootstrap) if broker else ([], {})
    progress = asyncio.run(_progress(stack_dsn(dsn), counts))
    last = {d.source: d.reason for d in letters}  # oldest first: the latest wins
    progress = [dataclasses.replace(p, last_error=last.get(p.name)) for p in progress]
    if as_json:
        show_json([p.as_json() for p in progress])
        return
    table("projections", _COLUMNS, [_row(p) for p in progress])


async def _progress(dsn: str, counts: dict[str, int]) -> list[Any]:
    import asyncpg
    from runyard.messaging.progress import read_progress

    conn = await asyncpg.connect(dsn)
    try:
        found: list[Any] = await read_progress(conn, counts)
        return found
    finally:
        await conn.close()


def _from_broker(bootstrap: str | None) -> tuple[list[Any], dict[str, int]]:
    """The dead letters and the partition counts; none when the broker is away."""
    from aiokafka.errors import KafkaError

    try:
        return asyncio.run(_read_broker(kafka_settings(bootstrap), timeout_s=30))
    except (KafkaError, OSError, TimeoutError) as exc:
        err.print(f"[yellow]no last errors:[/yellow] cannot read the broker: {markup(exc)}")
        return [], {}


async def _read_broker(kafka: Any, timeout_s: float) -> tuple[list[Any], dict[str, int]]:
    from runyard.messaging.deadletters import read_dead_letters
    from runyard.messaging.topics import partition_counts

    async with asyncio.timeout(timeout_s):
        counts = await partition_counts(kafka.bootstrap, **kafka.security.client_options())
        return await read_dead_letters(kafka), counts


def _row(p: Any) -> list[Any]:
    updated = p.updated_at.strftime("%Y-%m-%d %H:%M:%S") if p.updated_at else ""
    return [p.name, p.kind, p.position, p.log_end, p.lag, updated, p.last_error or ""]
