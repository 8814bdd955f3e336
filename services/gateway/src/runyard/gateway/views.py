"""How tasks and events look in API answers: plain JSON-able dicts.

Every spec goes through `mask_spec` here, so a creator-only value, and an
alert webhook's token, reaches only its creator (R-12). The creator sees values
resolved from the secret store; everyone else sees `******`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from runyard.contracts import Event, RecordedEvent
from runyard.contracts.spec import TaskSpec, mask_spec
from runyard.contracts.task_events import (
    DeployStageCompleted,
    DeployStageFailed,
    DeployStageStarted,
)
from runyard.domain import TaskState


def spec_view(spec: TaskSpec, is_creator: bool, secrets: Mapping[str, str]) -> dict[str, Any]:
    """The spec as the viewer may see it."""
    if not is_creator:
        return mask_spec(spec, viewer_is_creator=False).model_dump(mode="json")
    # The creator sees the values; the references stay the platform's (never sent back).
    env = tuple(
        v.model_copy(update={"value": secrets.get(v.secret_ref or ""), "secret_ref": None})
        if v.creator_only
        else v
        for v in spec.env
    )
    return spec.model_copy(update={"env": env}).model_dump(mode="json")


def task_view(
    state: TaskState,
    events: Sequence[RecordedEvent[Event]],
    is_creator: bool,
    secrets: Mapping[str, str],
) -> dict[str, Any]:
    """A task's detail: state, current stage, stage timeline, counters, runs."""
    return {
        "task_id": state.task_id,
        "tenant": state.tenant,
        "creator": state.creator,
        "name": state.spec.name,
        "status": state.status,
        "stage": state.stage,
        "run": state.run,
        "attempt": state.attempt,
        "spec": spec_view(state.spec, is_creator, secrets),
        "warnings": [w.model_dump(mode="json") for w in state.warnings],
        "group_id": state.group_id,
        "cloned_from": state.cloned_from,
        "clones": list(state.clones),
        "submitted_at": _iso(state.submitted_at),
        "queued_at": _iso(state.queued_at),
        "started_at": _iso(state.started_at),
        "finished_at": _iso(state.finished_at),
        "queue": _queue(state),
        "last_failure_reason": state.last_failure_reason,
        "stop_reason": state.stop_reason,
        "counters": _counters(state),
        "stages": stage_timeline(events),
        "version": state.version,
    }


def _queue(state: TaskState) -> dict[str, Any] | None:
    if state.queue is None:
        return None
    q = state.queue
    # what the last TaskQueued said; the gateway replaces it with the scheduler's
    # queue read model, where the current position and reason are
    return {
        "reason": q.reason,
        "position": q.position,
        "gpus_needed": q.gpus_needed,
        "launchable": q.launchable,
        "blocked": q.blocked,
        "queued_at": _iso(state.queued_at),
        "as_of": None,
    }


def _counters(state: TaskState) -> dict[str, int]:
    names = ("restarts", "reschedules", "requeues", "preemptions", "hangs", "slowdowns")
    return {name: getattr(state, name) for name in names}


def stage_timeline(events: Sequence[RecordedEvent[Event]]) -> list[dict[str, Any]]:
    """Deploy stages in order, with start, end, duration and outcome."""
    stages: list[dict[str, Any]] = []
    for recorded in events:
        e = recorded.event
        if isinstance(e, DeployStageStarted):
            stages.append(
                {
                    "run": e.run,
                    "attempt": e.attempt,
                    "stage": e.stage,
                    "started_at": _iso(recorded.occurred_at),
                    "finished_at": None,
                    "duration_ms": None,
                    "result": "running",
                    "reason": None,
                }
            )
        elif isinstance(e, DeployStageCompleted | DeployStageFailed) and stages:
            last = stages[-1]
            last.update(
                finished_at=_iso(recorded.occurred_at),
                duration_ms=e.duration_ms,
                result="failed" if isinstance(e, DeployStageFailed) else "completed",
                reason=getattr(e, "reason", None),
            )
    return stages


def event_view(recorded: RecordedEvent[Event], is_creator: bool) -> dict[str, Any]:
    """One event of the audit timeline, with actor and correlation id.

    Events never hold creator-only values, only references to them, and a
    reference is shown to nobody (`is_creator` included): it is the platform's.
    Alert webhooks are shown whole to the task's creator only, as in `spec_view`.
    """
    data = recorded.event.model_dump(mode="json")
    spec = getattr(recorded.event, "spec", None)
    if isinstance(spec, TaskSpec):
        shown = mask_spec(spec, viewer_is_creator=False)
        if is_creator:
            shown = shown.model_copy(update={"alerts": spec.alerts})
        data["spec"] = shown.model_dump(mode="json")
    meta = recorded.metadata
    return {
        "position": recorded.global_position,
        "event_id": str(recorded.event_id),
        "version": recorded.stream_version,
        "type": recorded.type,
        "occurred_at": _iso(recorded.occurred_at),
        "actor": meta.actor,
        "correlation_id": meta.correlation_id,
        "causation_id": meta.causation_id,
        "data": data,
    }


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None
