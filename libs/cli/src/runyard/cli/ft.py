"""`runyard ft-log ID` and `runyard stacks ID`: a task's fault tolerance (R-33, R-35).

    runyard ft-log ID [--json]
    runyard stacks ID [--capture] [--report REPORT_ID] [--raw] [--json]

`ft-log` prints the counts of the current run (restarts, reschedules, hangs,
slowdowns), then the fault-tolerance log lines. `stacks` prints the latest stack
report of the task (or `--report`'s), `--capture` captures one now (the task
must be running under `runyard up`); `--raw` adds every thread's full stack.
With `--json` it prints the API's JSON: the report, or for a task without
reports its empty list (`"reports": []`, exit status 0, as `runyard ls --json`
of no tasks); refusals are printed and exit as every command's.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.text import Text
from runyard.cli.main import JsonOpt, TokenOpt, UrlOpt, app, call, err, out, segment, show_json
from runyard.cli.terminal import clean, markup

LEVEL_STYLE = {"error": "red", "warning": "yellow", "info": "green"}


def print_ft_log(body: dict[str, Any]) -> None:
    counts = body["counts"]
    out.print(
        f"[bold]{markup(body['task_id'])}[/bold]  status={markup(body.get('status'))}"
        f"  run {markup(body['run'])}: "
        f"restarts={counts['restarts']} reschedules={counts['reschedules']} "
        f"hangs={counts['hangs']} slowdowns={counts['slowdowns']}"
    )
    if not body["lines"]:
        out.print("(no fault-tolerance events)")
    for line in body["lines"]:
        attempt = f" attempt {clean(line['attempt'])}" if line.get("attempt") is not None else ""
        text = Text(f"{clean(line['at'])} [run {clean(line['run'])}{attempt}] ")
        text.append(clean(line["level"]).upper(), style=LEVEL_STYLE.get(line["level"], "white"))
        text.append(f" {clean(line['text'])}")
        out.print(text, highlight=False, soft_wrap=True)


@app.command("ft-log")
def ft_log(
    task_id: str,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A task's fault-tolerance log: env check, restarts, reschedules, hangs, slowdowns."""
    body = call(url, token, "GET", f"/v1/tasks/{segment(task_id)}/ft-log")
    if as_json:
        show_json(body)
    else:
        print_ft_log(body)


def print_report(report: dict[str, Any], raw: bool) -> None:
    p = out.print
    p(
        f"[bold]stack report {markup(report['report_id'])}[/bold]  task {markup(report['task_id'])}"
        f" run {markup(report['run'])} attempt {markup(report['attempt'])}"
        f"  at {markup(report['captured_at'])}",
        soft_wrap=True,
    )
    plain: dict[str, Any] = {"markup": False, "highlight": False, "soft_wrap": True}
    p(f"summary: {clean(report.get('summary') or '-')}", **plain)
    odd = report.get("odd_ones_out") or []
    if odd:
        p(f"odd ones out (rarest first): workers {clean(', '.join(str(w) for w in odd))}", **plain)
    p("[bold]innermost frame per thread, by worker[/bold]")
    for worker, frames in sorted(report.get("frames_by_worker", {}).items(), key=_by_int):
        p(f"  worker {clean(worker)}: " + clean("; ".join(frames) or "-"), **plain)
    functions = report.get("functions") or {}
    if functions:
        p("[bold]functions (threads, workers)[/bold]")
        ranked = sorted(functions.items(), key=lambda kv: (-int(kv[1].get("threads", 0)), kv[0]))
        for name, stats in ranked[:20]:
            workers = clean(", ".join(str(w) for w in stats.get("workers", [])))
            threads = clean(stats.get("threads", 0))
            p(f"  {threads:>3}  {clean(name)}  [workers {workers}]", **plain)
    for worker, processes in sorted(report.get("workers", {}).items(), key=_by_int):
        for proc in processes:
            if proc.get("error"):
                p(clean(f"  worker {worker} pid {proc['pid']}: {proc['error']}"), **plain)
    if raw:
        print_raw(report)


def print_raw(report: dict[str, Any]) -> None:
    for worker, processes in sorted(report.get("workers", {}).items(), key=_by_int):
        for proc in processes:
            for thread in proc.get("threads", []):
                name = markup(thread.get("thread_name") or "-")
                out.print(
                    f"[bold]worker {markup(worker)} pid {markup(thread['pid'])}"
                    f" thread {markup(thread['thread_id'])} ({name})[/bold]",
                    soft_wrap=True,
                )
                for frame in thread.get("frames", []):
                    where = f"{frame['name']} ({frame['filename']}:{frame['line']})"
                    out.print(f"    {clean(where)}", markup=False, highlight=False, soft_wrap=True)


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
        body = call(url, token, "POST", f"/v1/tasks/{segment(task_id)}/stacks")
    else:
        if report is None:
            listed = call(url, token, "GET", f"/v1/tasks/{segment(task_id)}/stacks")
            reports = listed["reports"]
            if not reports and as_json:
                show_json(listed)  # the API's answer, as every command's --json: no reports
                return
            if not reports:
                err.print(f"no stack report for task {markup(task_id)}")
                err.print("hint: `runyard stacks ID --capture` while it runs")
                raise typer.Exit(1)
            if not as_json:
                for row in reports:
                    line = (
                        f"{row['captured_at']} {row['report_id']} run {row['run']} "
                        f"attempt {row['attempt']}: {row['summary']}"
                    )
                    out.print(clean(line), markup=False, highlight=False, soft_wrap=True)
                out.print()
            report = reports[-1]["report_id"]
        body = call(url, token, "GET", f"/v1/tasks/{segment(task_id)}/stacks/{segment(report)}")
    if as_json:
        show_json(body)
    else:
        print_report(body, raw)
