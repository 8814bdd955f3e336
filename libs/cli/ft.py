"""`runyard ft-log ID` and `runyard stacks ID`: a task's fault tolerance (R-33, R-35).

    runyard ft-log ID [--json]
    runyard stacks ID [--capture] [--report REPORT_ID] [--raw] [--json]

`ft-log` prints the counts of the current run (restarts, reschedules, hangs,
slowdowns), then the fault-tolerance log lines. `stacks` prints the latest stack
report of the task (or `--report`'s), `--capture` captures one now (the task
must be running under `runyard up`); `--raw` adds every thread's full stack.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.text import Text
from runyard.cli.main import JsonOpt, TokenOpt, UrlOpt, app, call, err, out, show_json

LEVEL_STYLE = {"error": "red", "warning": "yellow", "info": "green"}


def print_ft_log(body: dict[str, Any]) -> None:
    counts = body["counts"]
    out.print(
        f"[bold]{body['task_id']}[/bold]  status={body.get('status')}  run {body['run']}: "
        f"restarts={counts['restarts']} reschedules={counts['reschedules']} "
        f"hangs={counts['hangs']} slowdowns={counts['slowdowns']}"
    )
    if not body["lines"]:
        out.print("(no fault-tolerance events)")
    for line in body["lines"]:
        attempt = f" attempt {line['attempt']}" if line.get("attempt") is not None else ""
        text = Text(f"{line['at']} [run {line['run']}{attempt}] ")
        text.append(line["level"].upper(), style=LEVEL_STYLE.get(line["level"], "white"))
        text.append(f" {line['text']}")
        out.print(text, highlight=False)


@app.command("ft-log")
def ft_log(
    task_id: str,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A task's fault-tolerance log: env check, restarts, reschedules, hangs, slowdowns."""
    body = call(url, token, "GET", f"/v1/tasks/{task_id}/ft-log")
    if as_json:
        show_json(body)
    else:
        print_ft_log(body)


def print_report(report: dict[str, Any], raw: bool) -> None:
    p = out.print
    p(
        f"[bold]stack report {report['report_id']}[/bold]  task {report['task_id']} "
        f"run {report['run']} attempt {report['attempt']}  at {report['captured_at']}"
    )
    p(f"summary: {report.get('summary') or '-'}", markup=False, highlight=False)
    odd = report.get("odd_ones_out") or []
    if odd:
        p(f"odd ones out (rarest first): workers {', '.join(str(w) for w in odd)}")
    p("[bold]innermost frame per thread, by worker[/bold]")
    for worker, frames in sorted(report.get("frames_by_worker", {}).items(), key=_by_int):
        p(f"  worker {worker}: " + ("; ".join(frames) or "-"), markup=False, highlight=False)
    functions = report.get("functions") or {}
    if functions:
        p("[bold]functions (threads, workers)[/bold]")
        ranked = sorted(functions.items(), key=lambda kv: (-int(kv[1].get("threads", 0)), kv[0]))
        for name, stats in ranked[:20]:
            workers = ", ".join(str(w) for w in stats.get("workers", []))
            p(f"  {stats.get('threads', 0):>3}  {name}  [workers {workers}]", markup=False)
    for worker, processes in sorted(report.get("workers", {}).items(), key=_by_int):
        for proc in processes:
            if proc.get("error"):
                p(f"  worker {worker} pid {proc['pid']}: {proc['error']}", markup=False)
    if raw:
        print_raw(report)


def print_raw(report: dict[str, Any]) -> None:
    for worker, processes in sorted(report.get("workers", {}).items(), key=_by_int):
        for proc in processes:
            for thread in proc.get("threads", []):
                name = thread.get("thread_name") or "-"
                out.print(
                    f"[bold]worker {worker} pid {thread['pid']} thread {thread['thread_id']}"
                    f" ({name})[/bold]"
                )
                for frame in thread.get("frames", []):
                    out.print(
                        f"    {frame['name']} ({frame['filename']}:{frame['line']})",
                        markup=False,
                        highlight=False,
                    )


def _by_int(item: tuple[str, Any]) -> int:
    try:
        return int(item[0])
    except ValueError:
        return 0


@app.command()
def stacks(
    task_id: str,
    capture: Annotated[bool, typer.Option(help="Capture the stacks now.")] = False,
    report: Annotated[str | None, typer.Option(help="Show this report id.")] = None,
    raw: Annotated[bool, typer.Option(help="Also print every thread's full stack.")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Stacks of a task's workers (py-spy): the latest report, one by id, or a new capture."""
    if capture:
        body = call(url, token, "POST", f"/v1/tasks/{task_id}/stacks")
    else:
        if report is None:
            reports = call(url, token, "GET", f"/v1/tasks/{task_id}/stacks")["reports"]
            if not reports:
                err.print(f"no stack report for task {task_id}")
                err.print("hint: `runyard stacks ID --capture` while it runs")
                raise typer.Exit(1)
            if not as_json:
                for row in reports:
                    out.print(
                        f"{row['captured_at']} {row['report_id']} run {row['run']} "
                        f"attempt {row['attempt']}: {row['summary']}",
                        markup=False,
                        highlight=False,
                    )
                out.print()
            report = reports[-1]["report_id"]
        body = call(url, token, "GET", f"/v1/tasks/{task_id}/stacks/{report}")
    if as_json:
        show_json(body)
    else:
        print_report(body, raw)
