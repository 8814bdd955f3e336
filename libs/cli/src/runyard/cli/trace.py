"""`runyard trace`: the causation view of a task or an event, as a tree.

    runyard trace TASK_ID           every chain of reactions the task's events belong to
    runyard trace EVENT_ID          the chain of one event (an `event_id` of `runyard events`)
    runyard trace ID --json         the API's JSON (GET /v1/tasks/{id}/trace or
                                    GET /v1/events/{id}/trace)

Each event is printed under the event that caused it, with its stream, position,
actor and the OpenTelemetry trace id of the span that wrote it (open it in a trace
viewer). An id is tried as a task first, then as an event; `--event` asks for the
event directly.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from runyard.cli.main import JsonOpt, TokenOpt, UrlOpt, app, call, gateway, out, segment, show_json
from runyard.cli.terminal import markup
from runyard.client import NotFound

#: Deeper events are printed at this indentation, their depth written out.
MAX_INDENT = 24


@app.command()
def trace(
    ref: Annotated[str, typer.Argument(metavar="TASK_OR_EVENT_ID")],
    event: Annotated[bool, typer.Option("--event", help="ID is an event id.")] = False,
    limit: Annotated[
        int | None, typer.Option(help="The most events collected (at most 500).")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The chain of events by cause, across tasks and pools, as a tree with trace ids.

    Events are linked by causation and correlation ids (a placement and the
    allocation it caused, a node fault and every reschedule it caused); each
    shows its OpenTelemetry trace id.

    Events about another tenant's task show as `(another tenant)` unless your role
    is sre or platform_admin.
    """
    params = {"limit": limit} if limit is not None else {}
    event_path = f"/v1/events/{segment(ref)}/trace"
    if event:
        answer = call(url, token, "GET", event_path, params=params)
    else:
        answer = _task_or_event(url, token, ref, event_path, params)
    if as_json:
        return show_json(answer)
    print_trace(answer)


def _task_or_event(
    url: str | None, token: str | None, ref: str, event_path: str, params: dict[str, Any]
) -> Any:
    """The task's trace; on a 404 for no task, the event's (task and event ids look alike)."""
    with gateway(url, token) as api:
        try:
            return api.request("GET", f"/v1/tasks/{segment(ref)}/trace", params=params)
        except NotFound as no_task:
            try:
                return api.request("GET", event_path, params=params)
            except NotFound:
                raise no_task from None


def print_trace(answer: dict[str, Any]) -> None:
    """Header (what was traced, chains, trace ids), then one line per event, indented."""
    of = answer["of"]
    what = f"task {of['task_id']}" if "task_id" in of else f"event {of['event_id']}"
    chains = answer["correlation_ids"]
    out.print(
        f"[bold]trace of {markup(what)}[/bold]: {answer['events']} events,"
        f" {len(chains)} chain(s): {markup(', '.join(chains))}"
    )
    if answer["trace_ids"]:
        out.print(f"trace ids (open in a trace viewer): {markup(', '.join(answer['trace_ids']))}")
    for node in answer["tree"]:
        out.print(tree_line(node))
    if answer["truncated"]:
        out.print(
            f"(truncated at {answer['limit']} events, oldest first: trace a later event"
            " of the chain, or use `runyard audit` for the whole log)"
        )


def tree_line(node: dict[str, Any]) -> str:
    """`  └ TYPE  stream vN @position  actor  time  [trace id]` for one event."""
    depth = node["depth"]
    indent = "  " * min(depth, MAX_INDENT) + ("└ " if depth else "")
    deeper = f"(depth {depth}) " if depth > MAX_INDENT else ""
    trace_id = f"  trace {node['trace_id']}" if node["trace_id"] else ""
    cause = "" if depth else f"  caused by {node['causation_id'] or '-'}"
    return markup(
        f"{indent}{deeper}{node['type']}  {node['stream_id']} v{node['version']}"
        f" @{node['position']}  {node['actor']}  {node['occurred_at']}{trace_id}{cause}"
    )
