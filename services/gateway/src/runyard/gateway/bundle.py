"""Support bundle (R-70): one zip archive that tells a task's whole story.

    GET /v1/tasks/{id}/bundle        application/zip (`runyard bundle ID`)

The same reading rule as every task read: the caller's own tenant, every
tenant for the sre and platform_admin roles, 404 otherwise. The bundle is
gathered from the read paths the other task routes use: the task's event
stream and its fold here, and through their owners' APIs, called with the
caller's token (`runyard.gateway.proxy.Owners`), the fault-tolerance log and
the stack reports (the fault-tolerance service), the first error and the
workers' tails (the log service). An owner that cannot be reached is a 503
naming it: no bundle is written without its part. The bundle holds, in this
order:

    summary.md                       the readable page: what happened, first error, timings
    task.json                        state, counters, stage timeline (as GET /v1/tasks/{id})
    spec.json                        the current spec, creator-only values masked, always
    first-error.json                 GET /v1/tasks/{id}/first-error of the latest run
    ft-log.txt                       the fault-tolerance log (R-35)
    env-check.json                   env check items and results, per attempt
    slowdowns.txt                    the slowdown lines (R-34)
    stacks/<report id>.json          hang stack reports (the last 20)
    platform.json                    Runyard, Python, runtime and image; the pool and nodes
    events.jsonl                     the whole stream: actor, causation, correlation, trace
    logs/run-R-attempt-A/worker-W.log  the last 500 lines of each worker, numbered: of
                                     the failing attempt, the last 3 restarted
                                     ones and the last one

Why zip and not tar.gz: a zip member may be written without knowing its
length first (a data descriptor follows it), so the event stream is written
in batches, never held whole; each member can be opened alone; and every
desktop opens one without tools.

Secrets never enter a bundle. Specs are masked for everyone (the creator
too): creator-only variables show `******`, alert webhooks show only their
host. The task's secret values (creator-only variables of every run, alert
signing secrets, webhook paths) and the caller's bearer token are replaced
by `[redacted]` in every text written (a worker may print its own secret);
then the finished archive is read back and searched for each value, raw and
JSON-escaped, and a bundle that still holds one is refused (422
`bundle.secret_found`), never written. Values shorter than 8 characters are
masked but not searched for: they would match ordinary text.

Bounds: the archive is built in a temporary file (deleted when closed), never
in memory, and refused past 64 MiB (422 `bundle.too_large`); a log tail line
is cut at 4096 characters, the tails together at 32 MiB, a stack report at
1 MiB (see docs/limits.md). The HTTP answer streams the finished file.

(No `from __future__ import annotations` here: FastAPI must see the route's
`caller_dependency(gateway)` when it reads the handler's signature.)
"""

import asyncio
import json
import platform
import re
import tempfile
import unicodedata
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from importlib import metadata
from typing import IO, Annotated, Any
from urllib.parse import quote, urlsplit

import yaml
from fastapi import APIRouter
from fastapi import Request as HttpRequest
from fastapi.responses import StreamingResponse
from runyard.api.auth import Principal, bearer_token
from runyard.api.errors import GatewayError, task_not_found
from runyard.api.responses import AnswerRoute, refusals
from runyard.api.security import caller_dependency
from runyard.contracts import Event, RecordedEvent
from runyard.contracts import http as wire
from runyard.contracts.spec import MASK, TaskSpec, mask_spec
from runyard.contracts.task_events import (
    DeployStageFailed,
    EnvCheckFinished,
    EnvCheckItemReported,
    HangDetected,
    SlowdownDetected,
    StacksCaptured,
    TaskFailed,
    TaskMarkedAbnormal,
    TaskPlaced,
    TaskPreempted,
    TaskRequeued,
    TaskRerunRequested,
    TaskRescheduleFailed,
    TaskRescheduleRequested,
    TaskRestartScheduled,
    TaskRunning,
    TaskStopped,
    TaskSucceeded,
    WorkerExited,
)
from runyard.domain import TaskState, fold
from runyard.gateway.app import Gateway
from runyard.gateway.pools import describe, load_pools
from runyard.gateway.proxy import Owners
from runyard.gateway.views import event_view, stage_timeline, task_view

