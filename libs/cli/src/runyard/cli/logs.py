"""`runyard logs ID`: a task's worker output, searched, followed, exported,
or its first error.

    runyard logs ID [--worker N ...] [--run N] [--attempt N] [--since T] [--until T]
                    [--grep WORDS] [--phrase TEXT] [--regex RE] [-i]
                    [--newest] [--limit N] [--cursor C] [--follow] [--raw] [--json]
    runyard logs ID --first-error
    runyard logs ID [filters] --export FILE [--format text|jsonl]

Searches and filters combine (all must hold). Times are that long ago (`30m`,
`1h`, `2d`) or ISO 8601, e.g. 2026-01-02T03:04:05Z (UTC when it has no zone);
`--until` includes its whole second. Each line starts with its time, run and
attempt (`r1a2`: run 1, attempt 2, the first restart), worker and stream.

A line is printed as the worker wrote it, except that terminal escape
sequences (colours, cursor moves, window titles) are dropped and other
control characters shown as escapes (`\r`, `\x08`), so a line cannot
overwrite the prefix or act on your terminal; `--raw` prints the lines
unchanged. Exports are always unchanged.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from runyard.cli.files import check_target, save
from runyard.cli.main import (
    ENDED,
    EXIT_UNREACHABLE,
    JsonOpt,
    TokenOpt,
    UrlOpt,
    app,
    call,
    err,
    gateway,
    given,
    more,
    out,
    segment,
    show_json,
    waiting,
)
from runyard.cli.terminal import clean, clean_output, markup
from runyard.cli.when import parse_when
from runyard.client import GatewayUnreachable, TooBusy

POLL_S = 1.0


def render(line: dict[str, Any], raw: bool = False) -> str:
    """One line as the terminal shows it: the prefix, then the worker's text
    (`clean_output`: no escape sequences; `raw`: verbatim)."""
    text = line["line"] if raw else clean_output(line["line"])
    where = f"r{clean(line['run'])}a{clean(line['attempt'])} w{clean(line['worker'])}"
    return f"{clean(line['at'])} {where} {clean(line['stream']):6} | {text}"


def emit(lines: list[dict[str, Any]], as_json: bool, raw: bool = False) -> None:
    for line in lines:
        if as_json:
            out.print(json.dumps(line), markup=False, highlight=False, soft_wrap=True)
        elif raw:  # written as is: rich would drop the control characters
            out.file.write(render(line, raw) + "\n")
            out.file.flush()
        else:
            out.print(render(line), markup=False, highlight=False, soft_wrap=True)


@app.command()
def logs(
    task_id: str,
    worker: Annotated[list[int] | None, typer.Option(help="Worker index (repeat).")] = None,
    run: Annotated[int | None, typer.Option(help="Run number (default: all).")] = None,
    attempt: Annotated[
        int | None,
        typer.Option(help="Attempt number: 1, then one more per restart (default: all)."),
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="From this time: 30m, 1h, 2d ago, or ISO 8601.")
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(help="To this time (30m, 1h, 2d ago, or ISO 8601), its second included."),
    ] = None,
    grep: Annotated[
        str | None,
        typer.Option(help="Lines with all these whole words (as grep -w -i); 32 at most."),
    ] = None,
    phrase: Annotated[str | None, typer.Option(help="Lines with this exact text.")] = None,
    regex: Annotated[str | None, typer.Option(help="Lines matching this regex.")] = None,
    ignore_case: Annotated[
        bool,
        typer.Option(
            "-i", "--ignore-case", help="--phrase and --regex ignore case (--grep always does)."
        ),
    ] = False,
    newest: Annotated[bool, typer.Option(help="Newest first.")] = False,
    limit: Annotated[int, typer.Option(help="Lines per page (1-1000).")] = 200,
    cursor: Annotated[str | None, typer.Option(help="Continue from a page's cursor.")] = None,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Live tail.")] = False,
    raw: Annotated[
        bool, typer.Option(help="Print lines unchanged, terminal escape sequences included.")
    ] = False,
    first_error: Annotated[bool, typer.Option(help="The first error and its layer.")] = False,
    export: Annotated[Path | None, typer.Option(help="Export matching lines to FILE.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="Export format: text|jsonl.")] = "text",
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A task's worker output: filter, search, page, follow, export, first error."""
    params: dict[str, Any] = given(
        worker=worker or None,
        run=run,
        attempt=attempt,
        since=parse_when(since),
        until=parse_when(until),
        words=grep,
        phrase=phrase,
        regex=regex,
    )
    if ignore_case:
        params["ignore_case"] = "true"
    if first_error:
        return print_first_error(
            call(url, token, "GET", f"/v1/tasks/{segment(task_id)}/first-error"), as_json
        )
    if export is not None:
        return run_export(task_id, params, export, fmt, url, token, as_json)
    params |= {"limit": limit, "order": "newest" if newest and not follow else "oldest"}
    if cursor:
        params["cursor"] = cursor
    page = call(url, token, "GET", f"/v1/tasks/{segment(task_id)}/logs", params=params)
    emit(page["lines"], as_json, raw)
    if follow:
        tail(task_id, params, page, url, token, as_json, raw)
        return
    if not page["lines"] and not as_json:  # an empty answer, as `ls` of none: exit 0
        chosen = [f"--worker {w}" for w in worker or []] + [
            f"{option} {shlex.quote(str(value))}"
            for option, value in (
                ("--run", run), ("--attempt", attempt), ("--since", since), ("--until", until),
                ("--grep", grep), ("--phrase", phrase), ("--regex", regex),
            )
            if value is not None
        ] + (["-i"] if ignore_case else [])  # fmt: skip
        err.print(nothing_found(task_id, chosen, cursor))
    if page["next_cursor"]:
        more(page["next_cursor"])


