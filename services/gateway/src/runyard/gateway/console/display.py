"""How the console shows values: pure functions of the API's answers, no I/O.

Ages and durations in words, the deploy-stage chart's geometry (drawn as SVG
attributes, so the strict Content-Security-Policy needs no inline style), and
log lines with the searched text marked (escaped first: a worker's output is
never HTML).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import re2
from markupsafe import Markup, escape

#: Where the chart's bars start (after the stage names) and how wide they may grow.
CHART_LABEL_W = 150
CHART_BARS_W = 450
CHART_ROW_H = 24


def duration(ms: float | None) -> str:
    """`1.2 s`, `3 m 04 s`, `2 h 05 m`; an em dash for no value."""
    if ms is None:
        return "—"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} m {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} m"


def when(at: str | datetime | None) -> Markup | str:
    """A time as every page shows it: `2026-12-06 04:32:40 UTC` (to the second, in
    UTC) in a `<time>` element whose `datetime` and title keep the exact value; an em
    dash for no value, and text that is not a time as it is (escaped)."""
    if at is None or at == "":
        return "—"
    try:
        moment = at if isinstance(at, datetime) else datetime.fromisoformat(str(at))
    except ValueError:
        return str(at)
    exact = moment.isoformat() if isinstance(at, datetime) else str(at)
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    shown = moment.strftime("%Y-%m-%d %H:%M:%S") + " UTC"
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(exact, shown)


def age(at: str | None, now: datetime) -> str:
    """How long ago an ISO time was, in the largest whole unit (`42 s`, `5 m`, `3 d`)."""
    if not at:
        return "—"
    seconds = max(0, int((now - datetime.fromisoformat(at)).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


@dataclass(frozen=True, slots=True)
class StageBar:
    """One stage of the chart: where its bar starts and how long it is, in chart units."""

    label: str
    result: str
    x: float
    width: float
    y: int
    took: str


def stage_chart(stages: Sequence[Mapping[str, Any]], now: datetime) -> list[StageBar]:
    """The deploy stages of the task's last run and attempt as bars on one time axis
    (a stage still running ends now), so the longest wait is the longest bar."""
    if not stages:
        return []
    last = (stages[-1]["run"], stages[-1]["attempt"])
    shown = [s for s in stages if (s["run"], s["attempt"]) == last]
    start = min(datetime.fromisoformat(s["started_at"]) for s in shown)
    spans = []
    for stage in shown:
        began = (datetime.fromisoformat(stage["started_at"]) - start).total_seconds()
        ended = stage["finished_at"]
        end_at = datetime.fromisoformat(ended) if ended else now
        spans.append((stage, began, max(0.0, (end_at - start).total_seconds())))
    total = max(end for _, _, end in spans) or 1.0
    bars = []
    for row, (stage, began, end) in enumerate(spans):
        ms = stage["duration_ms"]
        if ms is None:
            ms = (end - began) * 1000
        bars.append(
            StageBar(
                label=stage["stage"],
                result=stage["result"],
                x=CHART_LABEL_W + began / total * CHART_BARS_W,
                width=max(2.0, (end - began) / total * CHART_BARS_W),
                y=row * CHART_ROW_H,
                took=duration(ms),
            )
        )
    return bars


def search_pattern(mode: str, text: str, ignore_case: bool = False) -> Any:
    """What to mark in the lines a log search found (RE2: a user's regular expression
    runs in linear time): its words (any case), its phrase, or its regular expression
    when RE2 reads it as Postgres did; None when there is nothing to mark."""
    if not text.strip():
        return None
    if mode == "words":
        words = [re2.escape(w) for w in re.split(r"\W+", text) if w]
        return _compile("(?i)" + "|".join(words)) if words else None
    flags = "(?i)" if ignore_case else ""
    if mode == "phrase":
        return _compile(flags + re2.escape(text))
    return _compile(flags + text)


def _compile(pattern: str) -> Any:
    options = re2.Options()
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error:
        return None  # Postgres accepted it, RE2 reads it otherwise: shown unmarked


def marked(line: str, pattern: Any) -> Markup:
    """The line, escaped, with each match in `<mark>`."""
    if pattern is None:
        return escape(line)
    out, at = [], 0
    for match in pattern.finditer(line):
        if match.end() == match.start():
            continue
        out.append(escape(line[at : match.start()]))
        out.append(Markup("<mark>%s</mark>") % line[match.start() : match.end()])
        at = match.end()
    out.append(escape(line[at:]))
    return Markup("").join(out)


def runs(
    stages: Sequence[Mapping[str, Any]],
    reruns: Sequence[Mapping[str, Any]],
    current: int,
    status: str,
) -> list[dict[str, Any]]:
    """One row per run of the task, newest first: its attempts, when its first stage
    began and its last ended, what its rerun changed, and (the current run) the
    task's status; earlier runs ended before the rerun that followed them. `reruns`:
    the `TaskRerunRequested` events' data (run, spec, the names of the fields changed)."""
    changes = {int(r["data"].get("run", 0)): _changed(r["data"]) for r in reruns}
    rows: dict[int, dict[str, Any]] = {
        n: {"run": n, "attempts": 0, "started_at": None, "ended_at": None, "changes": {}}
        for n in range(1, current + 1)
    }
    for stage in stages:
        row = rows.setdefault(
            stage["run"],
            {"run": stage["run"], "attempts": 0, "started_at": None, "ended_at": None},
        )
        row["attempts"] = max(row["attempts"], stage["attempt"])
        if row["started_at"] is None or stage["started_at"] < row["started_at"]:
            row["started_at"] = stage["started_at"]
        if stage["finished_at"] and (row["ended_at"] or "") < stage["finished_at"]:
            row["ended_at"] = stage["finished_at"]
    for n, row in rows.items():
        row["changes"] = changes.get(n, {})
        row["status"] = status if n == current else "ended"
    return [rows[n] for n in sorted(rows, reverse=True)]


