"""The task page's further parts: fault tolerance, stack reports, alerts sent, runs,
and the two ways to run a task's spec again with changes.

- `/tasks/{id}/fault-tolerance`: the fault-tolerance log and the stack reports
  (the fault-tolerance service's `ft-log` and `stacks` routes, asked with the
  signed-in user's own token: it checks the tenant again); loaded by htmx after
  the page, so a slow or absent service never holds the page back;
- `/tasks/{id}/stacks/{report_id}`: one stack report;
- `POST /tasks/{id}/stacks/capture`: capture the stacks of the running attempt now
  (the fault-tolerance service's `POST /v1/tasks/{id}/stacks`, as the signed-in
  user: it checks the tenant and the right to change the task again), then the
  report's page;
- `/tasks/{id}/alerts`: the alerts sent about the task (`AlertDelivered`,
  `AlertFailed` in its stream), newest first, a page at most;
- `/tasks/{id}/rerun-with-changes`: a form of the changes a rerun allows
  (`RERUN_CHANGEABLE`), prefilled with the spec; only the fields changed are
  sent, as `runyard rerun --command ...` sends them (`POST /v1/tasks/{id}/rerun`);
- `/tasks/{id}/bundle`: the task's support bundle (`runyard bundle`, `GET
  /v1/tasks/{id}/bundle`: the same use case, as the signed-in user), a zip to save;
- the clone is the submit form prefilled (`/submit?clone={id}`, in `pages`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from fastapi import Request as HttpRequest
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from runyard.api.inputs import parse_body
from runyard.contracts.requests import RerunChanges
from runyard.domain import RERUN_CHANGEABLE
from runyard.errors import RunyardError
from runyard.gateway.bundle import MEDIA_TYPE, BundleApi
from runyard.gateway.console import reads
from runyard.gateway.console.pages import PREFIX, Console, SignedIn, render, typed_int, whole_number

#: Fault-tolerance log lines shown (the newest; the service answers the whole log).
FT_LINES = 200
ALERT_TYPES = ("AlertDelivered", "AlertFailed")
#: The rerun form's fields, in the order shown (those of RERUN_CHANGEABLE).
RERUN_FIELDS = tuple(
    f
    for f in ("command", "image", "worker_spec", "worker_count", "custom_gpus")
    if f in RERUN_CHANGEABLE
)
NUMBERS = frozenset({"worker_count", "custom_gpus"})


async def fault_tolerance(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """The fault-tolerance log (counts of the current run, the newest lines) and the
    stack reports; while the service cannot answer, a note saying so."""
    task_id = request.path_params["task_id"]
    await console.readable_stream(who, task_id)
    try:
        log = await _ft(console, who, task_id, "ft-log")
        stacks = await _ft(console, who, task_id, "stacks")
    except RunyardError as exc:
        if exc.http_status == 404:
            raise
        return render("task_ft.html", who, task_id=task_id, unavailable=exc)
    lines = log.get("lines") or []
    return render(
        "task_ft.html",
        who,
        task_id=task_id,
        log=log,
        lines=lines[-FT_LINES:],
        cut=max(0, len(lines) - FT_LINES),
        reports=list(reversed(stacks.get("reports") or [])),
    )


async def stack_report(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """One stack report: summary, odd ones out, frames per worker, busiest functions."""
    task_id = request.path_params["task_id"]
    report_id = request.path_params["report_id"]
    task = await console.gw.get_task(who.principal, task_id)
    report = await _ft(console, who, task_id, f"stacks/{quote(report_id, safe='')}")
    functions = sorted(
        (report.get("functions") or {}).items(),
        key=lambda kv: (-int(kv[1].get("threads", 0)), kv[0]),
    )
    frames = sorted((report.get("frames_by_worker") or {}).items(), key=lambda kv: _int(kv[0]))
    return render(
        "stack_report.html", who, task=task, report=report, functions=functions[:20], frames=frames
    )


async def capture_stacks(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """Capture the stacks of the task's running attempt now; the new report's page (a
    refusal, e.g. 409 `stacks.not_running` or 504 `stacks.timeout`, as an error page)."""
    task_id = request.path_params["task_id"]
    await console.form(request, who)
    await console.readable_stream(who, task_id)  # another tenant's task: 404, nothing sent
    report = await console.owners.call(
        "faulttolerance",
        "POST",
        f"/v1/tasks/{quote(task_id, safe='')}/stacks",
        token=who.session.token,
    )
    report_id = quote(str(report["report_id"]), safe="")
    return RedirectResponse(f"{PREFIX}/tasks/{task_id}/stacks/{report_id}", status_code=303)


async def alerts(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """The alerts sent about the task, newest first (a page: the newest `TYPED_PAGE`)."""
    task_id = request.path_params["task_id"]
    stream = await console.readable_stream(who, task_id)
    sent = await reads.stream_events_of_types(console.gw.db, stream, ALERT_TYPES)
    return render("task_alerts.html", who, alerts=sent, page=reads.TYPED_PAGE)


async def rerun_form(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """The rerun form, prefilled with the changeable fields of the task's spec."""
    task = await console.gw.get_task(who.principal, request.path_params["task_id"])
    form = {f: "" if task["spec"].get(f) is None else str(task["spec"][f]) for f in RERUN_FIELDS}
    return render("rerun.html", who, task=task, form=form, error=None)


