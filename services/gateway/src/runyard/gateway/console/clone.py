"""Clone with the whole spec: `/tasks/{id}/clone`.

The submit form (`/submit?clone={id}`) holds only the fields it has; this page
holds every field the API's spec carries (mounts, alerts, fault-tolerance and
spot options, output directories, tags, ...) as YAML in a textarea, prefilled
with the task's spec as the caller sees it. Creator-only variables are left
out, even for the creator (their names are listed, to be entered again). The
edited spec is submitted as the form's is (`Gateway.create_task`, the use case
of `POST /v1/tasks`); a refusal shows the rules' code, field, message and
hint beside the text, which is kept as typed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from fastapi import Request as HttpRequest
from fastapi.responses import RedirectResponse, Response
from runyard.api.inputs import parse_body
from runyard.contracts.requests import TaskSubmission
from runyard.errors import RunyardError
from runyard.gateway.console import yamltext
from runyard.gateway.console.pages import PREFIX, Console, SignedIn, render


def clone_spec(spec: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The spec to clone, creator-only variables left out, and their names."""
    env = list(spec.get("env") or [])
    hidden = [str(v["name"]) for v in env if v.get("creator_only")]
    copied = {k: v for k, v in spec.items() if v is not None}
    copied["env"] = [dict(v) for v in env if not v.get("creator_only")]
    return copied, hidden


def spec_text(spec: Mapping[str, Any]) -> str:
    """The spec as YAML, in the API's field order."""
    text: str = yaml.safe_dump(dict(spec), sort_keys=False, allow_unicode=True, width=100)
    return text


def parse_spec(text: str) -> dict[str, Any]:
    """The spec of the textarea: a YAML (or JSON) mapping, read as a task file is
    (`runyard.contracts.yamlcore`: `value: no` is text); 400 `console.spec_yaml` else."""
    loaded: dict[str, Any] = yamltext.load_mapping(
        text,
        code="console.spec_yaml",
        what="the spec",
        hint="fix the line it names (YAML or JSON, one mapping of the spec's fields)",
        field="spec",
        shape="name: ..., pool: ..., command: ...",
    )
    return loaded


async def clone_form(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """The task's whole spec as editable YAML (404 for a task the caller may not read)."""
    task = await console.gw.get_task(who.principal, request.path_params["task_id"])
    spec, hidden = clone_spec(task["spec"])
    return render("clone.html", who, task=task, text=spec_text(spec), hidden=hidden, error=None)


async def clone(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """Submit the edited spec as a new task; a refusal shown inline, the text kept."""
    form = await console.form(request, who)
    task = await console.gw.get_task(who.principal, request.path_params["task_id"])
    _, hidden = clone_spec(task["spec"])
    text = form.get("spec", "")
    try:
        spec = parse_body(TaskSubmission, parse_spec(text))
        created = await console.gw.create_task(who.request(), spec)
    except RunyardError as exc:
        return render(
            "clone.html",
            who,
            status=exc.http_status,
            task=task,
            text=text,
            hidden=hidden,
            error=exc,
        )
    return RedirectResponse(f"{PREFIX}/tasks/{created['task_id']}", status_code=303)


PAGES = (
    ("GET", "/tasks/{task_id}/clone", clone_form),
    ("POST", "/tasks/{task_id}/clone", clone),
)
