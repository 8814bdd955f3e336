"""SRE replay: `runyard audit`, `runyard export-events`, `runyard import-events`.

    runyard audit --since 1h --type TaskRequeued,TaskRestartScheduled   what was restarted, why
    runyard audit --task ID --type TaskStopRequested                    who stopped task ID
    runyard audit --node N --type TaskPlaced --since 2026-12-01 --until 2026-12-02
    runyard audit --category pool --actor 'user:*'                      admin actions on pools
    runyard export-events --from 2026-12-01T00:00Z --to 2026-12-02T00:00Z -o incident.jsonl
    runyard import-events incident.jsonl --dsn postgresql://.../postmortem

`audit` asks the gateway (`GET /v1/audit/events`, roles sre and
platform_admin) and prints a table (tab-separated whole lines on a pipe) or,
with `--json`, one JSON object per event. It follows the cursor to the end
unless `--limit` is given. `export-events` and `import-events` work on the
event store directly (`--dsn`, else DATABASE_URL or the stack `runyard up`
started), as `runyard tail` does: they are for operators who hold the
database's credentials.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from runyard.cli.detail import detail
from runyard.cli.dsn import DsnOpt, stack_dsn
from runyard.cli.main import JsonOpt, TokenOpt, UrlOpt, app, call, err, more, show_json, table
from runyard.cli.terminal import markup
from runyard.cli.when import parse_when

#: Events per request to the gateway.
PAGE = 500
#: How often a long export or import reports progress on stderr.
PROGRESS_EVERY = 10_000


def _query(types: list[str], **values: str | int | None) -> dict[str, Any]:
    params: dict[str, Any] = {k: v for k, v in values.items() if v is not None}
    if types:
        params["type"] = ",".join(types)
    return params


@app.command("audit")
def audit(
    since: Annotated[
        str | None, typer.Option(help="from this time: 30m, 1h, 2d ago, or ISO 8601")
    ] = None,
    until: Annotated[str | None, typer.Option(help="before this time (same forms)")] = None,
    type_: Annotated[
        list[str] | None,
        typer.Option("--type", "-t", help="event type; repeat or comma-separate"),
    ] = None,
    category: Annotated[
        str | None, typer.Option(help="event category: task, pool, access, catalogue")
    ] = None,
    actor: Annotated[
        str | None,
        typer.Option(help="who caused it: user:TENANT/NAME, service:NAME; a final * is a prefix"),
    ] = None,
    tenant: Annotated[
        str | None, typer.Option(help="events of this tenant's tasks and tokens")
    ] = None,
    pool: Annotated[str | None, typer.Option(help="events of this pool and of its tasks")] = None,
    node: Annotated[str | None, typer.Option(help="events that name this node")] = None,
    task: Annotated[str | None, typer.Option(help="events of this task")] = None,
    limit: Annotated[
        int | None, typer.Option(help="one page of at most this many (1-1000); default: all")
    ] = None,
    cursor: Annotated[str | None, typer.Option(help="next_cursor of an earlier page")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Events of the whole log matching every filter given, oldest first (sre, platform_admin).

    Preempted and requeued in the last hour, and why:
    runyard audit --since 1h --type TaskPreempted,TaskRequeued

    Rescheduled or restarted in the last hour, and why:
    runyard audit --since 1h --type TaskRescheduleRequested,TaskRestartScheduled

    Who stopped task X: runyard audit --task X --type TaskStopRequested

    What node N ran on a day:
    runyard audit --node N --type TaskPlaced --since 2026-12-01 --until 2026-12-02

    Admin actions on pools: runyard audit --category pool --actor 'user:*'
    """
    types = [t for text in type_ or [] for t in text.split(",") if t]
    params = _query(
        types,
        since=parse_when(since),
        until=parse_when(until),
        category=category,
        actor=actor,
        tenant=tenant,
        pool=pool,
        node=node,
        task=task,
    )
    items, next_cursor = _fetch(url, token, params, limit, cursor)
    if as_json:
        show_json({"items": items, "next_cursor": next_cursor})
        return
    table(
        "audit",
        ["position", "time", "type", "stream", "actor", "detail"],
        [
            [
                i["position"],
                i["occurred_at"],
                i["type"],
                i["stream_id"],
                i["actor"],
                detail(i["data"]),
            ]
            for i in items
        ],
    )
    if next_cursor:
        more(next_cursor, "next page")