#: The largest archive written (compressed); a larger one is refused.
MAX_BUNDLE_BYTES = 64 * 1024 * 1024
#: Lines of each worker's tail.
TAIL_LINES = 500
#: A longer log line is cut in a tail (the log store keeps it whole).
MAX_LINE_CHARS = 4096
#: Attempts that ended in a restart whose tails go in too (the latest ones).
BROKEN_ATTEMPTS = 3
#: All tails together, uncompressed; workers past it get no tail (the summary says so).
MAX_TAIL_BYTES = 32 * 1024 * 1024
#: What a tail adds to each line: its number, time and stream.
TAIL_LINE_OVERHEAD = 60
#: The latest stack reports kept, and the size of one (larger: left out, named).
MAX_STACK_REPORTS = 20
MAX_REPORT_BYTES = 1024 * 1024
#: Shorter secret values are masked in specs but not searched for in texts.
MIN_SECRET_CHARS = 8
REDACTED = "[redacted]"
#: Events written to the archive per batch (each batch compressed off the event loop).
EVENT_BATCH = 1000
CHUNK = 64 * 1024
MEDIA_TYPE = "application/zip"


# --- errors -----------------------------------------------------------------------


class BundleRefused(GatewayError):
    """The bundle cannot be written as asked (422): too large, or a secret in it."""

    http_status = 422


def secret_found(member: str) -> BundleRefused:
    return BundleRefused(
        "bundle.secret_found",
        f"a secret value of the task is still in {member!r} of the bundle: nothing was written",
        "the task's secrets are redacted before a bundle is written, so this is a fault of "
        "Runyard: report it to the platform team with the task id (not the bundle)",
        "task_id",
    )


def too_large(limit: int) -> BundleRefused:
    return BundleRefused(
        "bundle.too_large",
        f"the task's bundle is over {limit // (1024 * 1024)} MiB",
        "read the events with GET /v1/tasks/{id}/events and export the logs with "
        "`runyard logs ID --export FILE` instead",
        "task_id",
    )


# --- secrets ----------------------------------------------------------------------


class Secrets:
    """The task's secret values: redacted from every text, then searched for in the archive."""

    def __init__(self, values: Iterable[str]) -> None:
        found = {v for v in values if v and len(v) >= MIN_SECRET_CHARS}
        self.values = sorted(found, key=len, reverse=True)  # the longest first
        alternatives = "|".join(re.escape(v) for v in self.values)
        self._pattern = re.compile(alternatives) if self.values else None

    def redact(self, text: str) -> str:
        return self._pattern.sub(REDACTED, text) if self._pattern else text

    def redact_json(self, value: Any) -> Any:
        """Every string of a JSON-able value redacted (keys too): JSON stays valid."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, Mapping):
            return {self.redact(str(k)): self.redact_json(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.redact_json(v) for v in value]
        return value

    def needles(self) -> list[bytes]:
        """Each value as bytes may hold it: raw UTF-8, and JSON-escaped both ways."""
        forms: set[bytes] = set()
        for value in self.values:
            forms.add(value.encode())
            forms.add(json.dumps(value)[1:-1].encode())
            forms.add(json.dumps(value, ensure_ascii=False)[1:-1].encode())
        return sorted(forms)


def mask_webhook(url: str) -> str:
    """A webhook URL with only its scheme and host (the path is the credential)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}/{MASK}" if parts.hostname else MASK


def webhook_credential(url: str) -> str:
    """What makes a webhook URL a credential: everything after its host (a Feishu bot's
    hook id is in the path). Searched for alone, so a log line with only the path is
    redacted too, and the masked URL (`https://host/******`) never matches it."""
    parts = urlsplit(url)
    return url[url.index(parts.netloc) + len(parts.netloc) :] if parts.netloc else url


def bundle_spec(spec: TaskSpec) -> dict[str, Any]:
    """The spec as a bundle shows it, whoever asks: creator-only values and
    webhooks masked, secret references dropped."""
    data = mask_spec(spec, viewer_is_creator=False).model_dump(mode="json")
    return _mask_alerts(data)


def _mask_alerts(spec: dict[str, Any]) -> dict[str, Any]:
    alerts = [
        {**a, "webhook_url": mask_webhook(str(a.get("webhook_url", ""))), "secret_ref": None}
        for a in spec.get("alerts") or []
    ]
    return {**spec, "alerts": alerts}


def _specs(events: Sequence[RecordedEvent[Event]]) -> list[TaskSpec]:
    return [s for e in events if isinstance(s := getattr(e.event, "spec", None), TaskSpec)]


async def task_secrets(
    gateway: Gateway, tenant: str, events: Sequence[RecordedEvent[Event]]
) -> list[str]:
    """Every secret value the task's runs used: creator-only variables and alert signing
    secrets from the secret store, values given inline, and the webhook URLs."""
    specs = _specs(events)
    refs = {v.secret_ref for s in specs for v in s.env if v.creator_only and v.secret_ref}
    refs |= {a.secret_ref for s in specs for a in s.alerts if a.secret_ref}
    values = [v.value for s in specs for v in s.env if v.creator_only and v.value]
    values += [webhook_credential(a.webhook_url) for s in specs for a in s.alerts]
    if refs:
        rows = await gateway.db.fetch(
            "SELECT value FROM secrets WHERE tenant = $1 AND ref = ANY($2)", tenant, sorted(refs)
        )
        values += [r["value"] for r in rows]
    return [v for v in values if v != MASK]


