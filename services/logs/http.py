"""The log endpoints of the gateway's HTTP API (an APIRouter the gateway includes).

Every endpoint calls one `LogApi` function (the gRPC service calls the same
ones): it first asks the gateway for the task as the caller (404 for a task
of another tenant), then calls the log store; log errors become the
gateway's `{code, field, message, hint}` answers.

    GET  /v1/tasks/{id}/logs            lines: filters, search, order, cursor
    GET  /v1/tasks/{id}/first-error     the earliest error line, its context, its layer
    POST /v1/tasks/{id}/logs/exports    start an export (same filters as /logs)
    GET  /v1/exports                    the caller's exports (the last 5)
    GET  /v1/exports/{export_id}        state and progress (lines done / total)
    GET  /v1/exports/{export_id}/file   the finished file
"""

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar
from weakref import WeakKeyDictionary

from fastapi import APIRouter, Body, Depends, Query
from fastapi.responses import FileResponse
from runyard.api.auth import Principal
from runyard.api.errors import BadRequest, GatewayError, NotFound
from runyard.api.security import caller_dependency
from runyard.domain import is_terminal
from runyard.gateway.app import Gateway
from runyard.gateway.schemas import request_body
from runyard.logs.errors import ExportNotFound, InvalidQuery, LogError
from runyard.logs.exports import Exports
from runyard.logs.search import LogQuery, check_int32
from runyard.logs.store import LogStore

T = TypeVar("T")
#: How often a live tail (`follow`) looks for new lines.
FOLLOW_POLL_S = 0.5


def default_export_dir() -> Path:
    return Path(os.environ.get("RUNYARD_HOME", ".runyard")) / "exports"


@dataclass(frozen=True)
class LogFilter:
    """The filters and searches of /logs and exports, as the caller sent them
    (HTTP query parameters or the gRPC `LogFilter`); `query` checks them."""

    workers: tuple[int, ...] = ()
    run: int | None = None
    since: datetime | None = None
    until: datetime | None = None
    words: str | None = None
    phrase: str | None = None
    regex: str | None = None
    ignore_case: bool = False

    def query(self, task_id: str, **extra: Any) -> LogQuery:
        """The store's query (a refused one raises the gateway's 400)."""
        return translated(
            lambda: LogQuery(
                task_id,
                workers=self.workers,
                run=self.run,
                since=self.since,
                until=self.until,
                words=self.words,
                phrase=self.phrase,
                regex=self.regex,
                ignore_case=self.ignore_case,
                **extra,
            )
        )


class LogApi:
    """The application functions behind the log endpoints of both APIs (HTTP here,
    gRPC in `runyard.gateway.grpc_server`): the caller's tenant checked first (a
    task of another tenant is a 404), log errors as gateway errors, answers in
    the HTTP shapes. One per gateway (`log_api_of`)."""

    def __init__(self, gateway: Gateway, export_dir: Path) -> None:
        self.gateway = gateway
        self.store = LogStore(gateway.db)
        self.exports = Exports(self.store, export_dir)
        self._ready = False
        self._lock = asyncio.Lock()

    async def ready(self) -> "LogApi":
        """Migrated, and the exports an earlier process left running marked failed."""
        if not self._ready:
            async with self._lock:
                if not self._ready:
                    await self.store.migrate()
                    await self.exports.recover()
                    self._ready = True
        return self

    async def task(self, caller: Principal, task_id: str) -> dict[str, Any]:
        """The task as the caller sees it: 404 unless it is in the caller's tenant."""
        await self.ready()
        return await self.gateway.get_task(caller, task_id)

    # --- the operations (HTTP and gRPC) -----------------------------------------

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
        query = where.query(task_id, order=order, limit=limit, cursor=cursor)
        return (await call(self.store.page(query))).to_json()

    async def follow(
        self,
        caller: Principal,
        task_id: str,
        where: LogFilter,
        *,
        limit: int = 200,
        cursor: str | None = None,
        poll_s: float = FOLLOW_POLL_S,
    ) -> AsyncIterator[dict[str, Any]]:
        """Live tail, oldest first: the matching lines from `cursor` (the start by
        default) page by page, then new ones as they are stored, until the task
        has ended and the lines stored before its end are given. Each item is a
        page `{lines, next_cursor, tail_cursor}` (empty pages are not given);
        `tail_cursor` resumes the tail after it."""
        await self.task(caller, task_id)
        query = where.query(task_id, order="oldest", limit=limit, cursor=cursor)
        page = await call(self.store.page(query))
        while True:
            if page.lines:
                yield page.to_json()
            if page.next_cursor is None:
                task = await self.gateway.get_task(caller, task_id)
                if is_terminal(task["status"]):
                    # the lines stored before the end was seen (workers' last words)
                    last = await call(self.store.page(query.after(page.tail_cursor)))
                    while True:
                        if last.lines:
                            yield last.to_json()
                        if last.next_cursor is None:
                            return
                        last = await call(self.store.page(query.after(last.next_cursor)))
                await asyncio.sleep(poll_s)
            page = await call(self.store.page(query.after(page.tail_cursor)))

    async def first_error(
        self, caller: Principal, task_id: str, run: int | None = None
    ) -> dict[str, Any]:
        """The earliest error line across workers, with context and its likely layer."""
        translated(lambda: check_int32("run", run))
        task = await self.task(caller, task_id)
        found = await self.store.first_error(task_id, run)
        body: dict[str, Any] = {"task_id": task_id, "status": task.get("status")}
        return {**body, "found": found is not None, **(found.to_json() if found else {})}

    async def start_export(
        self, caller: Principal, task_id: str, where: LogFilter, fmt: str = "text"
    ) -> dict[str, Any]:
        """Start a background export: no filters = the last 30 days, else the matches."""
        await self.task(caller, task_id)
        query = where.query(task_id)
        return await call(self.exports.start(caller.tenant, caller.user, query, fmt))

    async def list_exports(self, caller: Principal) -> list[dict[str, Any]]:
        """The caller's exports, newest first (the last 5 are kept)."""
        await self.ready()
        await self.exports.recover()  # one whose process stopped since shows as failed
        return await self.exports.list(caller.tenant, caller.user)

    async def get_export(self, caller: Principal, export_id: str) -> dict[str, Any]:
        """An export's state and progress (lines done / total)."""
        await self.ready()
        await self.exports.recover()
        return await call(self.exports.get(caller.tenant, caller.user, export_id))

    async def export_file(self, caller: Principal, export_id: str) -> tuple[Path, str]:
        """The finished export's file and media type."""
        await self.ready()
        return await call(self.exports.file(caller.tenant, caller.user, export_id))


