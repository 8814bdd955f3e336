"""API tokens, for admins who never open a terminal (`runyard token ...`,
`/v1/admin/tokens`): a tenant admin brings its team in and out, a platform admin
any tenant's.

- `/tokens`: the tokens of the caller's tenant (a platform admin: every tenant's,
  or one with `?tenant=`), newest first, without their secrets: user, role, state,
  description, who made it, when it expires; with *Include revoked* the revoked
  ones too; **Revoke** on each active one (confirmed; effective at its next
  request); and the form to make one: user, role (those the caller may grant),
  lifetime (`30d`, `12h`, ...; empty: 30 days), description, and for a platform
  admin the tenant;
- `POST /tokens`: make it, through the use case of `POST /v1/admin/tokens` (who
  may mint for whom: docs/api.md); the next page shows the token, once: it is
  never stored in clear and never shown again. A refusal shows its code, field
  and hint above the form, kept as typed;
- `POST /tokens/{id}/revoke`: revoke one (`DELETE /v1/admin/tokens/{id}`).

Every page and change needs the tenant_admin or platform_admin role (403
`auth.admin_only` for others) and every change the session's CSRF token.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import Request as HttpRequest
from fastapi.responses import RedirectResponse, Response
from runyard.api.auth import TENANT_ADMIN_GRANTS
from runyard.api.errors import Conflict
from runyard.api.inputs import parse_body
from runyard.contracts.requests import TokenRequest
from runyard.errors import RunyardError
from runyard.gateway.console.pages import PREFIX, Console, SignedIn, render, typed_int

#: Every role, in the order the form offers them (a platform admin grants all).
ROLES = ("member", "tenant_admin", "service", "sre", "platform_admin")


async def tokens(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """The tokens the caller manages, and the form to make one."""
    return await _page(console, request, who, form={}, error=None)


async def create(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """Make a token; the page that shows it once, or the refusal above the form."""
    form = await console.form(request, who)
    body: dict[str, Any] = {
        "tenant": form.get("tenant", "").strip() or who.principal.tenant,
        "user": form.get("user", "").strip(),
        "role": form.get("role", "member"),
    }
    if ttl := form.get("ttl", "").strip():
        # seconds as a number; any other text as typed (the rules name what is wrong)
        number = typed_int(ttl)
        body["ttl"] = ttl if number is None else number
    if description := form.get("description", "").strip():
        body["description"] = description
    try:
        wanted = parse_body(TokenRequest, body)
        await _not_made_already(console, who, wanted, form.get("shown_at", ""))
        made = await console.gw.create_token(who.request(), wanted)
    except RunyardError as exc:
        return await _page(console, request, who, form=form, error=exc, status=exc.http_status)
    return render("token_made.html", who, status=201, token=made)


async def _not_made_already(
    console: Console, who: SignedIn, wanted: TokenRequest, shown_at: str
) -> None:
    """409 `console.token_made_already` when the caller made a token for this tenant, user
    and role since the form was shown (`shown_at`, the database's clock): the form sent
    again (the page that showed the token reloaded, the browser's resubmit) would make a
    second live token while the first, shown once, is lost."""
    try:
        since = datetime.fromisoformat(shown_at)
    except ValueError:
        return
    if since.tzinfo is None:
        return
    caller = who.principal
    listed = await console.gw.list_tokens(
        caller, wanted.tenant if caller.is_platform_admin else None, False
    )
    for token in listed["items"]:
        mine = (token["tenant"], token["user"], token["role"], token["created_by"])
        if mine == (wanted.tenant, wanted.user, wanted.role, caller.actor) and (
            datetime.fromisoformat(token["created_at"]) >= since
        ):
            raise Conflict(
                "console.token_made_already",
                f"this form made a token for {wanted.user} ({wanted.role}) already:"
                f" {token['token_id']}, at {token['created_at']}; it was shown once and"
                " is not shown again",
                "if it was lost, revoke it in the list and make another (a form opened anew)",
                "user",
            )


async def revoke(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """Revoke one token (one the caller may not manage: 404 or 403, as the API)."""
    form = await console.form(request, who)
    await console.gw.revoke_token(who.request(), request.path_params["token_id"])
    # back to the list as it was shown (its tenant, revoked ones or not)
    shown = {k: form[k] for k in ("tenant", "revoked") if form.get(k)}
    return RedirectResponse(
        f"{PREFIX}/tokens" + (f"?{urlencode(shown)}" if shown else ""), status_code=303
    )


async def _page(
    console: Console,
    request: HttpRequest,
    who: SignedIn,
    *,
    form: dict[str, str],
    error: RunyardError | None,
    status: int = 200,
) -> Response:
    caller = who.principal
    caller.require_token_admin()
    tenant = request.query_params.get("tenant", "").strip() or None
    revoked = request.query_params.get("revoked") == "1"
    listed = await console.gw.list_tokens(caller, tenant, revoked)
    grantable = [r for r in ROLES if caller.is_platform_admin or r in TENANT_ADMIN_GRANTS]
    kept = {k: v for k, v in form.items() if k in ("tenant", "user", "role", "ttl", "description")}
    # the form's own time, so that sending it again makes no second token
    shown_at: datetime = await console.gw.db.fetchval("SELECT now()")
    return render(
        "tokens.html",
        who,
        status=status,
        tokens=listed["items"],
        truncated=listed.get("truncated", False),
        roles=grantable,
        # a token of a role the caller may not grant it may not revoke either
        revocable=grantable,
        tenant=tenant or "",
        revoked=revoked,
        form=kept,
        shown_at=shown_at.isoformat(),
        error=error,
    )


PAGES = (
    ("GET", "/tokens", tokens),
    ("POST", "/tokens", create),
    ("POST", "/tokens/{token_id}/revoke", revoke),
)
