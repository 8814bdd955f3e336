"""`runyard rebuild`: a read model rebuilt from position 0 beside the live one.

    runyard rebuild task_list                  build the shadow (resumes where it stopped)
    runyard rebuild task_list --diff           ... then print how it differs from the live one
    runyard rebuild task_list --swap           ... then make its rows the live ones
    runyard rebuild task_list --restart        start again from position 0
    runyard rebuild scheduler_queue --discard  drop the shadow

Read models: `task_list` (the gateway's), `scheduler_pool_views` and
`scheduler_queue` (the scheduler's), `queue_waits` (the notification
service's). Progress goes to stderr; 0 differences is the healthy answer.
Needs the sre or platform_admin role (docs/operations.md, "Rebuilding a read
model").
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from runyard.cli.main import JsonOpt, TokenOpt, UrlOpt, app, call, err, out, show_json, table
from runyard.cli.terminal import markup

#: Each read model and the base path of its rebuild routes.
READ_MODELS = {
    "task_list": "/v1/admin/read-models/task_list",
    "scheduler_pool_views": "/v1/admin/scheduler/read-models/scheduler_pool_views",
    "scheduler_queue": "/v1/admin/scheduler/read-models/scheduler_queue",
    "queue_waits": "/v1/admin/notification/read-models/queue_waits",
}


@app.command()
def rebuild(
    name: Annotated[str, typer.Argument(help=" | ".join(READ_MODELS))],
    diff: Annotated[bool, typer.Option("--diff", help="Print the differences.")] = False,
    swap: Annotated[bool, typer.Option("--swap", help="Replace the live rows.")] = False,
    restart: Annotated[bool, typer.Option("--restart", help="Start from 0 again.")] = False,
    discard: Annotated[bool, typer.Option("--discard", help="Drop the shadow.")] = False,
    step: Annotated[int, typer.Option(help="Events per request (pools: one).")] = 50_000,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Rebuild a read model beside the live one, then compare (--diff) or swap (--swap).

    The shadow table is built from position 0 with the read model's own projection
    code; --diff compares it with the live one, --swap replaces the live one
    without stopping its service. An interrupted rebuild resumes from its shadow
    checkpoint (`runyard projections` lists it as `shadow:NAME`)."""
    base = READ_MODELS.get(name)
    if base is None:
        err.print(f"[red]error[/red]: no read model {markup(name)}")
        err.print(f"hint: one of {', '.join(READ_MODELS)}")
        raise typer.Exit(2)
    if discard:
        answer = call(url, token, "DELETE", f"{base}/rebuild")
        return show_json(answer) if as_json else out.print(f"{markup(name)}: shadow dropped")
    answer = _build(base, name, step, restart, url, token)
    if swap:
        answer = call(url, token, "POST", f"{base}/swap")
    elif diff:
        answer = call(url, token, "GET", f"{base}/diff")
    if as_json:
        return show_json(answer)
    if "tables" in answer:
        print_diff(answer, swapped=swap)
    else:
        out.print(f"{markup(name)}: {progress(answer)}; --diff to compare")


def _build(
    base: str, name: str, step: int, restart: bool, url: str | None, token: str | None
) -> Any:
    """Steps until the shadow reaches the live position, progress on stderr."""
    started, applied = time.monotonic(), 0
    params: dict[str, Any] = {"max_events": step, "restart": restart}
    while True:
        answer = call(url, token, "POST", f"{base}/rebuild", params=params)
        params["restart"] = False
        applied += answer.get("applied", 0)
        rate = applied / max(time.monotonic() - started, 1e-6)
        speed = f", {rate:,.0f} events/s" if "applied" in answer else ""
        err.print(f"rebuild {markup(name)}: {progress(answer)}{speed}")
        if answer["done"]:
            return answer


def progress(answer: dict[str, Any]) -> str:
    """How far a rebuild step got: log positions, or pools for the scheduler's read
    models (rebuilt pool by pool)."""
    done, total, unit = answer["position"], answer["target"], "position"
    if "pools" in answer:
        done, total, unit = answer["pools_done"], answer["pools"], "pools"
    return f"{unit} {done} of {total} ({100 * done // max(total, 1)}%)"


def print_diff(answer: dict[str, Any], *, swapped: bool) -> None:
    """One line per table (0 differences is healthy), then each differing row's columns."""
    for found in answer["tables"]:
        verdict = "healthy" if found["differences"] == 0 else "differs"
        done = f"; swapped: {answer['rows']} rows live" if swapped else ""
        out.print(
            f"{markup(found['table'])} at position {answer['position']}:"
            f" {found['differences']} differences ({verdict}; live {found['live_rows']} rows,"
            f" rebuilt {found['rebuilt_rows']}){done}"
        )
        rows = [
            [item["key"], item["kind"], column, _text(values["live"]), _text(values["rebuilt"])]
            for item in found["items"]
            for column, values in item["columns"].items()
        ]
        if rows:
            table(
                f"differences of {found['table']}",
                ["key", "kind", "column", "live", "rebuilt"],
                rows,
            )
        if found["truncated"]:
            out.print(f"(first {len(found['items'])} rows shown)")


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 200 else text[:197] + "..."
