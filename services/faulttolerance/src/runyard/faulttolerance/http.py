"""The fault-tolerance service's own routes (an APIRouter its HTTP face includes).

The gateway authenticates a request and routes it here unchanged; every route
authenticates the caller again (`runyard.api.security`) and asks the event log
for the task as the caller may see it (404 for a task of another tenant, or
none), then answers from the task's events or the `ft_stack_reports` table.

    GET  /v1/tasks/{id}/ft-log                 the fault-tolerance log (R-35): lines + counts
    GET  /v1/tasks/{id}/stacks                 the task's stack reports (id, run, attempt, summary)
    POST /v1/tasks/{id}/stacks                 capture the stacks of the current attempt now (R-33)
    GET  /v1/tasks/{id}/stacks/{report_id}     one report: aggregation + raw per-thread stacks

On-demand capture is a `CaptureStacks` command to the deployer, which owns the
worker processes; the answer is the report of the `StacksCaptured` it appends
(with the caller as actor and the request as cause), awaited for
`stacks_wait_s`. A task with no running attempt is 409 `stacks.not_running`; a
command that cannot be sent is 503 `stacks.unavailable`; no answer in time is
504 `stacks.timeout` (the capture, if it comes later, is listed by GET).
"""

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header
from runyard.api.auth import Principal
from runyard.api.errors import Conflict, GatewayError, NotFound, Unavailable
from runyard.api.inputs import check_request_id
from runyard.api.responses import NO_BODY, AnswerRoute, refusals
from runyard.api.security import Authenticator, caller_dependency
from runyard.api.tasks import TaskStates
from runyard.contracts import Metadata
from runyard.contracts import http as wire
from runyard.faulttolerance.app import FaultToleranceApp, StacksUnavailable
from runyard.faulttolerance.ftlog import read_fault_tolerance_log
from runyard.faulttolerance.reports import StackReportStore
from runyard.telemetry import current_trace_context

#: Statuses with worker processes whose stacks can be captured.
CAPTURABLE = {"env_checking", "running"}


class TimedOut(GatewayError):
    """What the request needs did not answer in time (504)."""

    http_status = 504


def faulttolerance_router(
    app: FaultToleranceApp, reports: StackReportStore, authenticator: Authenticator
) -> APIRouter:
    """The fault-tolerance routes over `app` (its store and deployer commands), the
    stack report table, and `authenticator` (bearer tokens)."""
    router = APIRouter(tags=["fault tolerance"], route_class=AnswerRoute)
    store = app.store
    tasks = TaskStates(store)
    Caller = Annotated[Principal, caller_dependency(authenticator)]

    @router.get(
        "/v1/tasks/{task_id}/ft-log",
        response_model=wire.FaultToleranceLog,
        responses=refusals(404),
    )
    async def ft_log(caller: Caller, task_id: str) -> dict[str, Any]:
        """The fault-tolerance log: env check items, restarts and reschedules with their
        counts, hangs, stack reports, slowdowns, resumes; counts are of the current run."""
        task = await tasks.visible(caller, task_id)
        log = await read_fault_tolerance_log(store, task_id)
        return {
            "task_id": task_id,
            "status": task.status,
            "run": log.run,
            "counts": log.counts(),
            "lines": [line.to_json() for line in log.lines],
        }

    @router.get(
        "/v1/tasks/{task_id}/stacks", response_model=wire.StackReports, responses=refusals(404)
    )
    async def list_stacks(caller: Caller, task_id: str) -> dict[str, Any]:
        """The task's stack reports, oldest first (automatic after a hang, or on demand)."""
        await tasks.visible(caller, task_id)
        rows = await reports.for_task(task_id)
        listed = [{**row, "captured_at": row["captured_at"].isoformat()} for row in rows]
        return {"task_id": task_id, "reports": listed}

    @router.post(
        "/v1/tasks/{task_id}/stacks",
        status_code=201,
        openapi_extra=NO_BODY,
        response_model=wire.StackReport,
        responses={
            **refusals(403, 404, 409),
            503: {"model": wire.Error, "description": "the capture command cannot be sent now"},
            504: {"model": wire.Error, "description": "no deployer answered in time"},
        },
    )
    async def capture_stacks(
        caller: Caller, task_id: str, x_request_id: Annotated[str | None, Header()] = None
    ) -> dict[str, Any]:
        """Capture the stacks of every worker of the current attempt now; answers the report."""
        check_request_id(x_request_id)
        task = await tasks.visible(caller, task_id, write=True)
        if task.status not in CAPTURABLE:
            raise Conflict(
                "stacks.not_running",
                f"task {task_id} is {task.status}: no worker process to capture",
                "stacks can be captured while the task runs; see its past reports with GET",
            )
        request_id = x_request_id or str(uuid.uuid4())
        meta = Metadata(  # the request is the cause, as for every request's events
            actor=caller.actor,
            causation_id=request_id,
            correlation_id=request_id,
            trace_context=current_trace_context(),
        )
        try:
            report = await app.request_stacks(task_id, meta)
        except StacksUnavailable as exc:
            raise _refusal(task_id, exc) from exc
        return report.to_dict()

    @router.get(
        "/v1/tasks/{task_id}/stacks/{report_id}",
        response_model=wire.StackReport,
        responses=refusals(404),
    )
    async def get_stacks(caller: Caller, task_id: str, report_id: str) -> dict[str, Any]:
        """One report: frames per worker, function statistics, odd ones out, raw stacks."""
        await tasks.visible(caller, task_id)
        report = await reports.get(report_id)
        if report is None or report.get("task_id") != task_id:
            raise NotFound(
                "stacks.not_found",
                f"no stack report {report_id} for task {task_id}",
                f"list the task's reports: GET /v1/tasks/{task_id}/stacks",
                "report_id",
            )
        found: dict[str, Any] = report
        return found

    return router


def _refusal(task_id: str, exc: StacksUnavailable) -> GatewayError:
    if exc.timed_out:
        return TimedOut(
            "stacks.timeout",
            f"stacks of task {task_id}: {exc}",
            "the deployer holding the task's workers may be down or busy (`runyard ps`); "
            f"a capture that comes later is listed by GET /v1/tasks/{task_id}/stacks",
        )
    return Unavailable(
        "stacks.unavailable",
        f"stacks of task {task_id}: {exc}",
        "the workers may have just exited or restarted, or the broker is unreachable: try again",
    )