def _fetch(
    url: str | None,
    token: str | None,
    params: dict[str, Any],
    limit: int | None,
    cursor: str | None,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page (`limit`), or every page from `cursor` on."""
    items: list[dict[str, Any]] = []
    while True:
        page = call(
            url,
            token,
            "GET",
            "/v1/audit/events",
            params={**params, "limit": limit or PAGE, **({"cursor": cursor} if cursor else {})},
        )
        items += page["items"]
        cursor = page.get("next_cursor")
        if limit is not None or not cursor:
            return items, cursor


# --- export and import ------------------------------------------------------


@app.command("export-events")
def export_events(
    from_: Annotated[
        str | None, typer.Option("--from", help="from this time: 30m, 1h, 2d ago, or ISO 8601")
    ] = None,
    to: Annotated[str | None, typer.Option("--to", help="before this time (same forms)")] = None,
    task: Annotated[str | None, typer.Option(help="only this task's events")] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="file to write (default: stdout)")
    ] = None,
    dsn: DsnOpt = None,
) -> None:
    """Events as JSON lines for a post-mortem, creator-only values and secrets masked.

    Reads the event store directly. Progress goes to stderr every 10,000 events.

    runyard export-events --from 2026-12-01T08:00Z --to 2026-12-01T12:00Z -o incident.jsonl
    """
    from runyard.eventstore.audit import AuditFilter

    filters = AuditFilter(since=_time(parse_when(from_)), until=_time(parse_when(to)), task=task)
    if output is None:
        count = asyncio.run(_export(stack_dsn(dsn), filters, sys.stdout))
    else:
        partial = output.with_name(output.name + ".part")
        with partial.open("w") as sink:
            count = asyncio.run(_export(stack_dsn(dsn), filters, sink))
        partial.replace(output)
    err.print(f"exported {count} events" + (f" to {markup(output)}" if output else ""))


async def _export(dsn: str, filters: Any, sink: IO[str]) -> int:
    import asyncpg
    from runyard.eventstore.export import export_lines

    conn = await asyncpg.connect(dsn)
    count = 0
    try:
        async for line in export_lines(conn, filters):
            sink.write(json.dumps(line, ensure_ascii=False) + "\n")
            count += 1
            if count % PROGRESS_EVERY == 0:
                err.print(f"exported {count} events (position {line['position']})")
    finally:
        await conn.close()
    return count


@app.command("import-events")
def import_events(
    file: Annotated[Path, typer.Argument(help="JSON lines written by runyard export-events")],
    dsn: Annotated[str, typer.Option("--dsn", help="an EMPTY database to import into")],
) -> None:
    """Read exported events into an empty event store, for offline analysis.

    Refuses a database that already holds events; writes all or nothing.

    runyard import-events incident.jsonl --dsn postgresql://localhost/runyard_postmortem
    """
    from runyard.eventstore.errors import EventStoreError

    try:
        count = asyncio.run(_import(dsn, file))
    except EventStoreError as exc:
        err.print(f"[red]error[/red] {markup(exc.code)}: {markup(exc.message)}")
        if exc.hint:
            err.print(f"hint: {markup(exc.hint)}")
        raise typer.Exit(1) from exc
    except OSError as exc:
        err.print(f"[red]error:[/red] {markup(exc)}")
        raise typer.Exit(1) from exc
    err.print(f"imported {count} events from {markup(file)}")


async def _import(dsn: str, file: Path) -> int:
    import asyncpg
    from runyard.eventstore.export import import_lines, parse_lines

    def progress(done: int) -> None:
        if done % PROGRESS_EVERY == 0:
            err.print(f"imported {done} events")

    conn = await asyncpg.connect(dsn)
    try:
        with file.open() as lines:
            return await import_lines(conn, parse_lines(lines), progress)
    finally:
        await conn.close()


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None
