"""What a chaos scenario checks once its tasks have flowed through a fault.

Every task runs `worker_command(n)`: a start line with the time it started,
`n` numbered lines 0.2 s apart, and last the time it is about to exit
(`date +%s.%N`). That makes each promise of the platform countable from what
it stored:

- lost: a task that is not terminal, or whose successful attempt misses an
  output line in the log store;
- doubled: an attempt whose workers started twice (two `WorkerStarted`, or
  two start lines), a run with more attempts than its restarts, requeues and
  reschedules allow, or an output line stored twice;
- failed by the platform: any end but `succeeded` (every command exits 0);
- late exits: a `WorkerExited` recorded more than a second from the time the
  worker printed just before it exited;
- unrecorded exits: a worker that started and has no `WorkerExited`;
- processes left: a worker process of the scenario (found by the CHAOS_RUN
  variable in its environment) alive once every task is terminal, or a broker
  of the scenario alive once the platform stopped;
- read models: the task list and the scheduler's pool views, each compared
  with a rebuild from the event log.

`stall_s` is the longest time between two placements or exits (by the time
the store recorded them): how long the flow stood still around the fault.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from runyard.contracts import RecordedEvent, default_mapper
from runyard.contracts.task_events import TaskSucceeded, WorkerExited, WorkerStarted
from runyard.domain import TERMINAL_STATUSES, fold
from runyard.eventstore import EVENT_COLUMNS, PostgresEventStore

#: Events that allow one more attempt of the same run.
ANOTHER_ATTEMPT = ("TaskRestartScheduled", "TaskRequeued", "TaskRescheduleRequested")
TERMINAL_EVENTS = ("TaskSucceeded", "TaskFailed", "TaskStopped", "TaskMarkedAbnormal")
PROGRESS_EVENTS = ("TaskPlaced", "WorkerExited")
START = "chaos start "
_TIME = re.compile(r"^\d{9,}\.\d+$")
#: How far a recorded exit may be from the time the worker printed last.
EXIT_TOLERANCE_S = 1.0


def worker_command(lines: int) -> str:
    """A start line, `lines` numbered lines 0.2 s apart, then the exit time."""
    return (
        f'echo "{START}$(date +%s.%N)"; '
        f'for i in $(seq 1 {lines}); do echo "chaos line $i"; sleep 0.2; done; '
        "date +%s.%N"
    )


def expected_lines(lines: int) -> list[str]:
    """The numbered lines every complete worker prints (besides its start and exit time)."""
    return [f"chaos line {i}" for i in range(1, lines + 1)]


# -- processes ----------------------------------------------------------------------


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone, a kernel thread, or not ours to read
        return b""


def processes_matching(*, cmdline: str | None = None, environ: str | None = None) -> list[int]:
    """Pids of live processes whose command line contains `cmdline` and whose
    environment has the entry `environ` (NAME=value); zombies do not count."""
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        stat = _read(f"/proc/{entry}/stat").decode(errors="replace")
        if not stat or stat.rpartition(")")[2].split()[0] == "Z":
            continue
        if cmdline is not None:
            words = _read(f"/proc/{entry}/cmdline").replace(b"\0", b" ").decode(errors="replace")
            if cmdline not in words:
                continue
        if environ is not None:
            entries = _read(f"/proc/{entry}/environ").split(b"\0")
            if environ.encode() not in entries:
                continue
        found.append(int(entry))
    return found


# -- the report ------------------------------------------------------------------------


@dataclass
class ChaosReport:
    scenario: str
    tasks: int
    lost: dict[str, str] = field(default_factory=dict)
    doubled: dict[str, str] = field(default_factory=dict)
    failed_by_platform: dict[str, str] = field(default_factory=dict)
    late_exits: dict[str, str] = field(default_factory=dict)
    unrecorded_exits: dict[str, str] = field(default_factory=dict)
    processes_left: list[str] = field(default_factory=list)
    #: Finished deployments whose output files the deployer still keeps (a line of
    #: them not confirmed stored by the log service).
    outputs_left: list[str] = field(default_factory=list)
    read_models: list[str] = field(default_factory=list)
    #: Alerts not sent exactly once.
    alerts: list[str] = field(default_factory=list)
    #: Tasks that did not end (also counted as lost).
    still_open: set[str] = field(default_factory=set)
    stall_s: float = 0.0

    def summary(self) -> str:
        return (
            f"chaos {self.scenario}: tasks={self.tasks} lost={len(self.lost)}"
            f" doubled={len(self.doubled)} failed_by_platform={len(self.failed_by_platform)}"
            f" stall_s={self.stall_s:.1f}"
        )

    def problems(self) -> list[str]:
        """One paragraph per broken promise, with up to 5 examples each."""
        found = []
        for title, cases in (
            ("lost (not terminal, or output lines missing)", self.lost),
            ("doubled (ran twice, or output stored twice)", self.doubled),
            ("failed by the platform", self.failed_by_platform),
            (
                f"exit recorded more than {EXIT_TOLERANCE_S:.0f} s from the real one",
                self.late_exits,
            ),
            ("worker started and no exit recorded", self.unrecorded_exits),
        ):
            if cases:
                examples = "\n".join(f"  {task}: {why}" for task, why in list(cases.items())[:5])
                found.append(f"{len(cases)} task(s) {title}, e.g.\n{examples}")
        if self.processes_left:
            found.append("processes left:\n" + "\n".join(f"  {p}" for p in self.processes_left))
        if self.outputs_left:
            found.append(
                f"output files of {len(self.outputs_left)} finished deployment(s) still kept,"
                f" e.g. {self.outputs_left[:5]}"
            )
        found += [f"read model differs from its rebuild: {m}" for m in self.read_models]
        found += self.alerts
        if self.still_open:
            found.append("read models not compared with a rebuild: tasks are still open")
        return found

    def assert_clean(self) -> None:
        problems = self.problems()
        assert not problems, self.summary() + "\n" + "\n".join(problems)


# -- reading what the platform stored ----------------------------------------------------


async def analyse(scenario: str, dsn: str, task_ids: list[str], lines: int) -> ChaosReport:
    """Check every task of the scenario against the log and the log store."""
    report = ChaosReport(scenario, len(task_ids))
    store = await PostgresEventStore.connect(dsn, default_mapper())
    try:
        streams = [f"task-{t}" for t in task_ids]
        rows = await store.pool.fetch(
            f"SELECT {EVENT_COLUMNS}"
            " FROM events WHERE stream_id = ANY($1) ORDER BY stream_id, stream_version",
            streams,
        )
        events: dict[str, list[RecordedEvent[Any]]] = defaultdict(list)
        for row in rows:
            events[row["stream_id"].removeprefix("task-")].append(store.decode(row))
        output = await _output(store.pool, task_ids)
        for task_id in task_ids:
            _check_task(report, task_id, events[task_id], output.get(task_id, {}), lines)
        report.stall_s = await _stall(store.pool, streams)
    finally:
        await store.close()
    return report


Worker = tuple[int, int, int]  # run, attempt, worker


async def _output(pool: asyncpg.Pool, task_ids: list[str]) -> dict[str, dict[Worker, Counter[str]]]:
    rows = await pool.fetch(
        "SELECT task_id, run, attempt, worker, line FROM log_lines"
        " WHERE task_id = ANY($1) AND stream = 'stdout'",
        task_ids,
    )
    output: dict[str, dict[Worker, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    for row in rows:
        output[row["task_id"]][(row["run"], row["attempt"], row["worker"])][row["line"]] += 1
    return output


def _check_task(
    report: ChaosReport,
    task_id: str,
    events: list[RecordedEvent[Any]],
    output: dict[Worker, Counter[str]],
    lines: int,
) -> None:
    if not events:
        report.lost[task_id] = "no events at all"
        report.still_open.add(task_id)
        return
    state = fold(events, task_id=task_id)
    if state.status not in TERMINAL_STATUSES:
        report.still_open.add(task_id)
        report.lost[task_id] = f"still {state.status} ({_types(events[-4:])})"
    elif state.status != "succeeded":
        report.failed_by_platform[task_id] = (
            f"{state.status}: {state.last_failure_reason!r} ({_types(events[-4:])})"
        )
    started = Counter(
        (e.event.run, e.event.attempt, e.event.worker)
        for e in events
        if isinstance(e.event, WorkerStarted)
    )
    exits = {
        (e.event.run, e.event.attempt, e.event.worker): e
        for e in events
        if isinstance(e.event, WorkerExited)
    }
    check_doubled(report, task_id, events, started, output)
    missing = sorted(set(started) - set(exits))
    if missing:
        report.unrecorded_exits[task_id] = f"workers (run, attempt, worker) {missing}"
    done = [e.event for e in events if isinstance(e.event, TaskSucceeded)]
    if done:
        final = [w for w in started if w[:2] == (done[-1].run, done[-1].attempt)]
        check_output(report, task_id, final, output, exits, lines)


def check_doubled(
    report: ChaosReport,
    task_id: str,
    events: list[RecordedEvent[Any]],
    started: Counter[Worker],
    output: dict[Worker, Counter[str]],
) -> None:
    twice = sorted(w for w, n in started.items() if n > 1)
    if twice:
        report.doubled[task_id] = f"WorkerStarted twice for (run, attempt, worker) {twice}"
        return
    for worker, counts in sorted(output.items()):
        starts = sum(n for line, n in counts.items() if line.startswith(START))
        if starts > 1:
            report.doubled[task_id] = f"worker {worker} ran {starts} times (start lines)"
            return
        stored_twice = sorted(line for line, n in counts.items() if n > 1)
        if stored_twice:
            report.doubled[task_id] = f"worker {worker} has lines stored twice: {stored_twice[:3]}"
            return
    runs = {e.event.run for e in events if hasattr(e.event, "run")}
    for run in sorted(runs):
        attempts = {a for (r, a, _w) in started if r == run}
        allowed = 1 + sum(1 for e in events if e.type in ANOTHER_ATTEMPT and e.event.run == run)
        if len(attempts) > allowed:
            report.doubled[task_id] = (
                f"run {run} started attempts {sorted(attempts)}, its restarts, requeues and"
                f" reschedules allow {allowed}"
            )
            return


def check_output(
    report: ChaosReport,
    task_id: str,
    workers: Iterable[Worker],
    output: dict[Worker, Counter[str]],
    exits: dict[Worker, RecordedEvent[Any]],
    lines: int,
) -> None:
    for worker in sorted(workers):
        counts = output.get(worker, Counter())
        missing = [line for line in expected_lines(lines) if not counts[line]]
        if not any(line.startswith(START) for line in counts):
            missing.insert(0, START.strip())
        exit_times = [float(line) for line in counts if _TIME.match(line)]
        if not exit_times:
            missing.append("the exit time")
        if missing:
            report.lost[task_id] = (
                f"worker {worker} stored no {missing[:4]} ({len(missing)} missing)"
            )
            return
        exited = exits.get(worker)
        if exited is None:
            continue  # counted as unrecorded
        recorded = exited.occurred_at.timestamp()
        printed = max(exit_times)  # the last run's, should a worker have run twice
        if abs(recorded - printed) > EXIT_TOLERANCE_S:
            report.late_exits[task_id] = (
                f"worker {worker} printed {printed:.3f} last; WorkerExited says"
                f" {recorded:.3f} ({recorded - printed:+.1f} s), exit code"
                f" {exited.event.exit_code}, recorded by {exited.metadata.actor}"
            )


async def _stall(pool: asyncpg.Pool, streams: list[str]) -> float:
    times = await pool.fetch(
        "SELECT recorded_at FROM events WHERE stream_id = ANY($1) AND event_type = ANY($2)"
        " ORDER BY recorded_at",
        streams,
        list(PROGRESS_EVENTS),
    )
    at = [row["recorded_at"] for row in times]
    return max(((b - a).total_seconds() for a, b in itertools.pairwise(at)), default=0.0)


def _types(events: Iterable[RecordedEvent[Any]]) -> str:
    """Event types, with the deploy stage or worker each names: where a task stopped."""
    named = []
    for e in events:
        detail = getattr(e.event, "stage", None)
        if detail is None and isinstance(e.event, WorkerStarted | WorkerExited):
            detail = f"worker {e.event.worker}"
        named.append(f"{e.type}({detail})" if detail is not None else e.type)
    return ", ".join(named)


# -- read models ---------------------------------------------------------------------------


async def read_model_mismatches(dsn: str, config_dir: Path) -> list[str]:
    """Each read model, as the stopped platform left it, against a rebuild from the log.

    Call it with the platform stopped: the task list is rebuilt in place.
    """
    from runyard.gateway.projection import TaskListProjector, all_rows
    from runyard.scheduler.app import SchedulerApp
    from runyard.scheduler.config import load_pools_file

    found: list[str] = []
    store = await PostgresEventStore.connect(dsn, default_mapper())
    try:
        live = await all_rows(store.pool)
        await TaskListProjector(store).rebuild()
        found += _differences(
            "task_list", _by(live, "task_id"), _by(await all_rows(store.pool), "task_id")
        )

        pools = load_pools_file(config_dir / "pools.yaml")
        stored = {
            r["pool_id"]: _without_time(json.loads(r["view"]))
            for r in await store.pool.fetch(
                "SELECT pool_id, view::text AS view FROM scheduler_pool_views"
            )
        }
        queued = {
            r["task_id"]: tuple(r.values())
            for r in await store.pool.fetch(f"SELECT {_QUEUE_COLUMNS} FROM scheduler_queue")
        }
        scheduler = SchedulerApp(store, pools, write_views=False)
        await scheduler.start()
        rebuilt = {
            p: _without_time(json.loads(json.dumps(scheduler.view(p), default=str))) for p in stored
        }
        found += _differences("scheduler_pool_views", stored, rebuilt)
        rows = [astuple(row) for p in scheduler.pools for row in scheduler.queue_rows(p)]
        found += _differences("scheduler_queue", queued, {row[0]: row for row in rows})
    finally:
        await store.close()
    return found


#: `scheduler_queue`'s columns but `updated_at`, in the order of `QueueRow`'s fields.
_QUEUE_COLUMNS = (
    "task_id, pool_id, run, rank, neg_priority, submitted_at, queued_at, why, blocked,"
    " gpus_needed, launchable"
)


def _by(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return {row[key]: row for row in rows}


def _without_time(view: dict[str, Any]) -> dict[str, Any]:
    """A pool view without `as_of` (when it was written, not what it says)."""
    return {k: v for k, v in view.items() if k != "as_of"}


def _differences(name: str, live: dict[str, Any], rebuilt: dict[str, Any]) -> list[str]:
    keys = sorted(set(live) | set(rebuilt))
    differing = [k for k in keys if live.get(k) != rebuilt.get(k)]
    if not differing:
        return []
    first = differing[0]
    return [
        f"{name}: {len(differing)} of {len(keys)} rows differ; e.g. {first!r}:"
        f" {_what_differs(live.get(first), rebuilt.get(first))}"
    ]


def _what_differs(live: Any, rebuilt: Any, limit: int = 300) -> str:
    """The fields of a row that differ (a whole row when one side has none)."""
    if isinstance(live, dict) and isinstance(rebuilt, dict):
        fields = sorted(k for k in set(live) | set(rebuilt) if live.get(k) != rebuilt.get(k))
        pairs = {k: (live.get(k), rebuilt.get(k)) for k in fields}
        return f"(live, rebuilt) by field: {pairs}"[:limit]
    return f"live {live}"[:limit] + f"; rebuilt {rebuilt}"[:limit]
