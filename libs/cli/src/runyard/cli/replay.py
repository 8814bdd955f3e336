"""SRE replay on the command line (R-61): tasks and pools as they were at a point.

    runyard show ID --at POINT [--json]
    runyard diff ID --from A --to B [--json]
    runyard pools --at POINT [--pool ID] [--json]

A POINT is a global position of the event log (`1234`: the `position` of an
event in `runyard events ID --json`), an ISO 8601 time with a zone
(`2026-12-01T10:00:00Z`, `2026-12-01T18:00:00+08:00`), or a time that long ago
(`30m`, `1h`, `2d`). The answer is a fold of
the stream's events up to that point, nothing else: what `runyard show` would
have printed then, with the workers' placement.
`show` and `pools` register `--at` in `runyard.cli.main` and call here.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from runyard.cli.main import (
    JsonOpt,
    TokenOpt,
    UrlOpt,
    app,
    call,
    given,
    out,
    print_task,
    segment,
    show_json,
    table,
)
from runyard.cli.terminal import markup
from runyard.cli.when import replay_point

POINT_HELP = (
    "A global position of the event log (e.g. 1234, the `position` of "
    "`runyard events ID --json`), an ISO 8601 time (2026-12-01T10:00:00Z; UTC without "
    "a zone), now, or that long ago (30m, 1h, 2d)."
)


def as_of_line(as_of: dict[str, Any]) -> str:
    """`as of position P (event V of N: TYPE at T)` for a prefix's end."""
    return (
        f"as of position {markup(as_of['position'])} (event {markup(as_of['version'])}"
        f" of {markup(as_of['stream_events'])}: {markup(as_of['last_event'])}"
        f" at {markup(as_of['occurred_at'])}); asked: {markup(as_of['point'])}"
    )


def show_at(task_id: str, at: str, url: str | None, token: str | None, as_json: bool) -> None:
    """`runyard show ID --at POINT`: the task as a fold of its stream up to POINT."""
    params = {"at": replay_point(at)}
    answer = call(url, token, "GET", f"/v1/tasks/{segment(task_id)}/replay", params=params)
    if as_json:
        return show_json(answer)
    out.print(as_of_line(answer["as_of"]))
    task = answer["task"]
    print_task(task)
    if task.get("stage"):
        out.print(f"stage in progress: {markup(task['stage'])}")
    print_placement(task.get("placement"))


def print_placement(placement: dict[str, Any] | None) -> None:
    if placement is None:
        out.print("placement: none")
        return
    table(
        f"placement: pool {placement['pool']}, run {placement['run']},"
        f" attempt {placement['attempt']}",
        ["worker", "node", "gpus", "started", "exit code"],
        [
            [
                w["worker"],
                w["node"],
                ",".join(str(g) for g in w["gpus"]),
                "yes" if w["started"] else "no",
                "-" if w["exit_code"] is None else w["exit_code"],
            ]
            for w in placement["workers"]
        ],
    )


#: How `diff` shows a value that one of the two points does not have (or has as null).
UNSET = "(unset)"


def _value(value: Any) -> str:
    if value is None:
        return UNSET
    return value if isinstance(value, str) else json.dumps(value)


@app.command()
def diff(
    task_id: str,
    start: Annotated[str, typer.Option("--from", help="The earlier point. " + POINT_HELP)],
    end: Annotated[str, typer.Option("--to", help="The later point. " + POINT_HELP)],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """What changed in a task between two points of the log, and the events between.

    Every field of `runyard show` whose value differs (status, stage, attempt,
    counters, placement, stages, ...), then the events in between. A value one
    point does not have is shown as `(unset)`; `--json` prints the answer as the
    API gives it (null there).

    Example, during an incident: `runyard diff ID --from 2026-12-01T10:00:00Z
    --to 2026-12-01T10:05:00Z`; on a pipe both tables are tab-separated lines
    (`| grep counters`).
    """
    params = {"from": replay_point(start), "to": replay_point(end)}
    answer = call(url, token, "GET", f"/v1/tasks/{segment(task_id)}/replay/diff", params=params)
    if as_json:
        return show_json(answer)
    out.print(f"from {as_of_line(answer['from'])}")
    out.print(f"to   {as_of_line(answer['to'])}")
    table(
        f"changes of {task_id}",
        ["field", "from", "to"],
        [[c["field"], _value(c["from"]), _value(c["to"])] for c in answer["changes"]],
    )
    table(
        f"events in between ({answer['events_between']})",
        ["#", "position", "time", "type", "actor"],
        [
            [e["version"], e["position"], e["occurred_at"], e["type"], e["actor"]]
            for e in answer["events"]
        ],
    )
    if answer["truncated"]:
        out.print(f"(first {len(answer['events'])} events shown; `runyard events` lists all)")


def pools_at(at: str, pool: str | None, url: str | None, token: str | None, as_json: bool) -> None:
    """`runyard pools --at POINT`: each pool as a fold of its stream up to POINT."""
    params = given(at=replay_point(at), pool=pool)
    answer = call(url, token, "GET", "/v1/pools/replay", params=params)
    if as_json:
        return show_json(answer)
    for view in answer["pools"]:
        print_pool(view)
    if answer["absent"]:
        out.print(f"no events yet then: {markup(', '.join(answer['absent']))}")


def print_pool(view: dict[str, Any]) -> None:
    cap, health = view["capacity"], view["health"]
    out.print(
        f"[bold]{markup(view['pool_id'])}[/bold]  {as_of_line(view['as_of'])}\n"
        f"nodes {cap['nodes']} (healthy {health['healthy']}, faulty {health['faulty']},"
        f" cordoned {health['cordoned']}); free GPUs {cap['free_gpus']}"
        f" of {cap['schedulable_gpus']} schedulable"
    )
    table(
        f"nodes of {view['pool_id']}",
        ["node", "health", "gpus", "free", "held by", "fault"],
        [
            [
                n["node"],
                n["health"],
                n["gpus"],
                n["free"],
                ", ".join(dict.fromkeys(o for o in n["owners"] if o)),
                n["fault"] or "",
            ]
            for n in view["nodes"]["items"]
        ],
    )
    table(
        f"allocations of {view['pool_id']}",
        ["task", "run", "attempt", "gpus", "nodes"],
        [
            [
                a["task_id"],
                a["run"],
                a["attempt"],
                a["gpus"],
                ", ".join(dict.fromkeys(w["node"] for w in a["workers"])),
            ]
            for a in view["occupancy"]["items"]
        ],
    )
