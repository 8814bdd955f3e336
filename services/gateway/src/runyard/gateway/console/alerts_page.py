"""The tenant's Feishu alert subscriptions, for people who never open a terminal
(`runyard alerts ls|add|rm`, `/v1/alert-subscriptions`):

- `/alerts`: the tenant's subscriptions (webhook masked, alerts, signed, queued
  threshold, card or text) and a form to add one: the bot's webhook, the alerts
  (comma-separated, `queued:<seconds>` for a threshold; empty: the defaults),
  its signing secret (a password field: sent once, never shown again) and text
  only;
- `POST /alerts`: add it; `POST /alerts/{id}/delete`: remove one (each with the
  session's CSRF token).

The notification service answers, asked with the signed-in user's own token, so
the roles, the webhook rules and the limits are its own (docs/notifications.md);
a refusal shows its code, field and hint above the form, the form kept as typed
but for the secret.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import Request as HttpRequest
from fastapi.responses import RedirectResponse, Response
from runyard.errors import RunyardError
from runyard.gateway.console.pages import PREFIX, Console, SignedIn, render

SUBSCRIPTIONS = "/v1/alert-subscriptions"


async def alerts_page(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """The tenant's subscriptions and the form to add one."""
    return await _page(console, who, form={}, error=None)


async def add(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """Subscribe a bot to the tenant's alerts; the page again, or the refusal on it."""
    form = await console.form(request, who)
    body: dict[str, Any] = {"webhook_url": form.get("webhook_url", "").strip()}
    kinds = [a.strip() for a in form.get("alerts", "").split(",") if a.strip()]
    if kinds:
        body["alerts"] = kinds
    if form.get("secret"):
        body["secret"] = form["secret"]
    if form.get("text_only") == "1":
        body["text_only"] = True
    try:
        await console.owners.call(
            "notification", "POST", SUBSCRIPTIONS, token=who.session.token, body=body
        )
    except RunyardError as exc:
        kept = {k: v for k, v in form.items() if k in ("webhook_url", "alerts", "text_only")}
        return await _page(console, who, form=kept, error=exc, status=exc.http_status)
    return RedirectResponse(f"{PREFIX}/alerts", status_code=303)


async def delete(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """Remove one of the tenant's subscriptions (another tenant's id: a 404)."""
    await console.form(request, who)
    sub_id = quote(request.path_params["sub_id"], safe="")
    await console.owners.call(
        "notification", "DELETE", f"{SUBSCRIPTIONS}/{sub_id}", token=who.session.token
    )
    return RedirectResponse(f"{PREFIX}/alerts", status_code=303)


async def _page(
    console: Console,
    who: SignedIn,
    *,
    form: dict[str, str],
    error: RunyardError | None,
    status: int = 200,
) -> Response:
    listed = await console.owners.call(
        "notification", "GET", SUBSCRIPTIONS, token=who.session.token
    )
    items = (listed.get("items") or []) if isinstance(listed, dict) else []
    return render("alerts.html", who, status=status, subscriptions=items, form=form, error=error)


PAGES = (
    ("GET", "/alerts", alerts_page),
    ("POST", "/alerts", add),
    ("POST", "/alerts/{sub_id}/delete", delete),
)
