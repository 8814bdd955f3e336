"""Which task events raise which alerts, and who wants them (pure: no I/O, no clock).

Alert kinds (the words subscriptions use):

    failed        TaskFailed
    abnormal      TaskMarkedAbnormal
    queued        queued longer than a threshold (a timer over TaskQueued times)
    hang          HangDetected
    slowdown      SlowdownDetected
    restarted     TaskRestartScheduled
    rescheduled   TaskRescheduleRequested
    requeued      TaskRequeued
    succeeded     TaskSucceeded (off unless asked for)
    stopped       TaskStopped

A subscription names the kinds it wants; `queued` may carry its own
threshold as `queued:<seconds>` (e.g. `queued:1800`), otherwise the service's
default applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from runyard.contracts import Event
from runyard.contracts.spec import ALERT_KINDS, TaskSpec
from runyard.contracts.task_events import (
    HangDetected,
    SlowdownDetected,
    TaskFailed,
    TaskMarkedAbnormal,
    TaskRequeued,
    TaskRescheduleRequested,
    TaskRestartScheduled,
    TaskStopped,
    TaskSucceeded,
)
from runyard.domain import TaskState

#: What a tenant subscription wants when it does not say.
DEFAULT_ALERTS: Final = ("failed", "abnormal", "queued", "hang", "slowdown", "restarted", "stopped")

_KIND_OF: Final[dict[type[Event], str]] = {
    TaskFailed: "failed",
    TaskMarkedAbnormal: "abnormal",
    HangDetected: "hang",
    SlowdownDetected: "slowdown",
    TaskRestartScheduled: "restarted",
    TaskRescheduleRequested: "rescheduled",
    TaskRequeued: "requeued",
    TaskSucceeded: "succeeded",
    TaskStopped: "stopped",
}
#: The task events that raise alerts (the `queued` alert comes from a timer instead).
ALERT_EVENTS: Final = tuple(_KIND_OF)
#: Alerts whose card carries the run's first error when the log service knows it.
FIRST_ERROR_KINDS: Final = frozenset({"failed", "abnormal"})


class InvalidAlerts(ValueError):
    """A subscription names an alert kind that does not exist, or a bad threshold."""

    def __init__(self, value: str, reason: str) -> None:
        super().__init__(f"alert {value!r}: {reason}")
        self.value = value
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Subscription:
    """Where alerts go (one Feishu bot) and which ones; per tenant or from a task's spec."""

    id: str
    """`sub-<hex>` for a tenant subscription, `task:<task id>:<index>` for one of a spec."""
    tenant: str
    webhook_url: str
    alerts: tuple[str, ...]
    secret_ref: str | None = None
    queued_after_s: float | None = None
    """Threshold of the `queued` alert; None: `queued:<s>` in `alerts`, else the default."""
    text_only: bool = False
    """Send the plain-text fallback instead of a card."""

    @property
    def channel(self) -> str:
        """The channel named in the audit events: never the URL or the secret."""
        return f"feishu:{self.id}"

    def wants(self, kind: str) -> bool:
        return kind in self.kinds()

    def kinds(self) -> set[str]:
        return {a.partition(":")[0] for a in self.alerts}

    def queue_threshold_s(self, default_s: float) -> float:
        """After how long in the queue this subscription hears about it."""
        if self.queued_after_s is not None:
            return self.queued_after_s
        for alert in self.alerts:
            kind, _, seconds = alert.partition(":")
            if kind == "queued" and seconds:
                return float(seconds)
        return default_s


def check_alerts(alerts: tuple[str, ...]) -> tuple[str, ...]:
    """`alerts` when every entry is a known kind (and `queued:<s>` a positive number)."""
    for alert in alerts:
        kind, colon, seconds = alert.partition(":")
        if kind not in ALERT_KINDS:
            raise InvalidAlerts(alert, f"unknown kind; one of {', '.join(ALERT_KINDS)}")
        if colon and kind != "queued":
            raise InvalidAlerts(alert, "only `queued:<seconds>` takes a threshold")
        if colon and not _positive(seconds):
            raise InvalidAlerts(
                alert, f"the threshold {seconds!r} is not a positive number of seconds"
            )
    return alerts


def _positive(text: str) -> bool:
    try:
        return math.isfinite(float(text)) and float(text) > 0
    except ValueError:
        return False


def task_subscriptions(task_id: str, tenant: str, spec: TaskSpec) -> list[Subscription]:
    """The subscriptions a task's spec carries (R-50), each with a stable id."""
    return [
        Subscription(
            id=f"task:{task_id}:{i}",
            tenant=tenant,
            webhook_url=s.webhook_url,
            alerts=tuple(s.alerts),
            secret_ref=s.secret_ref,
        )
        for i, s in enumerate(spec.alerts)
    ]


def alert_kind(event: Event) -> str | None:
    """The alert a task event raises, if any (the `queued` alert comes from the timer)."""
    return _KIND_OF.get(type(event))


def reason(event: Event, state: TaskState) -> str:
    """What a person reads under "Reason" for the alert of `event`."""
    if isinstance(event, TaskFailed):
        named = event.worker is None or f"worker {event.worker} " in f"{event.reason} "
        # "worker 0 exited with code 3" says it already: not "... (worker 0 exit 3)" again
        exit_part = "" if named else f" (worker {event.worker} exit {event.exit_code})"
        return event.reason + exit_part
    if isinstance(event, TaskMarkedAbnormal):
        steps = "; ".join(event.next_steps)
        return event.reason + (f". Next steps: {steps}" if steps else "")
    if isinstance(event, HangDetected):
        return f"no progress for {event.idle_s:.0f} s (attempt {event.attempt})"
    if isinstance(event, SlowdownDetected):
        return event.message
    if isinstance(event, TaskRestartScheduled):
        cause: str = event.reason
        if cause == "failure" and state.last_failure_reason:
            cause = f"failure ({state.last_failure_reason})"
        return f"{cause}: attempt {event.attempt} starts in {event.delay_s:.0f} s"
    if isinstance(event, TaskRescheduleRequested):
        nodes = ", ".join(event.faulty_nodes)
        return event.reason + (f" (faulty: {nodes})" if nodes else "")
    if isinstance(event, TaskRequeued):
        why = f" ({state.last_failure_reason})" if state.last_failure_reason else ""
        return f"preempted{why} and requeued ({event.requeue_count} so far this run)"
    if isinstance(event, TaskSucceeded):
        return "every worker exited 0"
    if isinstance(event, TaskStopped):
        # who asked, as the task's page says it ("stopped by bob (member)")
        return state.stop_reason or "stopped at a person's request"
    return state.last_failure_reason or event.type_name()


def queued_reason(queue_reason: str, waited_s: float, threshold_s: float) -> str:
    """The reason of a `queued` alert: how long, and why it still waits (the last queue reason)."""
    why = queue_reason or "waiting for resources"
    return f"queued for {_duration(waited_s)} (alert after {_duration(threshold_s)}): {why}"


def queue_due(queued_at: datetime, threshold_s: float, now: datetime) -> bool:
    """Whether a wait that began at `queued_at` has passed `threshold_s` at `now`."""
    return (now - queued_at).total_seconds() >= threshold_s


def spec_words(spec: TaskSpec) -> str:
    """The worker spec as a person says it: `2 x 8gpu`, or `12 GPUs (custom)`."""
    if spec.custom_gpus is not None:
        return f"{spec.custom_gpus} GPUs (custom)"
    return f"{spec.worker_count} x {spec.worker_spec}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