def nothing_found(task_id: str, chosen: list[str], cursor: str | None) -> str:
    """What an empty page means, for standard error (stdout stays empty for a pipe):
    no line matches the options `chosen` (as typed), no more after the cursor, or none yet."""
    if chosen:
        return f"no line matches {markup(' '.join(chosen))} in the logs of {markup(task_id)}"
    if cursor:
        return f"no more lines in the logs of {markup(task_id)} after this cursor"
    return f"no lines in the logs of {markup(task_id)} yet"


def tail(
    task_id: str,
    params: dict[str, Any],
    page: dict[str, Any],
    url: str | None,
    token: str | None,
    as_json: bool,
    raw: bool = False,
) -> None:
    """Print new lines as they come until the task ends (or Ctrl-C)."""
    try:
        while True:
            if page["next_cursor"] is None:
                task = call(url, token, "GET", f"/v1/tasks/{segment(task_id)}")
                if task.get("status") in ENDED:
                    page = follow_page(task_id, params, page, url, token)
                    emit(page["lines"], as_json, raw)  # what arrived before the end
                    return
                time.sleep(POLL_S)
            page = follow_page(task_id, params, page, url, token)
            emit(page["lines"], as_json, raw)
    except KeyboardInterrupt:
        return


def follow_page(
    task_id: str, params: dict[str, Any], page: dict[str, Any], url: str | None, token: str | None
) -> Any:
    """The page after `page`, for a follow: a search the log service is too busy for
    (429 `logs.busy`, once the client's own retries are spent) is waited out and asked
    again, for as long as the follow goes on, instead of ending it; any other refusal
    ends it as `call` does."""
    while True:
        with gateway(url, token) as api:
            try:
                path = f"/v1/tasks/{segment(task_id)}/logs"
                return api.request("GET", path, params=_after(params, page))
            except TooBusy as exc:
                busy = exc
        wait = busy.retry_after_s or POLL_S
        waiting(busy, wait)
        time.sleep(wait)


def _after(params: dict[str, Any], page: dict[str, Any]) -> dict[str, Any]:
    """`params` from where `page` ended (its tail cursor)."""
    return {**params, **({"cursor": page["tail_cursor"]} if page["tail_cursor"] else {})}


def print_first_error(found: dict[str, Any], as_json: bool) -> None:
    if as_json:
        return show_json(found)
    if not found["found"]:
        out.print(f"no error line found in the logs of {markup(found['task_id'])}")
        return
    out.print(
        f"first error ({markup(found['layer'])}, rule {markup(found['rule'])}):"
        f" {markup(found['why'])}"
    )
    if exception := found.get("exception"):
        where = f"worker {exception['worker']}, attempt {exception['attempt']}"
        text = clean_output(exception["line"])
        out.print(f"exception ({where}): {text}", markup=False, highlight=False, soft_wrap=True)
    for line in found["before"]:
        out.print("  " + render(line), markup=False, highlight=False, soft_wrap=True)
    out.print("> " + render(found["line"]), markup=False, highlight=False, soft_wrap=True)
    for line in found["after"]:
        out.print("  " + render(line), markup=False, highlight=False, soft_wrap=True)
    if found["evidence"] and found["evidence"] != found["line"]["line"]:
        evidence = clean_output(found["evidence"])
        out.print(f"matched: {evidence}", markup=False, highlight=False, soft_wrap=True)


def run_export(
    task_id: str,
    params: dict[str, Any],
    target: Path,
    fmt: str,
    url: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """Start an export, show its progress, download the file to `target` (looked at
    first: one that cannot be written costs no export)."""
    check_target(target)
    started = call(
        url,
        token,
        "POST",
        f"/v1/tasks/{segment(task_id)}/logs/exports",
        params=params,
        json={"format": fmt},
    )
    export_id = started["export_id"]
    state = started
    while state["state"] == "running":
        if not as_json:
            done, total = markup(state["lines_done"]), markup(state["lines_total"] or "?")
            err.print(f"export {markup(export_id)}: {done}/{total}")
        time.sleep(0.5)
        state = call(url, token, "GET", f"/v1/exports/{segment(export_id)}")
    if state["state"] != "done":
        err.print(
            f"[red]error:[/red] export {markup(export_id)} {markup(state['state'])}:"
            f" {markup(state['error'])}"
        )
        raise typer.Exit(1)
    with gateway(url, token) as api:
        try:
            with api.stream("GET", f"/v1/exports/{segment(export_id)}/file") as answer:
                save(answer, target)
        except GatewayUnreachable as exc:  # a body cut short too (`save`)
            err.print(f"[red]error:[/red] the export did not arrive whole: {markup(exc.message)}")
            err.print(f"hint: download it again: GET /v1/exports/{markup(export_id)}/file")
            raise typer.Exit(EXIT_UNREACHABLE) from exc
    if as_json:
        return show_json(state)
    out.print(f"exported {markup(state['lines_done'])} lines to {markup(target)}")
