"""The console's pages: thin handlers over the same `Gateway` methods as the API.

Every page authenticates the session's token with `Gateway.authenticate` and
reads through the gateway's own use cases (`list_tasks`, `get_task`,
`create_task`, `stop_task`, `rerun_task`), so tenants, masking and submission
rules are the API's and nothing is decided twice. Log lines and first errors
come from the log service through the gateway's `Owners` client, asked with
the signed-in user's own token (the log service authorises it again).

Changes are POSTs of a form carrying the session's CSRF token (or the
`X-CSRF-Token` header htmx sends); a POST without it, or with another, is a 403
before anything is done. Fragments (`.../rows`, `.../summary`, `.../lines`)
are what htmx polls to keep a page live without reloading it.

The further pages live in modules of their own (`task_pages`, `lint`,
`pools_page`, `sre`, `live`), each a `PAGES` tuple of functions of the
`Console`, routed by `console_router` as these are (signed in, refusals as
error pages).
"""

from __future__ import annotations

import asyncio
import functools
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from fastapi import APIRouter
from fastapi import Request as HttpRequest
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from runyard.api.auth import Principal
from runyard.api.errors import BadRequest, PermissionDenied, Unauthenticated, task_not_found
from runyard.api.inputs import parse_body
from runyard.contracts.envelope import utcnow
from runyard.contracts.requests import RerunChanges, TaskSubmission
from runyard.contracts.spec import Framework, ResourceType, TaskSpec
from runyard.domain import TERMINAL_STATUSES, TaskStatus, fold
from runyard.errors import RunyardError
from runyard.gateway.app import Gateway, Request
from runyard.gateway.console import display, reads
from runyard.gateway.console.sessions import COOKIE, Session, Sessions
from runyard.gateway.proxy import OwnerAnswer, Owners, caller_headers, owner_error
from runyard.gateway.views import event_view
from runyard.telemetry import current_trace_context

TEMPLATES = Path(__file__).parent / "templates"
PREFIX = "/console"
PAGE_SIZE = 50
EVENTS_PAGE = 50
LOG_PAGE = 200
STATUSES = get_args(TaskStatus)
SEARCH_MODES = ("words", "phrase", "regex")
EXPORT_FORMATS = ("text", "jsonl")
#: The submit form's fields: text as typed, numbers, and tags split at commas.
SUBMIT_TEXT = (
    "name",
    "description",
    "pool",
    "resource_type",
    "worker_spec",
    "framework",
    "image",
    "command",
    "env",
)
SUBMIT_NUMBERS = ("worker_count", "custom_gpus", "priority")