# --- text -------------------------------------------------------------------------


def escape_controls(text: Any) -> str:
    """`text` with control characters written as escapes (`\\n`, `\\x1b`): user text
    in summary.md cannot forge lines or send terminal sequences to whoever cats it."""
    out = []
    for char in str(text):
        if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
            out.append(char.encode("unicode_escape").decode("ascii"))
        else:
            out.append(char)
    return "".join(out)


def _cell(text: Any) -> str:
    return escape_controls(text).replace("|", "\\|")


def _cut(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    return f"{line[:MAX_LINE_CHARS]} [cut: {len(line) - MAX_LINE_CHARS} more characters]"


# --- what the bundle is made of ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class TailPlan:
    """One worker's tail before it is read: `total` lines in all, the last `shown` of
    them in the bundle, about `size` bytes."""

    run: int
    attempt: int
    worker: int
    total: int
    shown: int
    size: int

    @property
    def name(self) -> str:
        return f"logs/run-{self.run}-attempt-{self.attempt}/worker-{self.worker}.log"


@dataclass(frozen=True, slots=True)
class Tail:
    """The last lines of one worker of one attempt: `total` lines in all."""

    run: int
    attempt: int
    worker: int
    total: int
    lines: list[tuple[datetime, str, str]]

    @property
    def name(self) -> str:
        return f"logs/run-{self.run}-attempt-{self.attempt}/worker-{self.worker}.log"

    def text(self, secrets: Secrets) -> str:
        """Each line with its number in the worker's output of the attempt (from 1)."""
        first = self.total - len(self.lines) + 1
        width = len(str(self.total))
        rows = [
            f"{first + i:>{width}} {at.isoformat()} {stream:6} | {secrets.redact(_cut(line))}"
            for i, (at, stream, line) in enumerate(self.lines)
        ]
        return "\n".join(rows) + ("\n" if rows else "")


@dataclass
class Facts:
    """Everything the summary names, gathered before the archive is written."""

    state: TaskState
    events: Sequence[RecordedEvent[Event]]
    #: GET /v1/tasks/{id}/ft-log: `{run, counts, lines}`.
    ft_log: dict[str, Any]
    #: GET /v1/tasks/{id}/first-error of the latest run, when one was found:
    #: `{line, exception, before, after, layer, rule, why, evidence}`.
    first_error: dict[str, Any] | None
    platform: dict[str, Any]
    #: The tails to write, read one at a time while the archive is written.
    tails: list[TailPlan] = field(default_factory=list)
    #: (run, attempt, worker) of the workers whose tails were over the budget.
    tails_left_out: list[tuple[int, int, int]] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)
    generated_at: datetime | None = None


# --- the summary ------------------------------------------------------------------


def summary_markdown(facts: Facts) -> str:
    """summary.md: the page a person reads first."""
    s = facts.state
    lines = [
        f"# Support bundle of task {escape_controls(s.task_id)}",
        "",
        f"- Name: {escape_controls(s.spec.name)}",
        f"- Tenant: {escape_controls(s.tenant)}; creator: {escape_controls(s.creator)}",
        f"- State: {s.status}" + (f" ({s.stage})" if s.stage else ""),
        f"- Reason: {escape_controls(_reason(s))}",
        f"- Run {s.run}, attempt {s.attempt}; pool {escape_controls(s.spec.pool)}",
        f"- Submitted {_at(s.submitted_at)}, started {_at(s.started_at)}, "
        f"finished {_at(s.finished_at)}",
        f"- Bundle written {_at(facts.generated_at)} by Runyard {facts.platform['runyard']}",
        "",
        "## Counters",
        "",
        "| restarts | reschedules | requeues | preemptions | hangs | slowdowns |",
        "|---|---|---|---|---|---|",
        f"| {s.restarts} | {s.reschedules} | {s.requeues} | {s.preemptions} | {s.hangs} "
        f"| {s.slowdowns} |",
        "",
        "(Counters are of the current run; the story below has every run.)",
        "",
        *_first_error_section(facts.first_error),
        *_story_section(facts.events),
        *_stages_section(facts.events),
        *_outputs_section(s),
        *_platform_section(facts.platform),
        *_files_section(facts),
    ]
    return "\n".join(lines) + "\n"


def _reason(state: TaskState) -> str:
    if state.last_failure_reason:
        return state.last_failure_reason
    if state.queue is not None:
        return state.queue.reason
    return "-"


def _at(at: datetime | None) -> str:
    return at.isoformat() if at else "-"


