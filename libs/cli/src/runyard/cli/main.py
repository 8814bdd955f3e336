"""`runyard`: the command line of the gateway API.

Every command calls the HTTP API and prints a readable table, or the API's
JSON with `--json`. On a pipe or into a file, tables are plain lines with
tab-separated columns, never cut to the terminal's width. Text from the
server is printed through `runyard.cli.terminal.clean`: control characters
cannot forge lines or send escape sequences.

Token, first found: `--token`; RUNYARD_TOKEN; the file `.runyard/token` of
the current folder (written by `runyard up`); the file `token` of the user's
config folder, `$XDG_CONFIG_HOME/runyard/` or `~/.config/runyard/` (written
by `runyard login`). Gateway: `--url`, else RUNYARD_URL, else
http://127.0.0.1:8080.

Exit codes: 0 ok, 1 refused by the gateway (400/404/409), 2 usage error,
3 not authenticated or not allowed (401/403), 4 gateway unreachable.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import httpx
import typer
import yaml
from pydantic import BaseModel
from rich.console import Console
from runyard.cli.admin import admin_app
from runyard.cli.alerts import alerts_app
from runyard.cli.detail import detail, has_restarts
from runyard.cli.envtext import EnvTextLoader
from runyard.cli.settings import SettingError, apply_settings, sets_nested
from runyard.cli.terminal import JSON_WANTED, clean, markup, print_json, remember_json, render_table
from runyard.client import (
    ApiError,
    Client,
    ClientError,
    GatewayUnreachable,
    InvalidId,
    Retry,
    TooBusy,
)
from runyard.client import segment as path_segment
from runyard.contracts.http import Error
from runyard.contracts.requests import RerunChanges

app = typer.Typer(help="Runyard: submit and follow GPU training tasks.", no_args_is_help=True)
group_app = typer.Typer(help="Task groups: many tasks from one template.", no_args_is_help=True)
app.add_typer(group_app, name="group")
app.add_typer(admin_app, name="admin")
app.add_typer(alerts_app, name="alerts")

DEFAULT_URL = "http://127.0.0.1:8080"
#: The dev token `runyard up` writes, relative to the current folder.
TOKEN_FILE = Path(".runyard/token")
EXIT_REFUSED, EXIT_AUTH, EXIT_UNREACHABLE = 1, 3, 4
#: A command waits out a short outage (a 503, a gateway restarting) or a busy gateway (a
#: 429 refused before acting: `submission.busy`, `logs.busy`), not a long one.
RETRY = Retry(attempts=3, backoff_s=0.5, max_wait_s=5.0)

UrlOpt = Annotated[str | None, typer.Option("--url", help="Gateway URL (RUNYARD_URL).")]
TokenOpt = Annotated[str | None, typer.Option("--token", help="Bearer token (RUNYARD_TOKEN).")]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the API's JSON.", callback=remember_json)
]

#: `emoji=False`: a task named `:fire:` prints as such, not as an emoji.
out = Console(soft_wrap=True, emoji=False)
err = Console(stderr=True, emoji=False, soft_wrap=True)


# --- talking to the gateway ---------------------------------------------------


def config_dir() -> Path:
    """The user's Runyard config folder: `$XDG_CONFIG_HOME/runyard`, else `~/.config/runyard`.

    A relative XDG_CONFIG_HOME is ignored, as the XDG base directory spec says.
    """
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".config"
    return root / "runyard"


def token_files() -> list[Path]:
    """Where a token is looked for, in order: `.runyard/token`, then the config folder's."""
    return [TOKEN_FILE, config_dir() / "token"]


def resolve_token(token: str | None) -> str | None:
    """`--token`, else RUNYARD_TOKEN, else the first non-empty file of `token_files()`."""
    if token:
        return token
    if env := os.environ.get("RUNYARD_TOKEN"):
        return env
    for path in token_files():
        if path.is_file() and (found := path.read_text().strip()):
            return found
    return None


def make_client(url: str | None, token: str | None) -> httpx.Client:
    """An HTTP client for the gateway (tests replace this)."""
    headers = {"Authorization": f"Bearer {t}"} if (t := resolve_token(token)) else {}
    base = url or os.environ.get("RUNYARD_URL") or DEFAULT_URL  # set but empty: the default
    return httpx.Client(base_url=base, headers=headers, timeout=30)


