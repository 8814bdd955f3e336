"""A submission service beside every gateway a test builds in its own process.

The gateway sends what users submit to the submission service over its
internal gRPC API. Tests that build a `Gateway` themselves
(`Gateway.connect(dsn, config_dir)`) get, through the autouse fixture of
tests/conftest.py, a submission service on the same database and config
folder, listening on a free loopback port with a credential of its own, and
stopped when the gateway is closed. A gateway given its client
(`submission=...`, as `runyard.gateway.main` and the platform's tests do) is
left as it is.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
from runyard.contracts import EventMapper
from runyard.gateway.submission_client import ENDPOINT, SubmissionClient
from runyard.submission.server import start_server
from runyard.submission.service import Submissions


async def submission_beside(
    dsn: str, config_dir: Path, mapper: EventMapper | None = None
) -> tuple[SubmissionClient, Submissions]:
    """A running submission service on `dsn` and `config_dir`, and a gateway's client of
    it that stops it when closed."""
    service = await Submissions.connect(dsn, config_dir, mapper)
    token = secrets.token_urlsafe(16)
    server, address = await start_server(service, "127.0.0.1:0", token)

    async def stop() -> None:
        await server.stop(grace=None)
        await service.close()

    return SubmissionClient({ENDPOINT: address}, token, on_close=[stop]), service


@pytest.fixture(autouse=True)
def submission_beside_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `Gateway.connect` without a submission client start one beside it."""
    from runyard.gateway.app import Gateway

    connect = Gateway.connect.__func__  # type: ignore[attr-defined]

    async def with_submission(
        cls: type[Gateway],
        /,
        dsn: str,
        config_dir: Path,
        mapper: EventMapper | None = None,
        *,
        submission: SubmissionClient | None = None,
        **kw: Any,
    ) -> Any:
        if submission is None:
            submission, _ = await submission_beside(dsn, config_dir, mapper)
        return await connect(cls, dsn, config_dir, mapper, submission=submission, **kw)

    monkeypatch.setattr(Gateway, "connect", classmethod(with_submission))