_APIS: WeakKeyDictionary[Gateway, LogApi] = WeakKeyDictionary()


def logs_router(gateway: Gateway, export_dir: Path | None = None) -> APIRouter:
    """The log endpoints, over `gateway` (auth, task lookup, database)."""
    if export_dir is not None or gateway not in _APIS:
        _APIS[gateway] = LogApi(gateway, export_dir or default_export_dir())
    api = _APIS[gateway]
    router = APIRouter(tags=["logs"])

    Caller = Annotated[Principal, caller_dependency(gateway)]

    @router.get("/v1/tasks/{task_id}/logs")
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

    @router.get("/v1/tasks/{task_id}/first-error")
    async def first_error(caller: Caller, task_id: str, run: int | None = None) -> dict[str, Any]:
        """The earliest error line across workers, with context and its likely layer."""
        return await api.first_error(caller, task_id, run)

    @router.post(
        "/v1/tasks/{task_id}/logs/exports",
        status_code=202,
        openapi_extra=request_body("LogExport"),
    )
    async def start_export(
        caller: Caller,
        task_id: str,
        params: Annotated[LogParams, Depends()],
        body: Annotated[dict[str, Any], Body(default_factory=dict)],
    ) -> dict[str, Any]:
        """Start a background export: no filters = the last 30 days, else the matches."""
        fmt = str(body.get("format", "text"))
        return await api.start_export(caller, task_id, params.filter(), fmt)

    @router.get("/v1/exports")
    async def list_exports(caller: Caller) -> list[dict[str, Any]]:
        """The caller's exports, newest first (the last 5 are kept)."""
        return await api.list_exports(caller)

    @router.get("/v1/exports/{export_id}")
    async def get_export(caller: Caller, export_id: str) -> dict[str, Any]:
        """An export's state and progress."""
        return await api.get_export(caller, export_id)

    @router.get("/v1/exports/{export_id}/file", response_class=FileResponse)
    async def export_file(caller: Caller, export_id: str) -> FileResponse:
        """The finished export's file."""
        path, media = await api.export_file(caller, export_id)
        return FileResponse(path, media_type=media, filename=path.name)

    return router


ORDERS = ["oldest", "newest"]


def log_api_of(gateway: Gateway) -> LogApi:
    """The `LogApi` of `gateway` (made on first use): shared by the HTTP routes and
    the gRPC service, so exports started by either are one set."""
    api = _APIS.get(gateway)
    if api is None:
        api = _APIS[gateway] = LogApi(gateway, default_export_dir())
    return api


class LogParams:
    """The filters and searches shared by /logs and exports."""

    def __init__(
        self,
        worker: Annotated[list[int] | None, Query(description="one or more workers")] = None,
        run: int | None = None,
        since: Annotated[datetime | None, Query(description="ISO time, to the second")] = None,
        until: Annotated[datetime | None, Query(description="ISO time, inclusive")] = None,
        words: Annotated[str | None, Query(description="full-text: all these words")] = None,
        phrase: Annotated[str | None, Query(description="exact phrase (substring)")] = None,
        regex: Annotated[str | None, Query(description="POSIX regular expression")] = None,
        ignore_case: bool = False,
    ) -> None:
        self.worker = worker
        self.run = run
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
            since=self.since,
            until=self.until,
            words=self.words,
            phrase=self.phrase,
            regex=self.regex,
            ignore_case=self.ignore_case,
        )


def translated(build: Any) -> Any:
    """`build()`, a log error raised as the gateway's error."""
    try:
        return build()
    except LogError as exc:
        raise gateway_error(exc) from exc


async def call(awaitable: Awaitable[T]) -> T:
    """`await awaitable`, a log error raised as the gateway's error."""
    try:
        return await awaitable
    except LogError as exc:
        raise gateway_error(exc) from exc


def gateway_error(exc: LogError) -> GatewayError:
    """The gateway's error (HTTP status, gRPC code) for a refused log request."""
    if isinstance(exc, ExportNotFound):
        return NotFound(exc.code, exc.message, exc.hint, exc.field)
    if isinstance(exc, InvalidQuery):
        return BadRequest(exc.code, exc.message, exc.hint, exc.field)
    return BadRequest(exc.code, exc.message, exc.hint, exc.field)