@contextlib.contextmanager
def gateway(url: str | None, token: str | None) -> Iterator[Client]:
    """The gateway's API client (`runyard.client`) over `make_client`, for one command;
    a refusal prints its message and hint and exits, as does an unreachable gateway."""
    try:
        with make_client(url, token) as http:
            yield Client(http=http, retry=RETRY, on_retry=waiting)
    except httpx.InvalidURL as exc:
        given = url or os.environ.get("RUNYARD_URL", "")
        err.print(
            f"[red]error:[/red] the gateway URL {markup(repr(given))} is not a URL: {markup(exc)}"
        )
        err.print("hint: give one as http://HOST:PORT with --url or RUNYARD_URL")
        raise typer.Exit(2) from exc
    except GatewayUnreachable as exc:
        hint = "start it with `runyard up`, or set --url / RUNYARD_URL"
        if JSON_WANTED.get():
            show_json({"code": exc.code, "field": "", "message": exc.message, "hint": hint})
        else:
            err.print(f"[red]error:[/red] {markup(exc.message)}")
            err.print(f"hint: {hint}")
        raise typer.Exit(EXIT_UNREACHABLE) from exc
    except ApiError as exc:
        refused(exc)
    except InvalidId as exc:
        invalid_id(exc)


def waiting(error: ClientError, wait_s: float) -> None:
    """Say on standard error that a refused call is sent again, and when (a busy gateway,
    429; an outage, 503), so a command that waits shows why."""
    if isinstance(error, ApiError):
        state = "busy" if isinstance(error, TooBusy) else "unavailable"
        err.print(f"the gateway is {state} ({markup(error.code)}): retrying in {wait_s:g} s")


def call(url: str | None, token: str | None, method: str, path: str, **kw: Any) -> Any:
    """One API call (`params`, `json`) answered as JSON; an error answer prints its
    message and hint and exits."""
    with gateway(url, token) as api:
        return api.request(method, path, **kw)


def segment(value: str) -> str:
    """`value` (an id the user typed) as one segment of a path (`runyard.client.segment`):
    a `?`, `#`, `%`, `.` or `..` is sent as itself, never as a query, a fragment or
    another route; an id with a `/` is refused, exit status 2, nothing sent."""
    try:
        return path_segment(value)
    except InvalidId as exc:
        invalid_id(exc)


def invalid_id(error: InvalidId) -> NoReturn:
    """An id no path can carry: a usage error (exit 2), with `--json` as the API's error."""
    if JSON_WANTED.get():
        show_json({"code": error.code, "field": "", "message": error.message, "hint": error.hint})
    else:
        err.print(f"[red]error[/red] {markup(error.code)}: {markup(error.message)}")
        err.print(f"hint: {markup(error.hint)}")
    raise typer.Exit(2) from error


def refused(error: ApiError) -> NoReturn:
    """Print a refusal (code, field, message, hint) and exit with its code; with
    `--json`, the API's error object on standard output (for a script to read)."""
    code = EXIT_AUTH if error.http_status in (401, 403) else EXIT_REFUSED
    if JSON_WANTED.get():
        show_json(error.error.model_dump(mode="json"))
        raise typer.Exit(code)
    where = f" ({markup(error.field)})" if error.field else ""
    err.print(f"[red]error[/red] {markup(error.code)}{where}: {markup(error.message)}")
    if error.hint:
        err.print(f"hint: {markup(error.hint)}")
    raise typer.Exit(code)


def as_json_data(answer: BaseModel) -> dict[str, Any]:
    """An answer as the API's JSON: the members the gateway sent, no model default added."""
    return answer.model_dump(mode="json", exclude_unset=True)


def given(**values: Any) -> dict[str, Any]:
    """The options the user actually set (None means not given)."""
    return {k: v for k, v in values.items() if v is not None}


def rerun_changes(**values: Any) -> RerunChanges:
    """The rerun changes the user set, as the API's model (not checked here: the
    gateway refuses a bad value naming the field and how to fix it)."""
    changes: RerunChanges = RerunChanges.model_construct(**given(**values))
    return changes


def more(cursor: str, words: str = "more") -> None:
    """The next page's cursor, on standard error (not a line of the answer), after all of
    standard output has been written: on one pipe (`2>&1 | cat`) it is a line of its own."""
    out.file.flush()  # every line on stdout ends with a newline; written before this one
    err.print(f"{words}: --cursor {markup(cursor)}")


def show_json(data: Any) -> None:
    print_json(out, data)


def table(title: str, columns: list[str], rows: Iterator[list[Any]] | list[list[Any]]) -> None:
    """A rich table on a terminal, tab-separated whole lines on a pipe (`render_table`)."""
    render_table(out, title, columns, rows)