_templates = Environment(
    loader=FileSystemLoader(TEMPLATES),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_templates.globals.update(
    duration=display.duration, prefix=PREFIX, terminal=TERMINAL_STATUSES, statuses=STATUSES
)
_templates.filters["when"] = display.when


@dataclass(frozen=True, slots=True)
class SignedIn:
    """The signed-in caller of a console request and its session."""

    principal: Principal
    session: Session

    def request(self) -> Request:
        """The application's request: the caller, a new request id, the trace."""
        return Request(self.principal, str(uuid.uuid4()), current_trace_context())


class SignInNeeded(Exception):
    """No live session: the page answers with the sign-in page instead."""


class Console:
    """The pages over one gateway, its owners' client, and the sessions (shared by every
    gateway over the same database)."""

    def __init__(self, gateway: Gateway, owners: Owners, sessions: Sessions) -> None:
        self.gw = gateway
        self.owners = owners
        self.sessions = sessions
        #: Set when the gateway stops: live streams end at once (the server waits for them).
        self.closing = asyncio.Event()

    def close(self) -> None:
        """End the live streams (called when the gateway stops serving)."""
        self.closing.set()

    # --- sessions -------------------------------------------------------------

    async def signed_in(self, request: HttpRequest) -> SignedIn:
        """The caller of the session cookie, its token authenticated again now."""
        session = await self.sessions.get(request.cookies.get(COOKIE))
        if session is None:
            raise SignInNeeded
        try:
            principal = await self.gw.authenticate(session.token)
        except Unauthenticated:
            await self.sessions.close(session.session_id)  # revoked or expired meanwhile
            raise SignInNeeded from None
        return SignedIn(principal, session)

    async def form(self, request: HttpRequest, who: SignedIn | None) -> dict[str, str]:
        """The POSTed form, after the same-origin check and (signed in) the CSRF check."""
        _same_origin(request)
        form = await _read_form(request)
        if who is not None:
            sent = form.get("csrf") or request.headers.get("x-csrf-token")
            if not who.session.csrf_matches(sent):
                raise PermissionDenied(
                    "console.csrf",
                    "the form's CSRF token is missing or not this session's",
                    "reload the page and send the form again",
                    "csrf",
                )
        return form

    # --- pages ----------------------------------------------------------------

    async def sign_in(self, request: HttpRequest) -> Response:
        form = await self.form(request, None)
        token = form.get("token", "").strip()
        try:
            await self.gw.authenticate(token)
        except Unauthenticated as exc:
            return render(
                "sign_in.html", None, status=401, error=exc, next=_console_path(form.get("next"))
            )
        # never keep a session across sign-ins
        await self.sessions.close(request.cookies.get(COOKIE))
        session = await self.sessions.open(token)
        answer = RedirectResponse(return_to(form.get("next")), status_code=303)
        answer.set_cookie(
            COOKIE,
            session.session_id,
            max_age=int((session.expires_at - utcnow()).total_seconds()),
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return answer

    async def sign_out(self, request: HttpRequest, who: SignedIn) -> Response:
        await self.form(request, who)
        await self.sessions.close(who.session.session_id)
        answer = RedirectResponse(f"{PREFIX}/sign-in", status_code=303)
        answer.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return answer

    async def tasks(self, request: HttpRequest, who: SignedIn) -> Response:
        return await self._tasks(request, who, fragment=False)

    async def task_rows(self, request: HttpRequest, who: SignedIn) -> Response:
        return await self._tasks(request, who, fragment=True)

    async def _tasks(self, request: HttpRequest, who: SignedIn, *, fragment: bool) -> Response:
        query = list_query(request)
        if not fragment and (task_id := await self._task_of_id(who, query["values"]["q"])):
            # A task id pasted in the search box (from an alert, the CLI, a colleague)
            # opens the task, as its name would find it.
            return RedirectResponse(f"{PREFIX}/tasks/{quote(task_id, safe='')}", status_code=303)
        page = await self.gw.list_tasks(
            who.principal, query["filters"], PAGE_SIZE, query["cursor"] or None, query["tenant"]
        )
        now = utcnow()
        for row in page["items"]:
            row["age"] = display.age(row["created_at"], now)
        context: dict[str, Any] = {
            "page": page,
            "query": query,
            "rows_url": f"{PREFIX}/tasks/rows?{urlencode(query['params'])}",
            "next_url": _next_url(query["params"], page["next_cursor"]),
            # Only the newest page is live (server-sent events, polling as the fallback).
            "stream_url": None
            if query["cursor"]
            else f"{PREFIX}/tasks/stream?{urlencode(query['params'])}",
        }
        if fragment:
            return render("task_rows.html", who, **context)
        pools = [p["pool_id"] for p in await self.gw.pools(who.principal)]
        return render("tasks.html", who, pools=pools, **context)

    async def task(self, request: HttpRequest, who: SignedIn) -> Response:
        return await self._task(request.path_params["task_id"], who, fragment=False)

    async def task_summary(self, request: HttpRequest, who: SignedIn) -> Response:
        """The live part of the task page; 204 (htmx keeps what it shows) while the
        task's stream is still at the version shown, so a poll of a task with 20,000
        events reads two rows, not its history."""
        task_id = request.path_params["task_id"]
        shown = _int_param(request, "version")
        stream = await self.readable_stream(who, task_id)
        if shown and await self.gw.store.stream_version(stream) == shown:
            return Response(status_code=204)
        return await self._task(task_id, who, fragment=True)

    async def _task(self, task_id: str, who: SignedIn, *, fragment: bool) -> Response:
        task = await self.gw.get_task(who.principal, task_id)
        first_error = None
        if task["status"] in ("failed", "abnormal"):
            first_error = await self._first_error(who, task_id)
        chart = display.stage_chart(task["stages"], utcnow())
        context: dict[str, Any] = {"task": task, "chart": chart, "first_error": first_error}
        if fragment:
            return render("task_summary.html", who, **context)
        reruns = await reads.stream_events_of_types(
            self.gw.db, f"task-{task_id}", ("TaskRerunRequested",)
        )
        runs = display.runs(task["stages"], reruns, task["run"], task["status"])
        return render("task.html", who, runs=runs, **context)

    async def events(self, request: HttpRequest, who: SignedIn) -> Response:
        """A page of the task's events after version `after`, read as a page (a task
        with 20,000 events is never read whole for it)."""
        task_id = request.path_params["task_id"]
        after = _int_param(request, "after")
        stream = await self.readable_stream(who, task_id)
        recorded = await self.gw.store.read_stream(stream, after + 1, limit=EVENTS_PAGE + 1)
        items = [event_view(e, is_creator=False) for e in recorded[:EVENTS_PAGE]]
        more = len(recorded) > EVENTS_PAGE
        return render(
            "task_events.html",
            who,
            task_id=task_id,
            events=items,
            after=after,
            next_after=items[-1]["version"] if more else None,
        )

    async def _task_of_id(self, who: SignedIn, text: str) -> str | None:
        """`text` when it is the id of a task the caller may read, else None (another
        tenant's task is as unknown as none: the list's name search goes on)."""
        task_id = text.strip().lower()
        if not TASK_ID.fullmatch(task_id):
            return None
        try:
            await self.readable_stream(who, task_id)
        except RunyardError:
            return None
        return task_id

    async def readable_stream(self, who: SignedIn, task_id: str) -> str:
        """The task's stream id if the caller may read the task (its tenant, from the
        first event: `Principal.may_read_tenant`, as `Gateway.get_task` decides); a 404
        as for no task otherwise."""
        stream = f"task-{task_id}"
        first = await self.gw.store.read_stream(stream, 1, limit=1)
        if not first or not who.principal.may_read_tenant(fold(first, task_id=task_id).tenant):
            raise task_not_found(task_id)
        return stream

    async def stop(self, request: HttpRequest, who: SignedIn) -> Response:
        task_id = request.path_params["task_id"]
        await self.form(request, who)
        await self.gw.stop_task(who.request(), task_id)
        return RedirectResponse(f"{PREFIX}/tasks/{task_id}", status_code=303)

    async def rerun(self, request: HttpRequest, who: SignedIn) -> Response:
        task_id = request.path_params["task_id"]
        await self.form(request, who)
        await self.gw.rerun_task(who.request(), task_id, RerunChanges())
        return RedirectResponse(f"{PREFIX}/tasks/{task_id}", status_code=303)

    async def logs(self, request: HttpRequest, who: SignedIn) -> Response:
        task_id = request.path_params["task_id"]
        task = await self.gw.get_task(who.principal, task_id)
        search = _log_search(request)
        lines_url = f"{PREFIX}/tasks/{task_id}/logs/lines?{urlencode(search['params'])}"
        return render("logs.html", who, task=task, search=search, lines_url=lines_url)

    async def log_lines(self, request: HttpRequest, who: SignedIn) -> Response:
        """A page of matching lines, then (following) a marker that polls for the next."""
        task_id = request.path_params["task_id"]
        search = _log_search(request)
        cursor = request.query_params.get("cursor") or None
        params = {**search["api"], "limit": LOG_PAGE, **({"cursor": cursor} if cursor else {})}
        try:
            page = await self._log_service(who, task_id, "logs", params)
        except BadRequest as exc:
            return render("error_box.html", who, error=exc)
        except RunyardError as exc:
            if exc.code != "logs.busy":
                raise
            return log_busy(request, who, exc, follow=search["follow"])
        pattern = display.search_pattern(search["mode"], search["q"], search["ignore_case"])
        lines = [{**line, "html": display.marked(line["line"], pattern)} for line in page["lines"]]
        resume = page["next_cursor"] or page["tail_cursor"] or cursor
        query = {**search["params"], **({"cursor": resume} if resume else {})}
        return render(
            "log_lines.html",
            who,
            lines=lines,
            follow=search["follow"],
            more=bool(page["next_cursor"]),
            more_url=f"{PREFIX}/tasks/{task_id}/logs/lines?{urlencode(query)}",
            first=cursor is None,
        )

    async def start_export(self, request: HttpRequest, who: SignedIn) -> Response:
        """Export the lines the log page's search shows (all lines: the last 30 days)."""
        task_id = request.path_params["task_id"]
        form = await self.form(request, who)
        search = _log_search_of(form)
        fmt = form.get("format") if form.get("format") in EXPORT_FORMATS else "text"
        record = await self.owners.call(
            "logs",
            "POST",
            f"/v1/tasks/{quote(task_id, safe='')}/logs/exports",
            token=who.session.token,
            params=search["api"],
            body={"format": fmt},
        )
        return RedirectResponse(f"{PREFIX}/exports/{record['export_id']}", status_code=303)

    async def export(self, request: HttpRequest, who: SignedIn) -> Response:
        """An export's progress (the part polls itself while it runs), then its link."""
        export_id = quote(request.path_params["export_id"], safe="")
        record = await self.owners.call(
            "logs", "GET", f"/v1/exports/{export_id}", token=who.session.token
        )
        name = "export_state.html" if request.headers.get("hx-request") else "export.html"
        return render(name, who, export=record)

    async def export_file(self, request: HttpRequest, who: SignedIn) -> Response:
        """The finished export's file, streamed from the log service as it comes."""
        export_id = quote(request.path_params["export_id"], safe="")
        answer = await self.owners.send(
            "logs",
            "GET",
            f"/v1/exports/{export_id}/file",
            headers=caller_headers(who.session.token),
            stream=True,
        )
        if answer.status_code >= 400:
            try:
                raise owner_error(answer.status_code, await answer.aread())
            finally:
                await answer.aclose()
        file: Response = OwnerAnswer(answer, "logs")
        return file

    async def submit_form(self, request: HttpRequest, who: SignedIn) -> Response:
        """The submit form; `?clone=ID`: prefilled from that task's spec as the caller
        sees it, creator-only values left out (they are asked for again)."""
        clone_of = request.query_params.get("clone")
        if not clone_of:
            return await self._submit_page(who, {}, None, 200)
        task = await self.gw.get_task(who.principal, clone_of)
        form, hidden = _form_of(task["spec"])
        return await self._submit_page(who, form, None, 200, clone=task, hidden=hidden)

    async def submit(self, request: HttpRequest, who: SignedIn) -> Response:
        form = await self.form(request, who)
        try:
            spec = parse_body(TaskSubmission, _spec_of(form))
            created = await self.gw.create_task(who.request(), spec)
        except RunyardError as exc:
            return await self._submit_page(who, form, exc, exc.http_status)
        return RedirectResponse(f"{PREFIX}/tasks/{created['task_id']}", status_code=303)

    async def _submit_page(
        self,
        who: SignedIn,
        form: Mapping[str, str],
        error: RunyardError | None,
        status: int,
        **extra: Any,
    ) -> Response:
        pools = await self.gw.pools(who.principal)
        catalogue = await self.gw.catalogue_view(who.principal)
        images = [i["name"] for i in catalogue.get("images", [])]
        return render(
            "submit.html",
            who,
            status=status,
            form=_with_pool_chosen(form, pools),
            error=error,
            pools=pools,
            images=images,
            frameworks=get_args(Framework),
            resource_types=get_args(ResourceType),
            **extra,
        )

    async def _first_error(self, who: SignedIn, task_id: str) -> dict[str, Any] | None:
        """The first error line of the task's last run (None while the log service
        cannot answer: the page still shows the task)."""
        try:
            found = await self._log_service(who, task_id, "first-error")
        except RunyardError:
            return None
        return found if isinstance(found, dict) and found.get("found") else None

    async def _log_service(
        self, who: SignedIn, task_id: str, route: str, params: Mapping[str, Any] | None = None
    ) -> Any:
        """The log service's answer to `GET /v1/tasks/{task_id}/{route}`, asked with the
        signed-in user's own token (the log service checks the tenant again)."""
        path = f"/v1/tasks/{quote(task_id, safe='')}/{route}"
        return await self.owners.call("logs", "GET", path, token=who.session.token, params=params)


def template(name: str, **context: Any) -> str:
    """A template (a fragment) as text, with no user: for what is not an HTML answer."""
    return _templates.get_template(name).render(who=None, csrf="", **context)


def render(name: str, who: SignedIn | None, *, status: int = 200, **context: Any) -> HTMLResponse:
    """A template as an HTML answer; `who` gives the page its user and CSRF token."""
    html = _templates.get_template(name).render(
        who=who.principal if who else None, csrf=who.session.csrf if who else "", **context
    )
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})