def _first_error_section(found: Mapping[str, Any] | None) -> list[str]:
    lines = ["## First error", ""]
    if found is None:
        return [*lines, "No error line in the logs of the latest run.", ""]
    line = found["line"]
    lines += [
        f"- Layer: **{found['layer']}** (rule `{found['rule']}`)",
        f"- Fix hint: {escape_controls(found['why'])}",
        f"- Where: run {line['run']}, attempt {line['attempt']}, worker {line['worker']}, "
        f"{line['stream']}, at {line['at']}",
        f"- Line: {escape_controls(_cut(line['line']))}",
    ]
    if found.get("exception"):
        lines.append(f"- Exception: {escape_controls(_cut(found['exception']['line']))}")
    evidence = found.get("evidence")
    if evidence and evidence != line["line"]:
        lines.append(f"- Matched: {escape_controls(_cut(evidence))}")
    return [*lines, "", "Context: first-error.json; the worker's tail under logs/.", ""]


def _story_section(events: Sequence[RecordedEvent[Event]]) -> list[str]:
    """Runs and attempts: each event that changed the course of the task, in order."""
    lines = ["## Runs and attempts", ""]
    for recorded in events:
        e = recorded.event
        if isinstance(e, TaskRerunRequested):
            actor = escape_controls(recorded.metadata.actor)
            lines += ["", f"Run {e.run} (a rerun) requested by {actor}:"]
        text = _story_line(e)
        if text:
            lines.append(f"- {recorded.occurred_at.isoformat()} {escape_controls(text)}")
    return [*lines, ""]


def _story_line(e: Event) -> str | None:
    """One line per kind of event that changed the course of the task."""
    if isinstance(e, TaskPlaced):
        nodes = ", ".join(f"worker {w.index} on {w.node}" for w in e.workers)
        return f"run {e.run} attempt {e.attempt} placed in pool {e.pool}: {nodes}"
    if isinstance(e, TaskRunning):
        return f"run {e.run} attempt {e.attempt} running"
    if isinstance(e, WorkerExited):
        return f"run {e.run} attempt {e.attempt}: worker {e.worker} exited {e.exit_code}"
    if isinstance(e, TaskRestartScheduled):
        reason = e.reason.replace("_", " ")
        return f"restart scheduled after {reason}: attempt {e.attempt} in {e.delay_s:.0f} s"
    if isinstance(e, TaskRescheduleRequested):
        faulty = f" (faulty: {', '.join(e.faulty_nodes)})" if e.faulty_nodes else ""
        return f"reschedule requested in attempt {e.attempt}: {e.reason}{faulty}"
    if isinstance(e, TaskRescheduleFailed):
        return f"reschedule failed: {e.reason}"
    if isinstance(e, TaskPreempted):
        return f"preempted: {e.reason}"
    if isinstance(e, TaskRequeued):
        return f"requeued ({e.requeue_count} so far)"
    if isinstance(e, HangDetected):
        return f"attempt {e.attempt}: hang detected, no progress for {e.idle_s:.0f} s"
    if isinstance(e, StacksCaptured):
        return f"attempt {e.attempt}: stacks captured (stacks/{e.report_id}.json): {e.summary}"
    if isinstance(e, DeployStageFailed):
        return f"attempt {e.attempt}: deploy stage {e.stage} failed: {e.reason}"
    if isinstance(e, TaskFailed):
        return f"run {e.run} failed in attempt {e.attempt}: {e.reason}"
    if isinstance(e, TaskMarkedAbnormal):
        return f"run {e.run} abnormal: {e.reason}"
    if isinstance(e, TaskSucceeded):
        return f"run {e.run} succeeded in attempt {e.attempt}"
    if isinstance(e, TaskStopped):
        return f"run {e.run} stopped"
    return None


def _stages_section(events: Sequence[RecordedEvent[Event]]) -> list[str]:
    lines = ["## Deploy stages", ""]
    stages = stage_timeline(events)
    if not stages:
        return [*lines, "No deploy stage ran.", ""]
    lines += ["| run | attempt | stage | started | ms | result |", "|---|---|---|---|---|---|"]
    for st in stages:
        result = st["result"] + (f": {_cell(st['reason'])}" if st["reason"] else "")
        ms = "-" if st["duration_ms"] is None else st["duration_ms"]
        lines.append(
            f"| {st['run']} | {st['attempt']} | {st['stage']} | {st['started_at']} | {ms} "
            f"| {result} |"
        )
    return [*lines, ""]