class _TaskFileLoader(EnvTextLoader):
    """A safe loader with YAML 1.2's booleans and numbers (`yes`, `no`, `on`, `off`,
    `010`, `1:30` are text: `runyard.contracts.yamlcore`), an env variable's value
    written as a number or boolean read as text (`runyard.cli.envtext`), refusing a key
    given twice in one mapping (YAML would keep the last silently: a second `command:`
    would run, the first not).
    Keys a merge (`<<: *base`) brings may still be given again: that is what a merge
    is for."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[tuple[str, str], yaml.Mark] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
                continue
            key = (key_node.tag, key_node.value)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "in the mapping",
                    node.start_mark,
                    f"{key_node.value[:64]!r} is given twice (first at line"
                    f" {seen[key].line + 1}): keep one",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


_MERGE_TAG = "tag:yaml.org,2002:merge"


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error on one line: where, what, and in what (`line 2, column 1: expected
    ',' or ']', but got '<stream end>' (while parsing a flow sequence from line 1,
    column 7)`)."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return str(exc)
    mark = exc.problem_mark
    text = f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    if exc.context and exc.context_mark is not None:
        at = exc.context_mark
        text += f" ({exc.context} from line {at.line + 1}, column {at.column + 1})"
    elif exc.context:
        text += f" ({exc.context})"
    return text


#: A task file's bounds: the gateway's for a request body (docs/limits.md), checked as the
#: file is read, so that YAML aliases that repeat a list into gigabytes are refused here
#: before they are built into a request, and a file nested thousands deep is no traceback.
FILE_MAX_BYTES = 1024 * 1024
FILE_MAX_DEPTH = 32


def load_yaml(path: Path) -> dict[str, Any]:
    """A task file (YAML or JSON) as a mapping."""
    try:
        data = yaml.load(path.read_text(), Loader=_TaskFileLoader)  # a SafeLoader
    except (OSError, UnicodeDecodeError) as exc:
        err.print(f"[red]error:[/red] cannot read {markup(path)}: {markup(exc)}")
        raise typer.Exit(2) from exc
    except RecursionError as exc:  # PyYAML composes nested nodes recursively
        _refuse_file(path, f"nested deeper than {FILE_MAX_DEPTH} levels", exc)
    except yaml.YAMLError as exc:
        kind = "JSON" if path.suffix.lower() == ".json" else "YAML"
        problem = markup(yaml_problem(exc))
        err.print(f"[red]error:[/red] {markup(path)} is not valid {kind}: {problem}")
        err.print("hint: fix it there (a task file is YAML or JSON, e.g. examples/hello.yaml)")
        raise typer.Exit(2) from exc
    if not isinstance(data, dict):
        err.print(f"[red]error:[/red] {markup(path)}: expected a mapping of task spec fields")
        raise typer.Exit(2)
    if (over := _file_problem(data)) is not None:
        _refuse_file(path, over)
    return data


def _refuse_file(path: Path, problem: str, cause: BaseException | None = None) -> NoReturn:
    err.print(f"[red]error:[/red] {markup(path)} is {problem}")
    err.print(
        f"hint: the gateway takes at most {FILE_MAX_BYTES} bytes of JSON nested"
        f" {FILE_MAX_DEPTH} levels (docs/limits.md); YAML aliases (*name) repeat what they"
        " name: write the spec out, and keep long text in a script on a volume"
    )
    raise typer.Exit(2) from cause


def _file_problem(data: Any) -> str | None:
    """Why `data` would be over a request body's bounds as JSON (about its size: keys,
    scalars and punctuation counted), None when it is within them. Stops at the bound,
    so a file of aliases costs no more than a file of that size."""
    size = 0
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= FILE_MAX_DEPTH:
                return f"nested deeper than {FILE_MAX_DEPTH} levels"
            children = list(item.values()) if isinstance(item, dict) else item
            if isinstance(item, dict):
                size += sum(len(str(key)) + 4 for key in item)
            size += 2 + len(children)
            stack.extend((child, depth + 1) for child in children)
        else:
            size += len(str(item)) + 2
        if size > FILE_MAX_BYTES:
            return f"more than {FILE_MAX_BYTES} bytes as JSON"
    return None


# --- tasks --------------------------------------------------------------------


#: The statuses a task ends in.
ENDED = frozenset({"succeeded", "failed", "stopped", "abnormal"})
#: Counters of the current run, in the order `runyard show` prints them.
COUNTERS = ("restarts", "reschedules", "requeues", "preemptions", "hangs", "slowdowns")


def print_task(task: dict[str, Any]) -> None:
    """A task's summary, counters of its run, warnings and stage timeline (per attempt)."""
    attempt = f"  attempt={task['attempt']}" if task.get("attempt") else ""
    out.print(
        f"[bold]{markup(task['task_id'])}[/bold]  {markup(task['name'])}"
        f"  status={markup(task['status'])}  run={task['run']}{attempt}"
        f"  pool={markup(task['spec']['pool'])}  creator={markup(task['creator'])}"
    )
    counters = task.get("counters") or {}
    if counters:
        limits = _limits(task["spec"])
        shown = [f"{n}={counters.get(n, 0)}{limits.get(n, '')}" for n in COUNTERS]
        if not (task["spec"].get("fault_tolerance") or {}).get("auto_restart"):
            shown.append("auto_restart=off")  # a crash or hang fails the task: no restart
        out.print(f"this run: {' '.join(shown)}")
    if task.get("queue"):
        q = task["queue"]
        out.print(f"queued: {markup(q['reason'])} (position {markup(q['position'])})")
    if task.get("stop_reason"):
        if task["status"] in ENDED:
            out.print(f"stop: {markup(task['stop_reason'])}")
        else:  # asked, not done yet: the workers are being ended
            out.print(f"stop: requested ({markup(task['stop_reason'])}); ending its workers")
    if task.get("last_failure_reason"):
        out.print(f"last failure: {markup(task['last_failure_reason'])}")
    for w in task.get("warnings", []):
        out.print(
            f"[yellow]warning[/yellow] {markup(w['code'])} ({markup(w['field'])}):"
            f" {markup(w['message'])}"
        )
    if task.get("stages"):
        table(
            "stages",
            ["run", "attempt", "stage", "result", "started", "duration ms", "reason"],
            [
                [
                    s["run"],
                    s.get("attempt"),
                    s["stage"],
                    s["result"],
                    s["started_at"],
                    s["duration_ms"],
                    s.get("reason"),
                ]
                for s in task["stages"]
            ],
        )


