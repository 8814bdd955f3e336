"""The log service's own HTTP routes (the gateway authenticates a request, then
routes it here unchanged with the caller's token).

Every route authenticates the bearer token again (`runyard.api.security`) and
checks the task against the caller's tenant from the task's events
(`runyard.api.tasks.TaskStates.visible`: a task of another tenant is a 404, as no
task), then calls one `LogApi` function; its errors (`runyard.logs.errors`)
are answered by the edge every service's app has, as the usual
`{code, field, message, hint}`.

    GET  /v1/tasks/{id}/logs                   lines: filters, search, order, cursor
    GET  /v1/tasks/{id}/logs/follow            live tail: one page per line (NDJSON);
                                               a token revoked or expired meanwhile
                                               ends it with a last line `{error, status}`
    GET  /v1/tasks/{id}/logs/tails             each worker's tail of one attempt: sizes
    GET  /v1/tasks/{id}/logs/tails/{worker}    the last lines of one worker of one attempt
    GET  /v1/tasks/{id}/first-error            the earliest error line, its context, its layer
    POST /v1/tasks/{id}/logs/exports           start an export (same filters as /logs)
    GET  /v1/exports                           the caller's exports (the last 5)
    GET  /v1/exports/{export_id}               state and progress (lines done / total)
    GET  /v1/exports/{export_id}/file          the finished file

The internal routes, for the platform's own services, are not routed by the
gateway and take no user token:

    GET  /internal/v1/tasks/{id}/runs/{run}/first-error
                                               the first error of one run (the
                                               notification service's alert cards)
    POST /internal/v1/lines/missing            which numbered lines of some workers'
                                               streams are not stored (the deployer,
                                               before it removes a worker's output
                                               files and after a broker loss)

Both take the platform's service credential instead of a user token.

The follow stream and the tails are what the gateway's gRPC `FollowLogs` and
its support bundle read, through the same routes as every client.

(No `from __future__ import annotations` here: FastAPI must see the routes'
`caller_dependency(...)` when it reads the handlers' signatures.)
"""

import asyncio
import json
import os
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, fields, replace
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Header, Query
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from runyard.api.auth import Principal, authenticate_again
from runyard.api.errors import BadRequest, Unauthenticated
from runyard.api.responses import AnswerRoute, refusals
from runyard.api.security import Authenticator, caller_dependency
from runyard.api.tasks import TaskStates
from runyard.contracts import http as wire
from runyard.contracts.requests import LogExportRequest
from runyard.contracts.rpc import credential
from runyard.domain import TaskState, is_terminal
from runyard.errors import RunyardError
from runyard.eventstore import EventStore
from runyard.logs.exports import Exports
from runyard.logs.search import MAX_LIMIT, LogQuery, check_int32
from runyard.logs.slots import OpenFollows
from runyard.logs.store import LogStore, WorkerStream

#: How often a live tail (`follow`) looks for new lines.
FOLLOW_POLL_S = 0.5
#: How often a live tail looks its caller's token up again (as the gateway's watch):
#: revoked or expired meanwhile, the tail ends with the refusal.
FOLLOW_AUTH_EVERY_S = 5.0
#: Media type of the follow stream: one JSON page per line.
NDJSON = "application/x-ndjson"


def default_export_dir() -> Path:
    return Path(os.environ.get("RUNYARD_HOME", ".runyard")) / "exports"


@dataclass(frozen=True)
class LogFilter:
    """The filters and searches of /logs and exports, as the caller sent them;
    `query` checks them."""

    workers: tuple[int, ...] = ()
    run: int | None = None
    attempt: int | None = None
    since: datetime | None = None
    until: datetime | None = None
    words: str | None = None
    phrase: str | None = None
    regex: str | None = None
    ignore_case: bool = False

    def query(self, task_id: str, **extra: Any) -> LogQuery:
        """The store's query (a refused one raises `InvalidQuery`, a 400): the filters
        and searches under the same names, and `extra` (order, limit, cursor)."""
        given = {field.name: getattr(self, field.name) for field in fields(self)}
        return LogQuery(task_id, **given, **extra)