#: Seconds to wait when the log service said busy without a Retry-After.
LOG_BUSY_WAIT_S = 2


def log_busy(
    request: HttpRequest, who: SignedIn, exc: RunyardError, *, follow: bool
) -> HTMLResponse:
    """The log service refused a search for now (429 `logs.busy`: the searches that may
    run at once are running): a message in the log box, the page kept, and the same
    page of lines asked again, by a button (followed: by itself, once the wait is over)."""
    return render(
        "log_busy.html",
        who,
        seconds=exc.retry_after_s or LOG_BUSY_WAIT_S,
        whose="your tenant" if exc.message.startswith("your tenant's") else "all tenants",
        retry_url=request.url.path + (f"?{request.url.query}" if request.url.query else ""),
        follow=follow,
    )


def error_page(exc: RunyardError, who: SignedIn | None) -> HTMLResponse:
    """A refusal as a page with its status, code, message and hint (and its Retry-After,
    as the API answers it)."""
    page = render("error.html", who, status=exc.http_status, error=exc)
    page.headers.update(exc.headers)
    return page


def sign_in_url(request: HttpRequest) -> str:
    """The sign-in page, naming the page asked for (a link from an alert card, a bookmark)
    to go on to once signed in; the task list, where sign-in goes anyway, is not named."""
    return _sign_in_for(request.url.path + (f"?{request.url.query}" if request.url.query else ""))