def _outputs_section(state: TaskState) -> list[str]:
    spec = state.spec
    lines = ["## Where the outputs went", ""]
    for path in spec.output_dirs:
        lines.append(f"- output: {escape_controls(path)}")
    if spec.tensorboard_dir:
        lines.append(f"- TensorBoard: {escape_controls(spec.tensorboard_dir)}")
    for m in spec.mounts:
        lines.append(f"- mount: {escape_controls(json.dumps(m.model_dump(mode='json')))}")
    if len(lines) == 2:
        lines.append("- the spec names no output directory, TensorBoard directory or volume")
    for warning in state.warnings:
        lines.append(f"- warning at submission: {escape_controls(warning.message)}")
    return [*lines, "", "Only mounted shared storage outlives a worker (R-13).", ""]


def _platform_section(info: Mapping[str, Any]) -> list[str]:
    nodes = ", ".join(info["nodes"]) or "none (never placed)"
    return [
        "## Platform",
        "",
        f"- Runyard {info['runyard']}, Python {info['python']}, runtime {info['runtime']}",
        f"- Image: {escape_controls(info['image'])}",
        f"- Pool: {escape_controls(json.dumps(info['pool']))}",
        f"- Nodes: {escape_controls(nodes)}",
        "",
    ]


def _files_section(facts: Facts) -> list[str]:
    lines = ["## Files", ""]
    for tail in facts.tails:
        lines.append(f"- {tail.name}: the last {tail.shown} of {tail.total} lines")
    for run, attempt, worker in facts.tails_left_out:
        lines.append(
            f"- run {run} attempt {attempt} worker {worker}: no tail (the tails are over "
            f"{MAX_TAIL_BYTES // (1024 * 1024)} MiB); export it with `runyard logs`"
        )
    for report in facts.reports:
        lines.append(f"- stacks/{report['report_id']}.json: {escape_controls(report['summary'])}")
    lines += [
        f"- events.jsonl: {len(facts.events)} events of the task's stream",
        "- ft-log.txt, env-check.json, slowdowns.txt, first-error.json, task.json, "
        "spec.json, platform.json",
    ]
    return [*lines, ""]


# --- other members ------------------------------------------------------------------


def event_record(recorded: RecordedEvent[Event]) -> dict[str, Any]:
    """One line of events.jsonl: the audit view (masked as for anyone but the creator,
    with its event id) and the trace context."""
    view = event_view(recorded, is_creator=False)
    if isinstance(view["data"].get("spec"), dict):
        view["data"]["spec"] = _mask_alerts(view["data"]["spec"])
    return {**view, "trace_context": dict(recorded.metadata.trace_context)}


def env_check_records(events: Sequence[RecordedEvent[Event]]) -> list[dict[str, Any]]:
    """Env check items and results, in order (R-31)."""
    kinds = (EnvCheckItemReported, EnvCheckFinished)
    return [
        {"type": e.type, "at": e.occurred_at.isoformat(), **e.event.model_dump(mode="json")}
        for e in events
        if isinstance(e.event, kinds)
    ]


def slowdown_lines(events: Sequence[RecordedEvent[Event]]) -> str:
    rows = [
        f"{e.occurred_at.isoformat()} run {e.event.run}: {e.event.message}"
        for e in events
        if isinstance(e.event, SlowdownDetected)
    ]
    return "\n".join(rows) + "\n" if rows else "(no slowdown detected)\n"


def ft_log_text(log: Mapping[str, Any]) -> str:
    """The fault-tolerance log (GET /v1/tasks/{id}/ft-log) as text, a line per entry."""
    counts = " ".join(f"{k}={v}" for k, v in log["counts"].items())
    header = f"run {log['run']}: {counts}"
    return "\n".join([header, *(ft_line(line) for line in log["lines"])]) + "\n"


def ft_line(line: Mapping[str, Any]) -> str:
    attempt = f" attempt {line['attempt']}" if line.get("attempt") is not None else ""
    return f"{line['at']} [run {line['run']}{attempt}] {str(line['level']).upper()} {line['text']}"


def runtime_name(config: Mapping[str, Any]) -> str:
    """The runtime `runtime.yaml` configures (`local` unless another is named)."""
    named = [k for k in config if k in ("local", "slurm", "kubernetes")]
    return ", ".join(named) or "local"


def nodes_of(events: Sequence[RecordedEvent[Event]]) -> list[str]:
    """Every node the task ran on, in the order first placed."""
    seen: dict[str, None] = {}
    for e in events:
        if isinstance(e.event, TaskPlaced):
            for w in e.event.workers:
                seen.setdefault(w.node, None)
    return list(seen)


# --- the archive --------------------------------------------------------------------