TenantOpt = Annotated[
    str | None, typer.Option(help="Another tenant's (sre and platform_admin only).")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="FIELD=VALUE (repeat); a nested field by its path (fault_tolerance.max_restarts=5);"
        " numbers, true/false and \\[lists] are read as YAML, anything else as text.",
    ),
]


def with_settings(
    base: dict[str, Any], sets: list[str] | None, current: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`base` with the `--set` options applied (a bad one: a clear error, exit 2)."""
    if not sets:
        return base
    try:
        return apply_settings(base, sets, current)
    except SettingError as exc:
        err.print(f"[red]error:[/red] {markup(exc)}")
        err.print(f"hint: {markup(exc.hint)}")
        raise typer.Exit(2) from exc


def wrong_file(file: Path, holds: str, instead: str) -> NoReturn:
    """`file` is the other kind of task file: say which, and the command it is for."""
    err.print(f"[red]error:[/red] {markup(file)} holds {holds}")
    err.print(f"hint: {markup(instead)}")
    raise typer.Exit(2)


def _limits(spec: dict[str, Any]) -> dict[str, str]:
    """`/N` after the counters the spec limits: restarts (max_restarts), requeues (spot)."""
    limits: dict[str, str] = {}
    restarts = (spec.get("fault_tolerance") or {}).get("max_restarts")
    if restarts is not None:
        limits["restarts"] = f"/{restarts}"
    requeues = (spec.get("spot") or {}).get("max_requeues")
    if requeues is not None:
        limits["requeues"] = f"/{requeues}"
    return limits


@app.command()
def submit(
    file: Annotated[Path, typer.Option("-f", "--file", help="Task spec file (YAML).")],
    sets: SetOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit a task from a YAML file; prints the task id and any warnings.

    The launch command runs on the workers, not on this machine: a worker sees
    the image, its mounted volumes and its own working directory and /tmp,
    never your /tmp or home folder. Put your code in the image or on a volume
    the task mounts (e.g. `python /mnt/code/train.py`); a path that is in
    neither gets a `command.path_not_on_worker` warning.

    `--set` changes a field of the file without editing it:
    `--set worker_count=2 --set fault_tolerance.auto_restart=true`.
    """
    loaded = load_yaml(file)
    if "template" in loaded and "items" in loaded and "pool" not in loaded:
        wrong_file(file, "a task group (template and items)", f"runyard group create -f {file}")
    spec = with_settings(loaded, sets)
    with gateway(url, token) as api:
        task = as_json_data(api.create_task(spec))
    show_json(task) if as_json else print_task(task)


@app.command("ls")
def list_tasks(
    status: Annotated[str | None, typer.Option(help="Only this status.")] = None,
    name: Annotated[str | None, typer.Option(help="Name contains.")] = None,
    tag: Annotated[str | None, typer.Option(help="Has this tag.")] = None,
    pool: Annotated[str | None, typer.Option(help="In this pool.")] = None,
    creator: Annotated[str | None, typer.Option(help="Submitted by.")] = None,
    limit: Annotated[int, typer.Option(help="Page size.")] = 50,
    cursor: Annotated[str | None, typer.Option(help="next_cursor of the last page.")] = None,
    tenant: TenantOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List your tenant's tasks, newest first."""
    params = given(status=status, name=name, tag=tag, pool=pool, creator=creator)
    params |= given(limit=limit, cursor=cursor, tenant=tenant)
    with gateway(url, token) as api:
        page = as_json_data(api.list_tasks(**params))
    if as_json:
        return show_json(page)
    table(
        "tasks",
        ["id", "name", "status", "pool", "run", "creator", "created"],
        [
            [
                t["task_id"],
                t["name"],
                t["status"],
                t["pool"],
                t["run"],
                t["creator"],
                t["created_at"],
            ]
            for t in page["items"]
        ],
    )
    if page["next_cursor"]:
        more(page["next_cursor"])  # not a row of the table


AtOpt = Annotated[
    str | None,
    typer.Option(
        "--at",
        help="Replay: as it was at this point, a global position of the event log (1234),"
        " an ISO 8601 time with a zone (2026-12-01T10:00:00Z) or that long ago (30m, 1h,"
        " 2d); folded from the log only.",
    ),
]


@app.command()
def show(
    task_id: str,
    at: AtOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A task: status, run, warnings, stage timeline; a failed task's first error.

    For a failed task, the first error of its logs with its likely layer (R-42).
    With --at, the task as it was at that point (and its workers' placement); see
    `runyard diff`."""
    if at is not None:
        return replay.show_at(task_id, at, url, token, as_json)
    with gateway(url, token) as api:
        task = as_json_data(api.get_task(task_id))
        if task.get("status") in ("failed", "abnormal"):
            task["first_error"] = api.request("GET", f"/v1/tasks/{segment(task_id)}/first-error")
    if as_json:
        show_json(task)
        return
    print_task(task)
    if "first_error" in task:
        from runyard.cli.logs import print_first_error  # logs.py imports this module

        print_first_error(task["first_error"], as_json=False)


@app.command()
def stop(
    task_id: str, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Stop a task, queued or running: it ends `stopped` once its workers have ended.

    Stop a task, then follow it until it has ended:
    runyard stop ID && runyard watch ID

    Stop every task of a group: runyard group stop GROUP
    """
    with gateway(url, token) as api:
        task = as_json_data(api.stop_task(task_id))
    show_json(task) if as_json else print_task(task)


@app.command()
def rerun(
    task_id: str,
    image: Annotated[str | None, typer.Option(help="New image.")] = None,
    command: Annotated[str | None, typer.Option(help="New launch command.")] = None,
    spec: Annotated[str | None, typer.Option(help="New worker spec.")] = None,
    workers: Annotated[int | None, typer.Option(help="New worker count.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a finished task again; only image, command, worker spec and count may change."""
    changes = rerun_changes(image=image, command=command, worker_spec=spec, worker_count=workers)
    with gateway(url, token) as api:
        task = as_json_data(api.rerun_task(task_id, changes))
    show_json(task) if as_json else print_task(task)


@app.command()
def clone(
    task_id: str,
    file: Annotated[Path | None, typer.Option("-f", "--file", help="YAML of overrides.")] = None,
    sets: SetOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A new task from a task's spec, with any field overridden (the pool too).

    Overrides come from a file (`-f`) and `--set`, e.g. `--set pool=dev-spot
    --set resource_type=spot`; a nested field (`--set fault_tolerance.max_restarts=5`)
    keeps the task's other fields of that object."""
    overrides = load_yaml(file) if file else {}
    with gateway(url, token) as api:
        if sets:
            spec = as_json_data(api.get_task(task_id))["spec"] if sets_nested(sets) else {}
            overrides = with_settings(overrides, sets, spec)
        task = as_json_data(api.clone_task(task_id, overrides))
    show_json(task) if as_json else print_task(task)


@app.command()
def events(
    task_id: str, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """The task's audit timeline: each event with its actor and correlation id.

    `detail` shows the fields that say what, where and why (stage, worker, exit
    code, reason, nodes, ...); `--json` gives every field."""
    with gateway(url, token) as api:
        timeline = [as_json_data(event) for event in api.task_events(task_id)]
    if as_json:
        return show_json(timeline)
    restarted = has_restarts(timeline)
    table(
        f"events of {task_id}",
        ["#", "time", "type", "actor", "correlation id", "detail"],
        [
            [
                e["version"],
                e["occurred_at"],
                e["type"],
                e["actor"],
                e["correlation_id"],
                detail(e.get("data") or {}, restarted=restarted),
            ]
            for e in timeline
        ],
    )


@app.command()
def watch(
    task_id: str, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Follow a task live until it ends (or until your token is revoked or expires)."""
    with (
        gateway(url, token) as api,
        api.stream("GET", f"/v1/tasks/{segment(task_id)}/watch") as answer,
    ):
        kind, restarted = "", False
        for line in answer.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif kind == "error" and line.startswith("data: "):
                body = json.loads(line[6:])
                raise ApiError(body.pop("status", 400), Error.model_validate(body))
            elif line.startswith("data: ") and line != "data: {}":
                event = json.loads(line[6:])
                if as_json:
                    out.print(json.dumps(event), markup=False, highlight=False)
                else:
                    when, kind, actor = (clean(event[k]) for k in ("occurred_at", "type", "actor"))
                    restarted = restarted or has_restarts([event])
                    more = clean(detail(event.get("data") or {}, restarted=restarted))
                    line = f"{when}  {kind}  {actor}" + (f"  {more}" if more else "")
                    out.print(line, markup=False, highlight=False)


# --- pools --------------------------------------------------------------------


@app.command()
def pools(
    at: AtOpt = None,
    pool: Annotated[str | None, typer.Option(help="With --at: this pool only.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Resource pools: zone, resource type, network and worker specs.

    With --at, each pool's nodes, health and allocations as they were at that
    point."""
    if at is not None:
        return replay.pools_at(at, pool, url, token, as_json)
    with gateway(url, token) as api:
        found = [as_json_data(pool) for pool in api.pools()]
    if as_json:
        return show_json(found)
    table(
        "pools",
        ["pool", "zone", "type", "network", "specs", "GPUs"],
        [
            [
                p["pool_id"],
                p["zone"],
                p["resource_type"],
                p["network"],
                ", ".join(f"{k}={v}" for k, v in p["specs"].items()),
                p["total_gpus"],
            ]
            for p in found
        ],
    )


@app.command()
def images(
    zone: Annotated[str | None, typer.Option(help="Only the images of this zone.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The images of the catalogue: their zones and the services they are available to.

    A task's image must be in its pool's zone and available to `training`
    (`runyard pools` shows each pool's zone)."""
    with gateway(url, token) as api:
        found = as_json_data(api.catalogue())["images"]
    if zone is not None:
        found = [i for i in found if zone in i["zones"]]
    if as_json:
        return show_json(found)
    table(
        f"images of zone {zone}" if zone is not None else "images",
        ["image", "zones", "services"],
        [[i["name"], ", ".join(i["zones"]), ", ".join(i["services"])] for i in found],
    )


@app.command()
def capacity(
    pool_id: str, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """What a pool can launch now: count per worker spec, custom-count maximum.

    Workers of each spec dev-a100 can launch now: runyard capacity dev-a100

    The pools, with their worker specs: runyard pools
    """
    with gateway(url, token) as api:
        cap = as_json_data(api.pool_capacity(pool_id))
    if as_json:
        return show_json(cap)
    table(
        f"capacity of {pool_id}",
        ["spec", "launchable"],
        [[name, count] for name, count in (cap.get("launchable") or {}).items()],
    )
    out.print(f"custom GPU count up to {markup(cap.get('custom_gpus_max'))}")


# --- groups -------------------------------------------------------------------


@group_app.command("create")
def group_create(
    file: Annotated[
        Path,
        typer.Option(
            "-f", "--file", help="YAML: template + items, and group_id if you name the group."
        ),
    ],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a task group from a template and a list of overrides (all tasks or none).

    Each item's fields override the template's (examples/group.yaml). With
    `group_id: NAME` in the file the group gets that name, and a file sent again
    with the same group_id adds its tasks to that group, up to 1000 tasks in all
    (`group.too_large` past it)."""
    body = load_yaml(file)
    if "template" not in body and "items" not in body and "pool" in body:
        wrong_file(
            file,
            "one task's spec",
            f"runyard submit -f {file}, or put the spec under template: with items:"
            " (examples/group.yaml)",
        )
    with gateway(url, token) as api:
        group = as_json_data(api.create_group(body))
    print_group(group, as_json)


@group_app.command("ls")
def group_ls(
    group_id: Annotated[
        str | None, typer.Argument(help="A group: list its tasks. None: list all groups.")
    ] = None,
    limit: Annotated[int, typer.Option(help="How many groups (newest first).")] = 50,
    cursor: Annotated[str | None, typer.Option(help="next_cursor of the last page.")] = None,
    tenant: TenantOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Your tenant's groups, newest first, a page at a time; with an id, its tasks.

    Each group with a count per status; the next page's --cursor on stderr."""
    with gateway(url, token) as api:
        if group_id is not None:
            return print_group(as_json_data(api.get_group(group_id, tenant=tenant)), as_json)
        found = as_json_data(api.list_groups(limit=limit, tenant=tenant, cursor=cursor))
    if as_json:
        return show_json(found)
    table(
        "groups",
        ["group", "tasks", "statuses", "created"],
        [
            [
                g["group_id"],
                g["tasks"],
                ", ".join(f"{k}: {v}" for k, v in g["status_counts"].items()),
                g["created_at"],
            ]
            for g in found["items"]
        ],
    )
    if found.get("next_cursor"):
        more(found["next_cursor"])  # not a row of the table


group_app.command("list", hidden=True)(group_ls)  # as `admin tokens list`


@group_app.command("show")
def group_show(
    group_id: str,
    tenant: TenantOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One group's tasks with their statuses (as `group ls ID`; `runyard show` is for a task)."""
    with gateway(url, token) as api:
        print_group(as_json_data(api.get_group(group_id, tenant=tenant)), as_json)


@group_app.command("stop")
def group_stop(
    group_id: str, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Stop every task of a group that has not ended."""
    with gateway(url, token) as api:
        group = as_json_data(api.stop_group(group_id))
    print_group(group, as_json)


@group_app.command("rerun")
def group_rerun(
    group_id: str,
    image: Annotated[str | None, typer.Option(help="New image for every task.")] = None,
    command: Annotated[str | None, typer.Option(help="New launch command.")] = None,
    spec: Annotated[str | None, typer.Option(help="New worker spec.")] = None,
    workers: Annotated[int | None, typer.Option(help="New worker count.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Rerun every finished task of a group (all or none), with the same allowed changes."""
    changes = rerun_changes(image=image, command=command, worker_spec=spec, worker_count=workers)
    with gateway(url, token) as api:
        group = as_json_data(api.rerun_group(group_id, changes))
    print_group(group, as_json)


def print_group(group: dict[str, Any], as_json: bool) -> None:
    if as_json:
        return show_json(group)
    table(
        f"group {group['group_id']}",
        ["id", "name", "status", "pool"],
        [[t["task_id"], t["name"], t["status"], t["pool"]] for t in group["tasks"]],
    )
    counts = ", ".join(f"{k}: {v}" for k, v in group["status_counts"].items())
    out.print(clean(counts), markup=False, highlight=False)


# --- login --------------------------------------------------------------------


@app.command()
def login(url: UrlOpt = None) -> None:
    """Save your API token for the CLI, checked against the gateway first.

    It goes to `$XDG_CONFIG_HOME/runyard/token` (default
    `~/.config/runyard/token`), mode 0600.

    The token is asked for without echo, or read from standard input when that
    is not a terminal (`runyard login < token.txt`); it is never an argument, so
    it stays out of the shell's history. It is checked against the gateway
    before it is saved. `--token`, RUNYARD_TOKEN and `./.runyard/token` (the dev
    token of `runyard up`) still come first when present.
    """
    secret = _read_secret()
    call(url, secret, "GET", "/v1/pools")  # 401 or unreachable: exits, nothing saved
    path = config_dir() / "token"
    save_token(path, secret)
    out.print(f"token saved to {markup(path)}")
    for earlier in _earlier_tokens():
        out.print(f"note: {earlier} comes first while it is set")


def _read_secret() -> str:
    if sys.stdin.isatty():
        secret = str(typer.prompt("API token", hide_input=True))
    else:
        secret = sys.stdin.readline()
    secret = secret.strip()
    if not secret or any(c.isspace() for c in secret):
        err.print("[red]error:[/red] no token given (a token is one word, without spaces)")
        err.print("hint: paste the token your admin gave you, or pipe it in: runyard login < FILE")
        raise typer.Exit(2)
    return secret


def save_token(path: Path, secret: str) -> None:
    """Write `secret` to `path` readable by its owner only, replacing any earlier file whole."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as sink:
            sink.write(secret + "\n")
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _earlier_tokens() -> list[str]:
    """Token sources that take precedence over the config folder's file, when present."""
    found = ["RUNYARD_TOKEN"] if os.environ.get("RUNYARD_TOKEN") else []
    if TOKEN_FILE.is_file() and TOKEN_FILE.read_text().strip():
        found.append(f"{TOKEN_FILE} (in this folder)")
    return found


# --- stack --------------------------------------------------------------------


@app.command()
def up(
    http_port: Annotated[int, typer.Option(help="HTTP API port")] = 8080,
    grpc_port: Annotated[int, typer.Option(help="gRPC API port")] = 50051,
    one_process: Annotated[
        bool, typer.Option("--one-process", help="Run every service in this one process.")
    ] = False,
) -> None:
    """Start the whole stack locally (embedded Postgres and broker, every service).

    Each service runs as a child process on its own port, restarted when it
    exits (`runyard ps` lists them); with --one-process all run in this one.
    Prints where each part listens and a dev admin token (also written to
    .runyard/token, which the other commands read). Ctrl-C stops everything.
    """
    from runyard.stack import up as stack_up  # lazy: heavy, and owned by the stack

    stack_up.main(http_port=http_port, grpc_port=grpc_port, one_process=one_process)


@app.command()
def serve(
    service: Annotated[str, typer.Argument(help="relay, gateway, submission, scheduler, ...")],
) -> None:
    """Run one service in this process (what `runyard up` starts for each).

    Reads DATABASE_URL, KAFKA_BOOTSTRAP_SERVERS, RUNYARD_TOPIC_PREFIX,
    RUNYARD_HOME, RUNYARD_CONFIG, RUNYARD_SETTINGS, RUNYARD_ENDPOINTS and
    RUNYARD_SERVICE_PORT; applies the service's migrations (as
    RUNYARD_OWNER_DATABASE_URL when set) and creates the topics first.
    SIGTERM or Ctrl-C stops it (exit 0).
    """
    from runyard.stack import serve as stack_serve

    if service not in stack_serve.SERVICE_NAMES:
        err.print(f"[red]error:[/red] no service {markup(service)!r}")
        err.print(f"hint: one of {', '.join(stack_serve.SERVICE_NAMES)}")
        raise typer.Exit(2)
    stack_serve.main(service)


@app.command()
def tail(
    after: Annotated[int, typer.Option(help="start after this global position")] = 0,
    follow: Annotated[bool, typer.Option(help="keep following new events")] = True,
) -> None:
    """Print every event of the log as it is appended (SRE view of a running stack).

    Reads the event store directly (DATABASE_URL, or the stack `make up` started).
    """
    import asyncio

    from runyard.stack import up as stack_up

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(stack_up.tail(stack_up.stack_dsn(), after=after, follow=follow))


from runyard.cli import audit as _audit  # noqa: E402, F401  (registers `runyard audit`, `export-events`, `import-events`)
from runyard.cli import bundle as _bundle  # noqa: E402, F401  (registers `runyard bundle`)
from runyard.cli import deadletters as _deadletters  # noqa: E402, F401  (registers `runyard dead-letters`)
from runyard.cli import ft as _ft  # noqa: E402, F401  (registers `runyard ft-log`, `stacks`)
from runyard.cli import logs as _logs  # noqa: E402, F401  (registers `runyard logs`)
from runyard.cli import projections as _projections  # noqa: E402, F401  (registers `runyard projections`)
from runyard.cli import ps as _ps  # noqa: E402, F401  (registers `runyard ps`)
from runyard.cli import rebuild as _rebuild  # noqa: E402, F401  (registers `runyard rebuild`)
from runyard.cli import replay  # noqa: E402  (registers `runyard diff`; show/pools --at)
from runyard.cli import trace as _trace  # noqa: E402, F401  (registers `runyard trace`)
from runyard.cli import whatif as _whatif  # noqa: E402, F401  (registers `runyard whatif`)

if __name__ == "__main__":
    app()
