"""`runyard bundle ID [-o FILE]`: a task's support bundle (R-70), one zip file.

    runyard bundle ID                  writes runyard-bundle-ID.zip here
    runyard bundle ID -o FILE          writes FILE
    runyard bundle ID --json           prints {"path", "bytes"} when done

The gateway gathers the bundle (docs/support-bundle.md) and refuses one that
would be too large or would hold a secret: then no file is written. A FILE that
cannot be written is refused before the gateway is asked. The download goes to
`FILE.part` first and takes the file's name only when it is whole
(`runyard.cli.files`), so a cut connection never leaves a bundle that looks
complete. Progress goes to stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import httpx
import typer
from runyard.cli.files import check_target, save
from runyard.cli.main import (
    EXIT_UNREACHABLE,
    JsonOpt,
    TokenOpt,
    UrlOpt,
    app,
    err,
    gateway,
    out,
    segment,
    show_json,
)
from runyard.cli.terminal import markup
from runyard.client import GatewayUnreachable

#: Gathering a bundle of a long task takes time before the first byte comes.
READ_TIMEOUT_S = 300.0


def default_target(task_id: str) -> Path:
    """`runyard-bundle-ID.zip` in the current folder (a `/` in the id cannot escape it)."""
    return Path(f"runyard-bundle-{task_id.replace('/', '_')}.zip")


def download(url: str | None, token: str | None, task_id: str, target: Path) -> int:
    """Stream the bundle into `target` (through `target.part`); its size in bytes."""
    timeout = httpx.Timeout(30.0, read=READ_TIMEOUT_S)
    with gateway(url, token) as api:
        try:
            path = f"/v1/tasks/{segment(task_id)}/bundle"
            with api.stream("GET", path, http_timeout=timeout) as answer:
                return save(answer, target)
        except GatewayUnreachable as exc:  # a body cut short too (`save`)
            err.print(f"[red]error:[/red] the bundle did not arrive whole: {markup(exc.message)}")
            err.print("hint: check that the gateway runs (`runyard up`, --url), then try again")
            raise typer.Exit(EXIT_UNREACHABLE) from exc


@app.command("bundle")
def bundle(
    task_id: str,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="The file to write (default runyard-bundle-ID.zip)."),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A task's support bundle: summary, spec, events, FT log, log tails, in one zip."""
    target = output or default_target(task_id)
    check_target(target)
    err.print(f"gathering the bundle of task {markup(task_id)}...")
    size = download(url, token, task_id, target)
    if as_json:
        show_json({"path": str(target.resolve()), "bytes": size})
    else:
        out.print(f"wrote {markup(target)} ({size} bytes)")