class Archive:
    """A zip written to a temporary file (deleted when closed): every text redacted, the
    size checked after each write, nothing held in memory but the member being written."""

    def __init__(self, secrets: Secrets, limit: int, when: datetime) -> None:
        self.secrets = secrets
        self.limit = limit
        self.date_time = when.timetuple()[:6]
        # Closed by `Bundle.chunks` once sent, or by `discard`: it outlives this call.
        self.file: IO[bytes] = tempfile.TemporaryFile(prefix="runyard-bundle-")  # noqa: SIM115
        self.zip = zipfile.ZipFile(self.file, "w", compression=zipfile.ZIP_DEFLATED)
        self.names: list[str] = []

    def _info(self, name: str) -> zipfile.ZipInfo:
        info = zipfile.ZipInfo(self.secrets.redact(name), self.date_time)
        info.compress_type = zipfile.ZIP_DEFLATED
        self.names.append(info.filename)
        return info

    def _check(self) -> None:
        if self.file.tell() > self.limit:
            raise too_large(self.limit)

    def text(self, name: str, text: str) -> None:
        """A text member; `text` is redacted here."""
        self.zip.writestr(self._info(name), self.secrets.redact(text).encode())
        self._check()

    def json(self, name: str, value: Any) -> None:
        """A JSON member; every string of `value` is redacted here."""
        body = json.dumps(self.secrets.redact_json(value), indent=2, ensure_ascii=False)
        self.zip.writestr(self._info(name), body.encode() + b"\n")
        self._check()

    def open(self, name: str) -> IO[bytes]:
        """A member written in parts (its length unknown until closed)."""
        return self.zip.open(self._info(name), "w", force_zip64=True)

    def write_lines(self, member: IO[bytes], records: Sequence[Mapping[str, Any]]) -> None:
        """JSON lines, each redacted, into a member opened with `open`."""
        for record in records:
            body = json.dumps(self.secrets.redact_json(record), ensure_ascii=False)
            member.write(body.encode() + b"\n")
        self._check()

    def finish(self) -> int:
        """Close the zip, search it for secrets (refused if one is there); its size."""
        self.zip.close()
        self._check()
        size = self.file.seek(0, 2)
        member = find_secret(self.file, self.secrets.needles())
        if member is not None:
            raise secret_found(member)
        self.file.seek(0)
        return size

    def discard(self) -> None:
        self.zip.close()
        self.file.close()


def find_secret(file: IO[bytes], needles: Sequence[bytes]) -> str | None:
    """The first member of the zip in `file` whose name or bytes hold a needle (None: none).

    Reads the finished archive back member by member, in chunks that overlap by
    the longest needle, so a value split between two chunks is still found."""
    if not needles:
        return None
    overlap = max(len(n) for n in needles) - 1
    file.seek(0)
    with zipfile.ZipFile(file) as archive:
        for info in archive.infolist():
            if any(n in info.filename.encode() for n in needles):
                return info.filename
            with archive.open(info) as member:
                carry = b""
                while chunk := member.read(1024 * 1024):
                    window = carry + chunk
                    if any(n in window for n in needles):
                        return info.filename
                    carry = window[-overlap:] if overlap else b""
    return None


@dataclass
class Bundle:
    """A finished archive: an open temporary file (deleted when closed), its size."""

    file: IO[bytes]
    size: int
    filename: str

    def chunks(self, size: int = CHUNK) -> Iterator[bytes]:
        """The archive's bytes, then the file closed (and so deleted)."""
        try:
            self.file.seek(0)
            while chunk := self.file.read(size):
                yield chunk
        finally:
            self.file.close()


# --- gathering ------------------------------------------------------------------------


class Asker:
    """Calls the owners' routes of one task (`/v1/tasks/{id}/<tail>`) with the
    caller's token, answering their JSON."""

    def __init__(self, owners: Owners, task_id: str, token: str | None) -> None:
        self.owners = owners
        self.prefix = f"/v1/tasks/{quote(task_id, safe='')}/"
        self.token = token

    async def __call__(self, owner: str, tail: str, params: Any = None) -> Any:
        path = self.prefix + tail
        return await self.owners.call(owner, "GET", path, token=self.token, params=params)


def found_error(answer: Mapping[str, Any]) -> dict[str, Any] | None:
    """The first error of GET /v1/tasks/{id}/first-error, None when none was found."""
    if not answer.get("found"):
        return None
    return {k: v for k, v in answer.items() if k not in ("task_id", "status", "found")}