class LogApi:
    """The application functions behind the log routes: the caller's tenant checked
    first against the task's events (a task of another tenant is a 404), answers in
    the HTTP shapes."""

    def __init__(
        self,
        events: EventStore,
        store: LogStore,
        export_dir: Path,
        *,
        follow_poll_s: float = FOLLOW_POLL_S,
        follows: OpenFollows | None = None,
        follow_auth_every_s: float = FOLLOW_AUTH_EVERY_S,
    ) -> None:
        self.events = events
        #: The live tails open now, per tenant (`follow`).
        self.follows = follows or OpenFollows()
        self.tasks = TaskStates(events)
        self.store = store
        self.exports = Exports(store, export_dir)
        self.follow_poll_s = follow_poll_s
        self.follow_auth_every_s = follow_auth_every_s

    async def recover(self) -> None:
        """Mark failed the exports an earlier process left running (at start)."""
        await self.exports.recover()

    async def task(self, caller: Principal, task_id: str) -> TaskState:
        """The task as the caller sees it: 404 unless the caller may read it."""
        return await self.tasks.visible(caller, task_id)

    # --- the operations ------------------------------------------------------------

    async def search(
        self,
        caller: Principal,
        task_id: str,
        where: LogFilter,
        *,
        order: str = "oldest",
        limit: int = 200,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """One page of lines: `{lines, next_cursor, tail_cursor}`."""
        await self.task(caller, task_id)
        query = where.query(task_id, order=order, limit=limit, cursor=cursor, asker=caller.tenant)
        return (await self.store.page(query)).to_json()

    async def follow(
        self,
        caller: Principal,
        task_id: str,
        where: LogFilter,
        *,
        limit: int = 200,
        cursor: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Live tail, oldest first: the matching lines from `cursor` (the start by
        default) page by page, then new ones as they are stored, until the task
        has ended and the lines stored before its end are given. Each item is a
        page `{lines, next_cursor, tail_cursor}` (empty pages are not given);
        `tail_cursor` resumes the tail after it. The caller and the query are
        checked before the first item (a refusal is an error, not a stream); the
        caller's token is looked up again every `follow_auth_every_s` as it goes,
        and the tail ends with `Unauthenticated` once it was revoked or has expired
        (as the next request would be)."""
        await self.task(caller, task_id)
        query = where.query(
            task_id, order="oldest", limit=limit, cursor=cursor, asker=caller.tenant
        )
        close = self.follows.take(caller.tenant)
        try:
            first = await self.store.page(query)
        except BaseException:
            close()
            raise
        # Once streaming, each page waits its tenant's turn as long as it takes.
        pages = self._pages(caller, task_id, replace(query, patient=True), first, close)
        weakref.finalize(pages, close)  # a stream never started still counts closed
        return pages

    async def _pages(
        self, caller: Principal, task_id: str, query: LogQuery, page: Any, close: Callable[[], None]
    ) -> AsyncIterator[dict[str, Any]]:
        try:
            async for item in self._tail(caller, task_id, query, page):
                yield item
        finally:
            close()

    async def _tail(
        self, caller: Principal, task_id: str, query: LogQuery, page: Any
    ) -> AsyncIterator[dict[str, Any]]:
        checked = time.monotonic()
        while True:
            if page.lines:
                yield page.to_json()
            if time.monotonic() - checked >= self.follow_auth_every_s:
                await authenticate_again(self.store.pool, caller)  # revoked: it ends here
                checked = time.monotonic()
            if page.next_cursor is None:
                task = await self.task(caller, task_id)
                if is_terminal(task.status):
                    # the lines stored before the end was seen (workers' last words)
                    last = await self.store.page(query.after(page.tail_cursor))
                    while True:
                        if last.lines:
                            yield last.to_json()
                        if last.next_cursor is None:
                            return
                        last = await self.store.page(query.after(last.next_cursor))
                await asyncio.sleep(self.follow_poll_s)
            page = await self.store.page(query.after(page.tail_cursor))

    async def first_error(
        self, caller: Principal, task_id: str, run: int | None = None
    ) -> dict[str, Any]:
        """The earliest error line across workers, with context and its likely layer."""
        check_int32("run", run)
        task = await self.task(caller, task_id)
        found = await self.store.first_error(task_id, run, asker=caller.tenant)
        body: dict[str, Any] = {"task_id": task_id, "status": task.status}
        return {**body, "found": found is not None, **(found.to_json() if found else {})}

    async def tails(
        self, caller: Principal, task_id: str, run: int, attempt: int, lines: int, line_chars: int
    ) -> dict[str, Any]:
        """Each worker of one attempt: its lines in all, how many of the last `lines`
        there are, and their bytes (each line counted up to `line_chars`)."""
        await self.task(caller, task_id)
        rows = await self.store.pool.fetch(_TAIL_PLAN, task_id, run, attempt, lines, line_chars)
        workers = [
            {"worker": r["worker"], "total": r["total"], "shown": r["shown"], "size": r["size"]}
            for r in rows
        ]
        return {"task_id": task_id, "run": run, "attempt": attempt, "workers": workers}

    async def tail(
        self, caller: Principal, task_id: str, run: int, attempt: int, worker: int, lines: int
    ) -> dict[str, Any]:
        """The last `lines` lines of one worker of one attempt, oldest first."""
        await self.task(caller, task_id)
        rows = await self.store.pool.fetch(_TAIL, task_id, run, attempt, worker, lines)
        found = [
            {"at": r["at"].isoformat(), "stream": r["stream"], "line": r["line"]} for r in rows
        ]
        where = {"task_id": task_id, "run": run, "attempt": attempt, "worker": worker}
        return {**where, "lines": found}

    async def start_export(
        self, caller: Principal, task_id: str, where: LogFilter, fmt: str = "text"
    ) -> dict[str, Any]:
        """Start a background export: no filters = the last 30 days, else the matches."""
        await self.task(caller, task_id)
        query = where.query(task_id, asker=caller.tenant)
        return await self.exports.start(caller.tenant, caller.user, query, fmt)

    async def list_exports(self, caller: Principal) -> list[dict[str, Any]]:
        """The caller's exports, newest first (the last 5 are kept)."""
        await self.exports.recover()  # one whose process stopped since shows as failed
        return await self.exports.list(caller.tenant, caller.user)

    async def get_export(self, caller: Principal, export_id: str) -> dict[str, Any]:
        """An export's state and progress (lines done / total)."""
        await self.exports.recover()
        return await self.exports.get(caller.tenant, caller.user, export_id)

    async def export_file(self, caller: Principal, export_id: str) -> tuple[Path, str]:
        """The finished export's file and media type."""
        return await self.exports.file(caller.tenant, caller.user, export_id)

    async def close(self) -> None:
        await self.exports.close()


#: Per worker of one attempt: lines in all, those of the last `$4`, their bytes
#: (each line counted up to `$5` bytes).
_TAIL_PLAN = """
SELECT worker, count(*) AS total, count(*) FILTER (WHERE n <= $4) AS shown,
       coalesce(sum(least(octet_length(line), $5)) FILTER (WHERE n <= $4), 0) AS size
FROM (SELECT worker, line, row_number() OVER (PARTITION BY worker ORDER BY at DESC, id DESC) AS n
      FROM log_lines WHERE task_id = $1 AND run = $2 AND attempt = $3) numbered
GROUP BY worker ORDER BY worker
"""
#: The last `$5` lines of one worker of one attempt, oldest first.
_TAIL = """
SELECT at, stream, line
FROM (SELECT at, id, stream, line FROM log_lines
      WHERE task_id = $1 AND run = $2 AND attempt = $3 AND worker = $4
      ORDER BY at DESC, id DESC LIMIT $5) last
ORDER BY at, id
"""

ORDERS = ["oldest", "newest"]
Int32 = Annotated[int, Query(json_schema_extra={"minimum": 0, "maximum": 2**31 - 1})]
TailLines = Annotated[
    int, Query(description=f"1 to {MAX_LIMIT}", json_schema_extra={"minimum": 1, "maximum": 1000})
]
LineChars = Annotated[
    int,
    Query(
        description="bytes of a line counted, 1 to 1048576",
        json_schema_extra={"minimum": 1, "maximum": 1048576},
    ),
]


#: The most worker streams one `/internal/v1/lines/missing` call asks about.
MAX_MISSING_STREAMS = 256
_INT32 = 2**31 - 1


class StreamLines(BaseModel):
    """Lines [start, below) of one worker's stream, by their numbers (`seq`)."""

    model_config = ConfigDict(extra="forbid")
    task_id: str = Field(min_length=1, max_length=128)
    run: int = Field(ge=0, le=_INT32)
    attempt: int = Field(ge=0, le=_INT32)
    worker: int = Field(ge=0, le=_INT32)
    stream: Literal["stdout", "stderr"]
    start: int = Field(default=0, ge=0, le=2**62)
    below: int = Field(ge=0, le=2**62)


class MissingLinesAsk(BaseModel):
    model_config = ConfigDict(extra="forbid")
    streams: list[StreamLines] = Field(max_length=MAX_MISSING_STREAMS)


class MissingLines(BaseModel):
    """What is not stored of one asked stream: ranges [lo, hi) of numbers, in order."""

    missing: list[tuple[int, int]]
    #: More ranges were missing than an answer lists (`runyard.logs.store.MAX_MISSING_RANGES`).
    truncated: bool


class MissingLinesAnswer(BaseModel):
    streams: list[MissingLines]


def internal_router(store: LogStore, token: str) -> APIRouter:
    """The routes the platform's own services call with its service credential
    (`runyard.contracts.rpc.credential`); not in the OpenAPI document, not routed by
    the gateway. A caller without the credential gets a 401 before any query runs."""
    router = APIRouter(include_in_schema=False)

    def service_caller(
        given: Annotated[str | None, Header(alias=credential.METADATA_KEY)] = None,
    ) -> None:
        if not credential.matches(given, token):
            raise Unauthenticated(
                "auth.service_credential",
                "this route is for the platform's services",
                f"send the service credential in {credential.METADATA_KEY}",
            )

    @router.get(
        "/internal/v1/tasks/{task_id}/runs/{run}/first-error",
        dependencies=[Depends(service_caller)],
    )
    async def run_first_error(task_id: str, run: int) -> dict[str, Any]:
        """The earliest error line of one run, as `/v1/tasks/{id}/first-error` gives it."""
        check_int32("run", run)
        found = await store.first_error(task_id, run)
        body = {"task_id": task_id, "found": found is not None}
        return {**body, **(found.to_json() if found else {})}

    @router.post("/internal/v1/lines/missing", dependencies=[Depends(service_caller)])
    async def missing_lines(ask: MissingLinesAsk) -> MissingLinesAnswer:
        """For each stream, the numbers in [start, below) that no stored line has."""
        answers = []
        for s in ask.streams:
            where = WorkerStream(s.task_id, s.run, s.attempt, s.worker, s.stream)
            gaps, more = await store.missing(where, s.start, max(s.start, s.below))
            answers.append(MissingLines(missing=gaps, truncated=more))
        return MissingLinesAnswer(streams=answers)

    return router


def logs_router(api: LogApi, authenticator: Authenticator) -> APIRouter:
    """The log routes over `api`; callers authenticated by `authenticator`."""
    router = APIRouter(tags=["logs"], route_class=AnswerRoute)
    Caller = Annotated[Principal, caller_dependency(authenticator)]

    @router.get(
        "/v1/tasks/{task_id}/logs", response_model=wire.LogPage, responses=refusals(404, 429)
    )
    async def task_logs(
        caller: Caller,
        task_id: str,
        params: Annotated[LogParams, Depends()],
        order: Annotated[
            str, Query(description="oldest or newest", json_schema_extra={"enum": ORDERS})
        ] = "oldest",
        limit: Annotated[
            int,
            Query(
                description="page size, 1 to 1000",
                json_schema_extra={"minimum": 1, "maximum": 1000},
            ),
        ] = 200,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """Lines of the task in time order; pass `next_cursor` back for the next page."""
        return await api.search(
            caller, task_id, params.filter(), order=order, limit=limit, cursor=cursor
        )

    @router.get(
        "/v1/tasks/{task_id}/logs/follow",
        response_class=StreamingResponse,
        responses={
            **refusals(404, 429),
            200: {
                "content": {NDJSON: {"schema": {"type": "string"}}},
                "description": "one page of lines per line (each as GET /logs answers it);"
                " once the caller's token is revoked or has expired, a last line"
                " `{error, status}` (the refusal's body and its HTTP status)",
            },
        },
    )
    async def follow_logs(
        caller: Caller,
        task_id: str,
        params: Annotated[LogParams, Depends()],
        limit: Annotated[
            int,
            Query(
                description="page size, 1 to 1000",
                json_schema_extra={"minimum": 1, "maximum": 1000},
            ),
        ] = 200,
        cursor: str | None = None,
    ) -> StreamingResponse:
        """Live tail, oldest first: a page `{lines, next_cursor, tail_cursor}` per line
        as lines are stored, until the task has ended and its last lines are given."""
        pages = await api.follow(caller, task_id, params.filter(), limit=limit, cursor=cursor)
        return StreamingResponse(_ndjson(pages), media_type=NDJSON)

    @router.get(
        "/v1/tasks/{task_id}/logs/tails",
        response_model=wire.WorkerTails,
        responses=refusals(404),
    )
    async def tails(
        caller: Caller,
        task_id: str,
        run: Int32,
        attempt: Int32,
        lines: TailLines = 500,
        line_chars: LineChars = 4096,
    ) -> dict[str, Any]:
        """Each worker's tail of one attempt before it is read: lines in all, shown, bytes."""
        check_bounds(lines=(lines, 1, MAX_LIMIT), line_chars=(line_chars, 1, 1048576))
        check_int32("run", run)
        check_int32("attempt", attempt)
        return await api.tails(caller, task_id, run, attempt, lines, line_chars)

    @router.get(
        "/v1/tasks/{task_id}/logs/tails/{worker}",
        response_model=wire.WorkerTail,
        responses=refusals(404),
    )
    async def tail(
        caller: Caller,
        task_id: str,
        worker: int,
        run: Int32,
        attempt: Int32,
        lines: TailLines = 500,
    ) -> dict[str, Any]:
        """The last lines of one worker of one attempt, oldest first."""
        check_bounds(lines=(lines, 1, MAX_LIMIT))
        check_int32("run", run)
        check_int32("attempt", attempt)
        check_int32("worker", worker)
        return await api.tail(caller, task_id, run, attempt, worker, lines)

    @router.get(
        "/v1/tasks/{task_id}/first-error",
        response_model=wire.FirstError,
        responses=refusals(404, 429),
    )
    async def first_error(caller: Caller, task_id: str, run: int | None = None) -> dict[str, Any]:
        """The earliest error line across workers, with context and its likely layer."""
        return await api.first_error(caller, task_id, run)

    @router.post(
        "/v1/tasks/{task_id}/logs/exports",
        status_code=202,
        response_model=wire.LogExport,
        responses=refusals(404, 409, 429),
    )
    async def start_export(
        caller: Caller,
        task_id: str,
        params: Annotated[LogParams, Depends()],
        body: Annotated[LogExportRequest, Body(default_factory=LogExportRequest)],
    ) -> dict[str, Any]:
        """Start a background export: no filters = the last 30 days, else the matches."""
        return await api.start_export(caller, task_id, params.filter(), body.format)

    @router.get("/v1/exports", response_model=list[wire.LogExport], responses=refusals())
    async def list_exports(caller: Caller) -> list[dict[str, Any]]:
        """The caller's exports, newest first (the last 5 are kept)."""
        return await api.list_exports(caller)

    @router.get("/v1/exports/{export_id}", response_model=wire.LogExport, responses=refusals(404))
    async def get_export(caller: Caller, export_id: str) -> dict[str, Any]:
        """An export's state and progress."""
        return await api.get_export(caller, export_id)

    @router.get(
        "/v1/exports/{export_id}/file",
        response_class=FileResponse,
        responses={
            200: {
                "content": {
                    media: {"schema": {"type": "string", "format": "binary"}}
                    for media in ("text/plain", NDJSON)
                },
                "description": "the finished file: text lines, or one JSON record per line",
            }
        },
    )
    async def export_file(caller: Caller, export_id: str) -> FileResponse:
        """The finished export's file."""
        path, media = await api.export_file(caller, export_id)
        return FileResponse(path, media_type=media, filename=path.name)

    return router


async def _ndjson(pages: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    """The pages, a line each; a refusal once the stream has begun (the caller's token
    revoked or expired meanwhile) is its last line, `{"error": <the error body>,
    "status": <its HTTP status>}`."""
    try:
        async for page in pages:
            yield json.dumps(page) + "\n"
    except RunyardError as exc:
        yield json.dumps({"error": exc.to_dict(), "status": exc.http_status}) + "\n"


def check_bounds(**values: tuple[int, int, int]) -> None:
    """Refuse a number outside its published bounds with a 400 naming it."""
    for name, (value, low, high) in values.items():
        if not low <= value <= high:
            raise BadRequest(
                "request.invalid", f"{name} must be {low} to {high}", f"{name}: {low}..{high}", name
            )


class LogParams:
    """The filters and searches shared by /logs, the follow stream and exports."""

    def __init__(
        self,
        worker: Annotated[list[int] | None, Query(description="one or more workers")] = None,
        run: int | None = None,
        attempt: Annotated[
            int | None, Query(description="one attempt (of every run, unless run is given)")
        ] = None,
        since: Annotated[datetime | None, Query(description="ISO time, to the second")] = None,
        until: Annotated[datetime | None, Query(description="ISO time, inclusive")] = None,
        words: Annotated[
            str | None, Query(description="all these whole words, any order and case (32 at most)")
        ] = None,
        phrase: Annotated[str | None, Query(description="exact phrase (substring)")] = None,
        regex: Annotated[str | None, Query(description="POSIX regular expression")] = None,
        ignore_case: bool = False,
    ) -> None:
        self.worker = worker
        self.run = run
        self.attempt = attempt
        self.since = since
        self.until = until
        self.words = words
        self.phrase = phrase
        self.regex = regex
        self.ignore_case = ignore_case

    def filter(self) -> LogFilter:
        return LogFilter(
            workers=tuple(self.worker or ()),
            run=self.run,
            attempt=self.attempt,
            since=self.since,
            until=self.until,
            words=self.words,
            phrase=self.phrase,
            regex=self.regex,
            ignore_case=self.ignore_case,
        )