def _sign_in_for(asked: str) -> str:
    if asked == f"{PREFIX}/tasks" or _console_path(asked) is None:
        return f"{PREFIX}/sign-in"
    return f"{PREFIX}/sign-in?{urlencode({'next': asked})}"


def _console_path(value: str | None) -> str | None:
    """`value` if it is a path of this console (`/console/...`, no host, no scheme): the
    only place sign-in goes on to, so a crafted link cannot send anyone elsewhere."""
    if not value or len(value) > 2000 or "\\" in value or any(ord(c) < 32 for c in value):
        return None
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or not parts.path.startswith(PREFIX + "/"):
        return None
    return value


def return_to(value: str | None) -> str:
    """Where sign-in goes on to: the page asked for, or the task list."""
    return _console_path(value) or f"{PREFIX}/tasks"


def _same_origin(request: HttpRequest) -> None:
    """A form POSTed from another site is refused, signed in or not (sign-in included)."""
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
        raise PermissionDenied(
            "console.cross_origin",
            f"a form from {origin!r} may not change anything here",
            "use the console at its own address",
            "origin",
        )


async def _read_form(request: HttpRequest) -> dict[str, str]:
    """An `application/x-www-form-urlencoded` body (the only kind the console sends)."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return dict(parse_qsl(body, keep_blank_values=True))


def list_query(request: HttpRequest) -> dict[str, Any]:
    """The task list's filters from the page's address; a status that is none (a link
    typed by hand) is refused as the API refuses it, not shown as an empty list."""
    q = request.query_params
    status = q.get("status")
    if status and status not in STATUSES:
        raise BadRequest(
            "request.invalid",
            f"status: {status!r} is not a task status",
            f"choose one of {', '.join(STATUSES)}, or none for every task",
            "status",
        )
    text = q.get("q") or None
    # The start or the end of a task id finds its task too (the list's short id is
    # its last 8 characters: the start of a time-ordered id is the same for every
    # task of the same minute); the list is the tenant's, so another tenant's task
    # is never found.
    by_id = text is not None and SHORT_ID.fullmatch(text.strip()) is not None
    filters = {
        "status": q.get("status") or None,
        "pool": q.get("pool") or None,
        "tag": q.get("tag") or None,
        "name": None if by_id else text,
        "name_or_id": text.strip().lower() if text and by_id else None,
    }
    params = {k: q[k] for k in ("status", "pool", "tag", "q", "tenant", "cursor") if q.get(k)}
    return {
        "filters": filters,
        "params": params,
        "cursor": q.get("cursor"),
        "tenant": q.get("tenant") or None,
        "values": {k: q.get(k, "") for k in ("status", "pool", "tag", "q", "tenant")},
    }


def _next_url(params: Mapping[str, str], cursor: str | None) -> str | None:
    if cursor is None:
        return None
    return f"{PREFIX}/tasks?{urlencode({**params, 'cursor': cursor})}"


def utc_time(value: str) -> str:
    """A time from the log page's fields as the log API takes it: a browser's
    `datetime-local` value (`2026-12-01T10:00`, no zone) is read as UTC; one with a
    zone is left as it is (the log API refuses what is not a time, with its hint)."""
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}", value):
        return f"{value}:00Z"
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?", value):
        return f"{value}Z"
    return value


def _log_search(request: HttpRequest) -> dict[str, Any]:
    """The log page's query: worker, run, attempt, search text and mode, case, follow;
    and the same as the log API's parameters."""
    return _log_search_of(request.query_params)