class BundleApi:
    """Writes support bundles over the gateway's read paths and the owners' APIs."""

    def __init__(self, gateway: Gateway, owners: Owners) -> None:
        self.gateway = gateway
        self.owners = owners

    async def read(
        self, caller: Principal, task_id: str
    ) -> tuple[TaskState, list[RecordedEvent[Event]]]:
        """The task's stream, if the caller may read the task (the rule of every task
        read: own tenant, or every tenant for sre and platform_admin; 404 otherwise)."""
        events = await self.gateway.store.read_stream(f"task-{task_id}")
        if not events:
            raise task_not_found(task_id)
        state = fold(events, task_id=task_id)
        if not caller.may_read_tenant(state.tenant):
            raise task_not_found(task_id)
        return state, events

    async def write(self, caller: Principal, task_id: str, token: str | None) -> Bundle:
        """The task's bundle in a temporary file, checked for secrets (the caller's
        `token`, with which the owners are asked, too)."""
        state, events = await self.read(caller, task_id)
        also_secret = [token] if token else []
        secrets = Secrets([*await task_secrets(self.gateway, state.tenant, events), *also_secret])
        ask = Asker(self.owners, task_id, token)
        facts = await self.facts(caller, state, events, ask)
        archive = Archive(secrets, MAX_BUNDLE_BYTES, facts.generated_at or self.gateway.clock())
        try:
            await self._fill(archive, facts, ask)
            size = await asyncio.to_thread(archive.finish)
        except BaseException:
            archive.discard()
            raise
        return Bundle(archive.file, size, f"runyard-bundle-{task_id}.zip")

    async def facts(
        self,
        caller: Principal,
        state: TaskState,
        events: list[RecordedEvent[Event]],
        ask: Asker,
    ) -> Facts:
        """What the summary names (the log tails and the stack reports included)."""
        found = await ask("logs", "first-error")
        facts = Facts(
            state=state,
            events=events,
            ft_log=await ask("faulttolerance", "ft-log"),
            first_error=found_error(found),
            platform=await self.platform(caller, state, events),
            generated_at=self.gateway.clock(),
        )
        await self._tails(facts, ask)
        facts.reports = (await ask("faulttolerance", "stacks"))["reports"][-MAX_STACK_REPORTS:]
        return facts

    async def platform(
        self, caller: Principal, state: TaskState, events: Sequence[RecordedEvent[Event]]
    ) -> dict[str, Any]:
        """Versions (Runyard, Python, runtime, image) and the pool and nodes of the task."""
        pools = await load_pools(self.gateway.db, self.gateway.config_dir)
        pool = pools.get(state.spec.pool)
        path = self.gateway.config_dir / "runtime.yaml"
        config = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
        return {
            "runyard": _runyard_version(),
            "python": platform.python_version(),
            "runtime": runtime_name(config),
            "image": state.spec.image,
            "image_catalogue": await self.image_entry(caller, state.spec.image),
            "pool": describe(pool) if pool else {"pool_id": state.spec.pool, "known": False},
            "nodes": nodes_of(events),
        }

    async def image_entry(self, caller: Principal, image: str) -> dict[str, Any] | None:
        """The catalogue's entry of `image` (the submission service's catalogue); None
        when it has none, or cannot be asked now (the bundle goes without it)."""
        try:
            catalogue = await self.gateway.catalogue_view(caller)
        except GatewayError:
            return None
        images = catalogue.get("images") or []
        return next((i for i in images if isinstance(i, dict) and i.get("name") == image), None)

    def attempts(self, facts: Facts) -> list[tuple[int, int]]:
        """The attempts whose tails are in the bundle: the failing one first (the first
        error's, else the failure's), then the latest `BROKEN_ATTEMPTS` that ended in a
        restart (a crash or a hang: why the task restarted), newest first, then the
        last one of the latest run."""
        state = facts.state
        wanted: list[tuple[int, int]] = []
        if facts.first_error is not None:
            line = facts.first_error["line"]
            wanted.append((line["run"], line["attempt"]))
        else:
            failed = [e.event for e in facts.events if isinstance(e.event, TaskFailed)]
            if failed and failed[-1].attempt:
                wanted.append((failed[-1].run, failed[-1].attempt))
        restarts = [e.event for e in facts.events if isinstance(e.event, TaskRestartScheduled)]
        broken = [(r.run, r.attempt - 1) for r in restarts if r.attempt > 1]
        wanted += reversed(broken[-BROKEN_ATTEMPTS:])
        if state.attempt:
            wanted.append((state.run, state.attempt))
        return list(dict.fromkeys(wanted))

    async def _tails(self, facts: Facts, ask: Asker) -> None:
        """Which tails go in, within `MAX_TAIL_BYTES` (their lines are read when written)."""
        budget = MAX_TAIL_BYTES
        for run, attempt in self.attempts(facts):
            where = {"run": run, "attempt": attempt, "lines": TAIL_LINES}
            plan = await ask("logs", "logs/tails", where | {"line_chars": MAX_LINE_CHARS})
            for row in plan["workers"]:
                shown = int(row["shown"])
                size = int(row["size"]) + TAIL_LINE_OVERHEAD * shown
                if size > budget:
                    facts.tails_left_out.append((run, attempt, row["worker"]))
                    continue
                budget -= size
                plan = TailPlan(run, attempt, row["worker"], int(row["total"]), shown, size)
                facts.tails.append(plan)

    async def _tail(self, ask: Asker, plan: TailPlan) -> Tail:
        where = {"run": plan.run, "attempt": plan.attempt, "lines": TAIL_LINES}
        found = await ask("logs", f"logs/tails/{plan.worker}", where)
        rows = found["lines"]
        lines = [(datetime.fromisoformat(r["at"]), r["stream"], r["line"]) for r in rows]
        return Tail(plan.run, plan.attempt, plan.worker, plan.total, lines)

    async def _fill(self, archive: Archive, facts: Facts, ask: Asker) -> None:
        """Every member, the summary first; big ones written off the event loop."""
        state, events = facts.state, facts.events
        task = task_view(state, events, is_creator=False, secrets={})
        task["spec"] = bundle_spec(state.spec)
        found = facts.first_error
        members: list[tuple[Callable[..., None], str, Any]] = [
            (archive.text, "summary.md", summary_markdown(facts)),
            (archive.json, "task.json", task),
            (archive.json, "spec.json", bundle_spec(state.spec)),
            (archive.json, "first-error.json", found if found else {"found": False}),
            (archive.text, "ft-log.txt", ft_log_text(facts.ft_log)),
            (archive.json, "env-check.json", env_check_records(events)),
            (archive.text, "slowdowns.txt", slowdown_lines(events)),
        ]
        for write, name, value in members:
            await asyncio.to_thread(write, name, value)
        await self._stack_reports(archive, facts, ask)
        await asyncio.to_thread(archive.json, "platform.json", facts.platform)
        await self._events(archive, events)
        for plan in facts.tails:  # one at a time: only one tail is in memory
            tail = await self._tail(ask, plan)
            await asyncio.to_thread(archive.text, tail.name, tail.text(archive.secrets))

    async def _stack_reports(self, archive: Archive, facts: Facts, ask: Asker) -> None:
        for row in facts.reports:
            report = await ask("faulttolerance", f"stacks/{quote(row['report_id'], safe='')}")
            body = json.dumps(report)
            if len(body) > MAX_REPORT_BYTES:
                report = {
                    "report_id": row["report_id"],
                    "summary": row["summary"],
                    "left_out": f"the report is over {MAX_REPORT_BYTES // 1024} KiB: read it "
                    f"with GET /v1/tasks/{facts.state.task_id}/stacks/{row['report_id']}",
                }
            await asyncio.to_thread(archive.json, f"stacks/{row['report_id']}.json", report)

    async def _events(self, archive: Archive, events: Sequence[RecordedEvent[Event]]) -> None:
        member = await asyncio.to_thread(archive.open, "events.jsonl")
        try:
            for start in range(0, len(events), EVENT_BATCH):
                batch = [event_record(e) for e in events[start : start + EVENT_BATCH]]
                await asyncio.to_thread(archive.write_lines, member, batch)
        finally:
            await asyncio.to_thread(member.close)