def _changed(rerun: Mapping[str, Any]) -> dict[str, Any]:
    """A rerun's changed fields (`changes` names them) with their new values."""
    spec = rerun.get("spec") or {}
    return {name: spec.get(name) for name in rerun.get("changes") or ()}


def env_text(env: Sequence[Mapping[str, Any]]) -> tuple[str, list[str]]:
    """The submit form's `A=x;B=y` of a spec's variables, creator-only ones left out,
    and the names of those left out (their values are asked for again)."""
    shown = [f"{v['name']}={v.get('value') or ''}" for v in env if not v.get("creator_only")]
    hidden = [str(v["name"]) for v in env if v.get("creator_only")]
    return ";".join(shown), hidden


def node_cell(node: Mapping[str, Any], readable: Callable[[str | None], bool]) -> dict[str, Any]:
    """A node of the pool grid: its health and one cell per GPU, free or held; a held
    GPU names its task only when `readable(task)` (else: another tenant's)."""
    owners = list(node.get("owners") or [None] * int(node.get("gpus") or 0))
    gpus = [
        {"index": i, "task_id": owner if readable(owner) else None, "used": owner is not None}
        for i, owner in enumerate(owners)
    ]
    return {
        "node": node["node"],
        "health": node.get("health", "healthy"),
        "fault": node.get("fault"),
        "free": node.get("free", sum(1 for g in gpus if not g["used"])),
        "total": len(gpus),
        "gpus": gpus,
    }


def spec_launchable(raw: Mapping[str, Any], cap: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Workers launchable now per spec: from the scheduler's view (its specs carry the
    count), else the pool's size (config only: nothing is known to be in use)."""
    specs = raw.get("specs")
    counts = cap.get("launchable") or {}
    if isinstance(specs, list):
        return [
            {
                "spec": s.get("name"),
                "gpus": s.get("gpus"),
                "launchable": s.get("launchable", counts.get(s.get("name"))),
            }
            for s in specs
            if isinstance(s, Mapping)
        ]
    gpus = specs if isinstance(specs, Mapping) else {}
    return [{"spec": k, "gpus": gpus.get(k), "launchable": v} for k, v in counts.items()]
