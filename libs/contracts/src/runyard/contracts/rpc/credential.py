"""The service credential of the internal gRPC APIs.

An internal API trusts the caller fields a call carries (the principal the
gateway authenticated), so only the platform's own services may call it:
every call carries this shared secret in its metadata, and a call without it
is refused before any handler runs. Where it comes from, first found:

1. the setting `internal_token` (whoever starts the service passes it);
2. the environment variable RUNYARD_INTERNAL_TOKEN (a container, a supervisor);
3. the file `run/internal-token` of the platform's home (RUNYARD_HOME), created
   with mode 0600 by the first service that needs it, so services started on
   one host from one home agree without being told.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The metadata key of the credential.
METADATA_KEY = "x-runyard-service-token"
ENV_VARIABLE = "RUNYARD_INTERNAL_TOKEN"
SETTING = "internal_token"
FILE_NAME = "internal-token"


def service_token(settings: Mapping[str, Any], home: Path) -> str:
    """The platform's service credential (see the module docstring)."""
    given = settings.get(SETTING) or os.environ.get(ENV_VARIABLE, "")
    if given:
        return str(given)
    return _load_or_create(home / "run" / FILE_NAME)


def _load_or_create(path: Path) -> str:
    """The token in `path`, written whole first (a hard link of a finished file, so
    services starting together never read a half-written one, and the first wins)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32))
        try:
            with contextlib.suppress(FileExistsError):
                os.link(draft, path)
        finally:
            draft.unlink()
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise PermissionError(
            f"{path} holds the services' credential but has mode {mode:o}: run `chmod 600 {path}`"
        )
    token = path.read_text().strip()
    if not token:
        raise PermissionError(f"{path} is empty: remove it and start the services again")
    return token


def matches(given: str | None, expected: str) -> bool:
    """Whether `given` is the credential, compared in constant time."""
    return given is not None and secrets.compare_digest(given.encode(), expected.encode())
