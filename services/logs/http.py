"""The log endpoints of the gateway's HTTP API (an APIRouter the gateway includes).

Every endpoint first asks the gateway for the task as the caller (404 for a
task of another tenant), then calls the log store; log errors become the
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
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from weakref import WeakKeyDictionary

from fastapi import APIRouter, Body, Depends, Header, Query
from fastapi.responses import FileResponse
from runyard.gateway.app import Gateway
from runyard.gateway.auth import Principal
from runyard.gateway.errors import BadRequest, NotFound
from runyard.logs.errors import ExportNotFound, InvalidQuery, LogError
from runyard.logs.exports import Exports
from runyard.logs.search import LogQuery, Order
from runyard.logs.store import LogStore


def default_export_dir() -> Path:
    return Path(os.environ.get("RUNYARD_HOME", ".runyard")) / "exports"


class LogApi:
    """The log store and exports over the gateway's database, migrated on first use."""

    def __init__(self, gateway: Gateway, export_dir: Path) -> None:
        self.gateway = gateway
        self.store = LogStore(gateway.db)
        self.exports = Exports(self.store, export_dir)
        self._ready = False
        self._lock = asyncio.Lock()

    async def ready(self) -> "LogApi":
        if not self._ready:
            async with self._lock:
                if not self._ready:
                    await self.store.migrate()
                    self._ready = True
        return self

    async def task(self, caller: Principal, task_id: str) -> dict[str, Any]:
        """The task as the caller sees it: 404 unless it is in the caller's tenant."""
        await self.ready()
        return await self.gateway.get_task(caller, task_id)


_APIS: WeakKeyDictionary[Gateway, LogApi] = WeakKeyDictionary()


def logs_router(gateway: Gateway, export_dir: Path | None = None) -> APIRouter:
    """The log endpoints, over `gateway` (auth, task lookup, database)."""
    api = LogApi(gateway, export_dir or default_export_dir())
    _APIS[gateway] = api
    router = APIRouter(tags=["logs"])

    async def principal(authorization: Annotated[str | None, Header()] = None) -> Principal:
        scheme, _, token = (authorization or "").partition(" ")
        return await gateway.authenticate(token.strip() if scheme.lower() == "bearer" else None)

    Caller = Annotated[Principal, Depends(principal)]

    def query_of(task_id: str, params: LogParams, **extra: Any) -> LogQuery:
        return _translated(
            lambda: LogQuery(
                task_id,
                workers=tuple(params.worker or ()),
                run=params.run,
                since=params.since,
                until=params.until,
                words=params.words,
                phrase=params.phrase,
                regex=params.regex,
                ignore_case=params.ignore_case,
                **extra,
            )
        )

    @router.get("/v1/tasks/{task_id}/logs")
    async def task_logs(
        caller: Caller,
        task_id: str,
        params: Annotated[LogParams, Depends()],
        order: Order = "oldest",
        limit: Annotated[int, Query(ge=1, le=1000)] = 200,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """Lines of the task in time order; pass `next_cursor` back for the next page."""
        await api.task(caller, task_id)
        query = query_of(task_id, params, order=order, limit=limit, cursor=cursor)
        return (await _call(api.store.page(query))).to_json()

    @router.get("/v1/tasks/{task_id}/first-error")
    async def first_error(caller: Caller, task_id: str, run: int | None = None) -> dict[str, Any]:
        """The earliest error line across workers, with context and its likely layer."""
        task = await api.task(caller, task_id)
        found = await api.store.first_error(task_id, run)
        body: dict[str, Any] = {"task_id": task_id, "status": task.get("status")}
        return {**body, "found": found is not None, **(found.to_json() if found else {})}

    @router.post("/v1/tasks/{task_id}/logs/exports", status_code=202)
    async def start_export(
        caller: Caller,
        task_id: str,
        params: Annotated[LogParams, Depends()],
        body: Annotated[dict[str, Any], Body(default_factory=dict)],
    ) -> dict[str, Any]:
        """Start a background export: no filters = the last 30 days, else the matches."""
        await api.task(caller, task_id)
        query = query_of(task_id, params)
        fmt = str(body.get("format", "text"))
        return await _call(api.exports.start(caller.tenant, caller.user, query, fmt))

    @router.get("/v1/exports")
    async def list_exports(caller: Caller) -> list[dict[str, Any]]:
        """The caller's exports, newest first (the last 5 are kept)."""
        await api.ready()
        return await api.exports.list(caller.tenant, caller.user)

    @router.get("/v1/exports/{export_id}")
    async def get_export(caller: Caller, export_id: str) -> dict[str, Any]:
        """An export's state and progress."""
        await api.ready()
        return await _call(api.exports.get(caller.tenant, caller.user, export_id))

    @router.get("/v1/exports/{export_id}/file", response_class=FileResponse)
    async def export_file(caller: Caller, export_id: str) -> FileResponse:
        """The finished export's file."""
        await api.ready()
        path, media = await _call(api.exports.file(caller.tenant, caller.user, export_id))
        return FileResponse(path, media_type=media, filename=path.name)

    return router


def log_api_of(gateway: Gateway) -> LogApi:
    """The `LogApi` behind the log routes made for `gateway` (to wait for exports)."""
    return _APIS[gateway]


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


def _translated(build: Any) -> Any:
    try:
        return build()
    except LogError as exc:
        raise _gateway_error(exc) from exc


async def _call(awaitable: Any) -> Any:
    try:
        return await awaitable
    except LogError as exc:
        raise _gateway_error(exc) from exc


def _gateway_error(exc: LogError) -> Exception:
    if isinstance(exc, ExportNotFound):
        return NotFound(exc.code, exc.message, exc.hint, exc.field)
    if isinstance(exc, InvalidQuery):
        return BadRequest(exc.code, exc.message, exc.hint, exc.field)
    return BadRequest(exc.code, exc.message, exc.hint, exc.field)
