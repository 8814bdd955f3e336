"""The submit form's launch-command warnings, shown while the command is typed.

The same checks the submission rules run on every spec (R-14,
`runyard.domain.launch_command`: pipes without pipefail, commands that mask a
failure, conda before it is initialised), called on the form's command alone
by an htmx POST (it carries the session's CSRF token, like every POST; it
changes nothing). Warnings never stop a submission.
"""

from __future__ import annotations

from fastapi import Request as HttpRequest
from fastapi.responses import Response
from runyard.domain.launch_command import command_warnings
from runyard.gateway.console.pages import Console, SignedIn, render

#: A longer command is not checked here (the rules refuse it on submit, with a hint).
MAX_COMMAND = 20_000


async def lint(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """The warnings of the form's launch command, as a fragment."""
    form = await console.form(request, who)
    command = form.get("command", "")
    warnings = command_warnings(command) if len(command) <= MAX_COMMAND else []
    return render("command_warnings.html", who, warnings=warnings)


PAGES = (("POST", "/submit/lint", lint),)