async def rerun_with_changes(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """Rerun with the fields the form changed (none changed: a plain rerun)."""
    task_id = request.path_params["task_id"]
    form = await console.form(request, who)
    task = await console.gw.get_task(who.principal, task_id)
    changes = rerun_changes(task["spec"], form)
    try:
        await console.gw.rerun_task(who.request(), task_id, parse_body(RerunChanges, changes))
    except RunyardError as exc:
        shown = {f: form.get(f, "") for f in RERUN_FIELDS}
        return render("rerun.html", who, status=exc.http_status, task=task, form=shown, error=exc)
    return RedirectResponse(f"{PREFIX}/tasks/{task_id}", status_code=303)


def rerun_changes(spec: Mapping[str, Any], form: Mapping[str, str]) -> dict[str, Any]:
    """The fields of the rerun form that differ from the spec (numbers as numbers; a
    number that is not one is sent as typed: the rules refuse it with a hint)."""
    changes: dict[str, Any] = {}
    for name in RERUN_FIELDS:
        typed = form.get(name, "").strip()
        if not typed:
            continue
        value: Any = typed
        if name in NUMBERS and (number := typed_int(typed)) is not None:
            value = number
        if value != spec.get(name) and str(value) != str(spec.get(name)):
            changes[name] = value
    return changes


async def _ft(console: Console, who: SignedIn, task_id: str, route: str) -> Any:
    path = f"/v1/tasks/{quote(task_id, safe='')}/{route}"
    return await console.owners.call("faulttolerance", "GET", path, token=who.session.token)


async def bundle(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """The task's support bundle, downloaded (whoever may read the task; its secrets and
    the session's token redacted, as over the API); a refusal is the error page."""
    task_id = request.path_params["task_id"]
    made = await BundleApi(console.gw, console.owners).write(
        who.principal, task_id, who.session.token
    )
    headers = {
        "Content-Disposition": f'attachment; filename="{made.filename}"',
        "Content-Length": str(made.size),
        "Cache-Control": "no-store",
    }
    return StreamingResponse(made.chunks(), media_type=MEDIA_TYPE, headers=headers)


def _int(text: str) -> int:
    return whole_number(text) or 0


#: method, path under PREFIX, handler (before the pages' `/tasks/{task_id}`).
PAGES = (
    ("GET", "/tasks/{task_id}/fault-tolerance", fault_tolerance),
    ("POST", "/tasks/{task_id}/stacks/capture", capture_stacks),
    ("GET", "/tasks/{task_id}/stacks/{report_id}", stack_report),
    ("GET", "/tasks/{task_id}/alerts", alerts),
    ("GET", "/tasks/{task_id}/bundle", bundle),
    ("GET", "/tasks/{task_id}/rerun-with-changes", rerun_form),
    ("POST", "/tasks/{task_id}/rerun-with-changes", rerun_with_changes),
)
