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

from typing import Any

from fastapi import Request as HttpRequest
from fastapi.responses import RedirectResponse, Response
from runyard.api.auth import TENANT_ADMIN_GRANTS
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
        made = await console.gw.create_token(who.request(), parse_body(TokenRequest, body))
    except RunyardError as exc:
        return await _page(console, request, who, form=form, error=exc, status=exc.http_status)
    return render("token_made.html", who, status=201, token=made)


async def revoke(console: Console, request: HttpRequest, who: SignedIn) -> Response:
    """Revoke one token (one the caller may not manage: 404 or 403, as the API)."""
    await console.form(request, who)
    await console.gw.revoke_token(who.request(), request.path_params["token_id"])
    return RedirectResponse(f"{PREFIX}/tokens", status_code=303)


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
    return render(
        "tokens.html",
        who,
        status=status,
        tokens=listed["items"],
        roles=grantable,
        # a token of a role the caller may not grant it may not revoke either
        revocable=grantable,
        tenant=tenant or "",
        revoked=revoked,
        form=kept,
        error=error,
    )


PAGES = (
    ("GET", "/tokens", tokens),
    ("POST", "/tokens", create),
    ("POST", "/tokens/{token_id}/revoke", revoke),
)
