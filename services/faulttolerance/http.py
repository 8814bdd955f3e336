"""The fault-tolerance endpoints of the gateway's HTTP API (an APIRouter the gateway includes).

Every endpoint first asks the gateway for the task as the caller (404 for a
task of another tenant, or none), then answers from the task's events or the
`ft_stack_reports` table, both on the gateway's own database.

    GET  /v1/tasks/{id}/ft-log                 the fault-tolerance log (R-35): lines + counts
    GET  /v1/tasks/{id}/stacks                 the task's stack reports (id, run, attempt, summary)
    POST /v1/tasks/{id}/stacks                 capture the stacks of the current attempt now (R-33)
    GET  /v1/tasks/{id}/stacks/{report_id}     one report: aggregation + raw per-thread stacks

On-demand capture needs the worker processes, which only the deployer's
runtime knows, and the capture (py-spy) must run on their machine. The gateway
therefore does not append a request event: it asks the fault-tolerance service
running in the same process on the same database (`runyard up`; found through
`runyard.faulttolerance.app.in_process_app`). That service captures, stores
the report and appends `StacksCaptured` with the caller as actor, exactly as
after a hang. Without one the answer is 503 `stacks.unavailable` with a hint;
a task with no running attempt is 409 `stacks.not_running`.
"""

import asyncio
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header
from runyard.api.auth import Principal
from runyard.api.errors import Conflict, GatewayError, NotFound
from runyard.api.inputs import check_request_id
from runyard.api.security import caller_dependency
from runyard.contracts import Metadata
from runyard.faulttolerance.app import database_key, in_process_app
from runyard.faulttolerance.ftlog import read_fault_tolerance_log
from runyard.faulttolerance.reports import StackReportStore
from runyard.gateway.app import Gateway
from runyard.telemetry import current_trace_context

#: Statuses with worker processes whose stacks can be captured.
CAPTURABLE = {"env_checking", "running"}


class Unavailable(GatewayError):
    """The platform cannot do it from here (503)."""

    status = 503


class FaultToleranceApi:
    """The stack report store over the gateway's database, migrated on first use."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.reports = StackReportStore(gateway.db)
        self._ready = False
        self._key: str | None = None
        self._lock = asyncio.Lock()

    async def ready(self) -> "FaultToleranceApi":
        if not self._ready:
            async with self._lock:
                if not self._ready:
                    await self.reports.migrate()
                    self._key = await database_key(self.gateway.db)
                    self._ready = True
        return self

    async def task(self, caller: Principal, task_id: str) -> dict[str, Any]:
        """The task as the caller sees it: 404 unless it is in the caller's tenant."""
        await self.ready()
        task: dict[str, Any] = await self.gateway.get_task(caller, task_id)
        return task

    def service(self) -> Any:
        return in_process_app(self._key) if self._key is not None else None


def faulttolerance_router(gateway: Gateway) -> APIRouter:
    """The fault-tolerance endpoints, over `gateway` (auth, task lookup, database)."""
    api = FaultToleranceApi(gateway)
    router = APIRouter(tags=["fault tolerance"])

    Caller = Annotated[Principal, caller_dependency(gateway)]

    @router.get("/v1/tasks/{task_id}/ft-log")
    async def ft_log(caller: Caller, task_id: str) -> dict[str, Any]:
        """The fault-tolerance log: env check items, restarts and reschedules with their
        counts, hangs, stack reports, slowdowns, resumes; counts are of the current run."""
        task = await api.task(caller, task_id)
        log = await read_fault_tolerance_log(gateway.store, task_id)
        return {
            "task_id": task_id,
            "status": task.get("status"),
            "run": log.run,
            "counts": log.counts(),
            "lines": [line.to_json() for line in log.lines],
        }

    @router.get("/v1/tasks/{task_id}/stacks")
    async def list_stacks(caller: Caller, task_id: str) -> dict[str, Any]:
        """The task's stack reports, oldest first (automatic after a hang, or on demand)."""
        await api.task(caller, task_id)
        rows = await api.reports.for_task(task_id)
        reports = [{**row, "captured_at": row["captured_at"].isoformat()} for row in rows]
        return {"task_id": task_id, "reports": reports}

    @router.post(
        "/v1/tasks/{task_id}/stacks",
        status_code=201,
        responses={503: {"description": "no fault-tolerance service or workers here"}},
    )
    async def capture_stacks(
        caller: Caller, task_id: str, x_request_id: Annotated[str | None, Header()] = None
    ) -> dict[str, Any]:
        """Capture the stacks of every worker of the current attempt now; answers the report."""
        check_request_id(x_request_id)
        task = await api.task(caller, task_id)
        if task.get("status") not in CAPTURABLE:
            raise Conflict(
                "stacks.not_running",
                f"task {task_id} is {task.get('status')}: no worker process to capture",
                "stacks can be captured while the task runs; see its past reports with GET",
            )
        service = api.service()
        if service is None:
            raise Unavailable(
                "stacks.unavailable",
                "no fault-tolerance service runs in the gateway's process",
                "on-demand capture needs the gateway, deployer and fault-tolerance service "
                "in one process (`runyard up`); reports captured after a hang are listed by GET",
            )
        request_id = x_request_id or str(uuid.uuid4())
        meta = Metadata(  # the request is the cause, as for every request's events
            actor=caller.actor,
            causation_id=request_id,
            correlation_id=request_id,
            trace_context=current_trace_context(),
        )
        report = await service.request_stacks(task_id, actor=caller.actor, meta=meta)
        if report is None:
            raise Unavailable(
                "stacks.unavailable",
                f"the worker processes of task {task_id} are not known on this machine",
                "the workers may have just exited or restarted: try again",
            )
        return dict(report.to_dict())

    @router.get("/v1/tasks/{task_id}/stacks/{report_id}")
    async def get_stacks(caller: Caller, task_id: str, report_id: str) -> dict[str, Any]:
        """One report: frames per worker, function statistics, odd ones out, raw stacks."""
        await api.task(caller, task_id)
        report = await api.reports.get(report_id)
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