def _log_search_of(q: Mapping[str, str]) -> dict[str, Any]:
    mode = q.get("mode") or "words"
    if mode not in SEARCH_MODES:
        mode = "words"
    text = q.get("q", "")
    worker, run, attempt = (q.get(name, "") for name in ("worker", "run", "attempt"))
    ignore_case = q.get("ignore_case") == "1"
    api: dict[str, Any] = {}
    for name, value in (("worker", worker), ("run", run), ("attempt", attempt)):
        if value.strip():
            api[name] = value.strip()  # the log API refuses a non-number, naming it
    if text.strip():
        api[mode] = text
        if ignore_case and mode != "words":
            api["ignore_case"] = "true"
    params = {"worker": worker, "q": text, "mode": mode}
    params |= {name: value for name, value in (("run", run), ("attempt", attempt)) if value}
    if ignore_case:
        params["ignore_case"] = "1"
    since, until = (q.get(name, "").strip() for name in ("since", "until"))
    for name, value in (("since", since), ("until", until)):
        if value:
            params[name] = value
            api[name] = utc_time(value)
    if q.get("follow") == "1":
        params["follow"] = "1"
    return {
        "mode": mode,
        "q": text,
        "since": since,
        "until": until,
        "worker": worker,
        "run": run,
        "attempt": attempt,
        "ignore_case": ignore_case,
        "follow": q.get("follow") == "1",
        "api": api,
        "params": params,
    }


