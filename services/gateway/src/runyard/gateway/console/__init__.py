"""The web console: server-rendered pages (Jinja2) made live with htmx, served by
the gateway at its own address (`/` opens it); see docs/console.md and
docs/adr/0006-console-server-rendered-htmx.md.

`install_console(app, gateway, owners)` is all the gateway's app calls: it
mounts the pages, the static files (htmx, the style sheet, one script) and the
security headers of every console answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from runyard.errors import RunyardError
from runyard.gateway.app import Gateway
from runyard.gateway.console import (
    alerts_page,
    clone,
    groups_page,
    lint,
    live,
    pools_page,
    sre,
    sre_replay,
    task_pages,
    tokens_page,
)
from runyard.gateway.console.pages import PREFIX, Console, console_router, error_page
from runyard.gateway.console.sessions import PostgresSessions
from runyard.gateway.proxy import Owners
from starlette.datastructures import MutableHeaders

STATIC = Path(__file__).parent / "static"
#: No inline script or style anywhere (the chart is SVG attributes), no framing,
#: forms only to the console itself.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # no-referrer would make every Origin `null`
    "Cross-Origin-Opener-Policy": "same-origin",
}


class ConsoleHeaders:
    """ASGI middleware: the security headers on the console's answers (only theirs:
    the JSON API keeps its own)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else None
        if path is None or not (path == "/" or path.startswith(PREFIX)):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, with_headers)


def console_refusal(scope: Any, error: RunyardError) -> tuple[bytes, str] | None:
    """A refusal the gateway makes before any page runs (a form's body over the limit,
    `runyard.api.inputs.BodyLimit`) as the console's error page, for the console's
    paths; None elsewhere (the API's JSON)."""
    path = scope.get("path", "")
    if not (path == "/" or path.startswith(PREFIX + "/") or path == PREFIX):
        return None
    page = error_page(error, None)
    return bytes(page.body), "text/html; charset=utf-8"


def install_console(app: FastAPI, gateway: Gateway, owners: Owners) -> Console:
    """Mount the console on the gateway's app; answers it (its sessions, for tests).
    It is also `app.state.console`: close it when the gateway stops serving."""
    console = Console(gateway, owners, PostgresSessions(lambda: gateway.db))
    app.state.console = console
    app.mount(PREFIX + "/static", StaticFiles(directory=STATIC), name="console-static")
    more = (
        *task_pages.PAGES,
        *clone.PAGES,
        *lint.PAGES,
        *pools_page.PAGES,
        *sre.PAGES,
        *sre_replay.PAGES,
        *alerts_page.PAGES,
        *groups_page.PAGES,
        *tokens_page.PAGES,
        *live.PAGES,
    )
    app.include_router(console_router(console, more))
    app.add_middleware(ConsoleHeaders)
    return console


__all__ = ["SECURITY_HEADERS", "Console", "console_refusal", "install_console"]
