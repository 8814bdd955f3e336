"""Events of admin actions outside the pools: API tokens and the catalogue.

Pool admin changes (nodes, spot capacity) are pool events. The others are
recorded here, each with the admin who made it as the event's actor:

- category `access`, stream `access-<token_id>`: a token was issued, then
  maybe revoked. The gateway's `api_tokens` table is written in the same
  transaction; it holds only the token's sha256, and no event holds the token.
- category `catalogue`, stream `catalogue-<kind>`: an image, volume or public
  data entry was added or replaced. The `catalogue_entries` table, written
  in the same transaction, is what the gateway loads at start.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field
from runyard.contracts.base import Event

TokenRole = Literal["platform_admin", "tenant_admin", "member", "service", "sre"]


class _AccessEvent(Event):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
    category = "access"
    emitted_by = "gateway"


class TokenIssued(_AccessEvent):
    """An API token was minted: for whom, with which role, until when.

    When: a tenant or platform admin called `POST /v1/admin/tokens`, or
    `runyard up` made its dev token (actor `system:runyard-up`).
    """

    token_id: str = Field(min_length=1)
    """The token's public id (lists and revocation name it; it is not the secret)."""
    tenant: str = Field(min_length=1)
    user: str = Field(min_length=1)
    role: TokenRole
    description: str = ""
    expires_at: datetime


class TokenRevoked(_AccessEvent):
    """An API token was revoked: from this event on, it authenticates nothing.

    When: a tenant or platform admin called `DELETE /v1/admin/tokens/{id}`.
    """

    token_id: str = Field(min_length=1)
    tenant: str = Field(min_length=1)
    user: str = Field(min_length=1)
    role: TokenRole


#: Every event of the `access` category.
ACCESS_EVENTS: tuple[type[Event], ...] = (TokenIssued, TokenRevoked)


class CatalogueEntrySet(Event):
    """An entry of the catalogue was added or replaced by a platform admin.

    When: `POST /v1/admin/images`, `/v1/admin/volumes` or `/v1/admin/public-data`.
    The submission rules use the new entry from the next request on.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
    category = "catalogue"
    emitted_by = "gateway"

    kind: Literal["image", "volume", "public_data"]
    key: str = Field(min_length=1)
    """What a later change of the same entry replaces (image name; fs/volume/zone; zone)."""
    entry: dict[str, Any]
    """The entry as the API answered it."""


#: Every event of the `catalogue` category.
CATALOGUE_EVENTS: tuple[type[Event], ...] = (CatalogueEntrySet,)