def _spec_of(form: Mapping[str, str]) -> dict[str, Any]:
    """The spec a submit form describes; empty fields are left out (the rules' defaults
    apply), a number that is not one is sent as typed (the rules refuse it, with a hint)."""
    spec: dict[str, Any] = {k: form[k] for k in SUBMIT_TEXT if form.get(k, "").strip()}
    for key in SUBMIT_NUMBERS:
        value = form.get(key, "").strip()
        if value:
            number = typed_int(value)
            spec[key] = value if number is None else number
    for key in ("tags", "creator_only"):
        items = [t.strip() for t in form.get(key, "").split(",") if t.strip()]
        if items:
            spec[key] = items
    return spec


def _with_pool_chosen(form: Mapping[str, str], pools: list[dict[str, Any]]) -> Mapping[str, str]:
    """`form`, or a new one (no pool chosen) with a pool and a resource type that agree:
    the first pool of the spec's default resource type, else the first pool, and that
    pool's type; so the form as it opens is never refused `pool.resource_type_mismatch`."""
    if form.get("pool") or not pools:
        return form
    default = TaskSpec.model_fields["resource_type"].default
    pool = next((p for p in pools if p["resource_type"] == default), pools[0])
    chosen = {"pool": pool["pool_id"], "resource_type": pool["resource_type"]}
    return {**form, **chosen}