def _runyard_version() -> str:
    """The version of the whole platform (the `runyard` distribution), else the gateway's."""
    try:
        return metadata.version("runyard")
    except metadata.PackageNotFoundError:  # pragma: no cover - the gateway installed alone
        return metadata.version("runyard-gateway")


# --- HTTP ---------------------------------------------------------------------------


def bundle_router(gateway: Gateway, owners: Owners) -> APIRouter:
    """`GET /v1/tasks/{id}/bundle` over `gateway`, the owners' parts through `owners`."""
    api = BundleApi(gateway, owners)
    router = APIRouter(tags=["tasks"], route_class=AnswerRoute)

    @router.get(
        "/v1/tasks/{task_id}/bundle",
        response_class=StreamingResponse,
        responses={
            **refusals(404),
            200: {
                "content": {MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
                "description": "the bundle (a zip archive)",
            },
            422: {
                "model": wire.Error,
                "description": "bundle.too_large or bundle.secret_found: nothing written",
            },
        },
    )
    async def task_bundle(
        request: HttpRequest,
        caller: Annotated[Principal, caller_dependency(gateway)],
        task_id: str,
    ) -> StreamingResponse:
        """The task's support bundle: summary, spec, events, FT log, log tails (R-70)."""
        token = bearer_token(request.headers.get("authorization"))
        bundle = await api.write(caller, task_id, token)
        headers = {
            "Content-Disposition": f'attachment; filename="{bundle.filename}"',
            "Content-Length": str(bundle.size),
        }
        return StreamingResponse(bundle.chunks(), media_type=MEDIA_TYPE, headers=headers)

    return router


__all__ = [
    "MAX_BUNDLE_BYTES",
    "Bundle",
    "BundleApi",
    "BundleRefused",
    "Secrets",
    "bundle_router",
    "escape_controls",
    "summary_markdown",
]