def _form_of(spec: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The submit form's fields of a spec (the clone's form), and the names of its
    creator-only variables, whose values are not put in the form."""
    form = {k: "" if spec.get(k) is None else str(spec[k]) for k in (*SUBMIT_TEXT, *SUBMIT_NUMBERS)}
    form["env"], hidden = display.env_text(spec.get("env") or [])
    form["tags"] = ", ".join(spec.get("tags") or [])
    return form, hidden


#: A task id (the platform's UUIDs) typed in the task list's search box.
TASK_ID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")

#: The start of a task id typed in the search box: at least 6 hex digits (the list
#: shows 8), up to the whole id.
SHORT_ID = re.compile(r"[0-9a-fA-F]{6}[0-9a-fA-F-]{0,30}")

#: A position or version past any the database holds (a bigint), with room for a +1.
MAX_POSITION = 2**62


def whole_number(text: str) -> int | None:
    """A page address's position, version or count: None unless ASCII digits, and at
    most `MAX_POSITION` (a longer number typed by hand reads as the end of the log)."""
    if not re.fullmatch(r"[0-9]+", text):
        return None
    return MAX_POSITION if len(text) > 19 else min(int(text), MAX_POSITION)


def typed_int(text: str) -> int | None:
    """A form's number as an int: None unless an optional minus and ASCII digits, at
    most 18 of them (what is not one is sent as typed: the rules name what is wrong)."""
    return int(text) if re.fullmatch(r"-?[0-9]{1,18}", text) else None


def _int_param(request: HttpRequest, name: str) -> int:
    """A query parameter that is a version (0 when absent or not a whole number)."""
    value = whole_number(request.query_params.get(name, ""))
    return 0 if value is None else value


Handler = Callable[[HttpRequest, SignedIn], Awaitable[Response]]
#: A page of another console module: a function of the console, the request, the caller.
Page = Callable[[Console, HttpRequest, SignedIn], Awaitable[Response]]
#: The signed-in pages: method, path under PREFIX, and the `Console` method answering.
PAGES = (
    ("POST", "/sign-out", "sign_out"),
    ("GET", "/tasks", "tasks"),
    ("GET", "/tasks/rows", "task_rows"),
    ("GET", "/submit", "submit_form"),
    ("POST", "/submit", "submit"),
    ("GET", "/tasks/{task_id}", "task"),
    ("GET", "/tasks/{task_id}/summary", "task_summary"),
    ("GET", "/tasks/{task_id}/events", "events"),
    ("POST", "/tasks/{task_id}/stop", "stop"),
    ("POST", "/tasks/{task_id}/rerun", "rerun"),
    ("GET", "/tasks/{task_id}/logs", "logs"),
    ("GET", "/tasks/{task_id}/logs/lines", "log_lines"),
    ("POST", "/tasks/{task_id}/logs/export", "start_export"),
    ("GET", "/exports/{export_id}", "export"),
    ("GET", "/exports/{export_id}/file", "export_file"),
)


def console_router(console: Console, more: Iterable[tuple[str, str, Page]] = ()) -> APIRouter:
    """The console's routes (kept out of the OpenAPI document: they answer HTML);
    `more`: the pages of the other console modules (method, path, page), routed
    before these (`/tasks/stream` before `/tasks/{task_id}`)."""
    router = APIRouter(include_in_schema=False)
    for method, path, page in more:
        router.add_api_route(
            PREFIX + path,
            signed_in_page(console, functools.partial(page, console)),
            methods=[method],
        )

    @router.get("/")
    @router.get(PREFIX)
    @router.get(PREFIX + "/")
    async def home() -> Response:
        return RedirectResponse(f"{PREFIX}/tasks", status_code=303)

    @router.get(PREFIX + "/sign-in")
    async def sign_in_page(request: HttpRequest) -> Response:
        return render("sign_in.html", None, next=_console_path(request.query_params.get("next")))

    @router.post(PREFIX + "/sign-in")
    async def sign_in(request: HttpRequest) -> Response:
        try:
            return await console.sign_in(request)
        except RunyardError as exc:
            return error_page(exc, None)

    for method, path, name in PAGES:
        router.add_api_route(
            PREFIX + path, signed_in_page(console, getattr(console, name)), methods=[method]
        )
    return router


def signed_in_page(console: Console, handler: Handler) -> Callable[[HttpRequest], Any]:
    """The route of a page: signed in, it answers `handler`'s page, a refusal as an error
    page; with no session, the sign-in page (for htmx, a redirect to it)."""

    async def route(request: HttpRequest) -> Response:
        who: SignedIn | None = None
        try:
            who = await console.signed_in(request)
            return await handler(request, who)
        except SignInNeeded:
            if request.headers.get("hx-request"):
                # the page whose part asked (htmx names it), to go on to once signed in
                shown = urlsplit(request.headers.get("hx-current-url", ""))
                asked = shown.path + (f"?{shown.query}" if shown.query else "")
                return Response(status_code=401, headers={"HX-Redirect": _sign_in_for(asked)})
            if request.method == "POST":
                return render("sign_in.html", None, status=401, expired=True)
            return RedirectResponse(sign_in_url(request), status_code=303)
        except RunyardError as exc:
            return error_page(exc, who)

    return route
