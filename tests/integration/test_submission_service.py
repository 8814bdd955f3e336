"""The gateway and the submission service, talking over the internal gRPC API.

The submission service runs as `runyard.submission.main:run(ctx)` (its gRPC
address published in `ctx.endpoints["submission-grpc"]`, its credential from
the home's 0600 file); the gateway reads that address at each call. On the
real Postgres and the real broker: a spec accepted over the internal API is
appended by the submission service and published by the relay; a refused
one answers the same coded error the rules raise; the internal port refuses
a call without the platform's credential; and with the submission service
down the gateway answers 503 with Retry-After naming it, and writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from aiokafka import AIOKafkaConsumer
from grpc_health.v1 import health_pb2, health_pb2_grpc
from runyard.api.auth import Principal, create_token
from runyard.contracts.resources import Catalogue
from runyard.contracts.rpc import credential
from runyard.contracts.rpc import submission_pb2 as pb
from runyard.contracts.rpc import submission_pb2_grpc as pb_grpc
from runyard.contracts.spec import TaskSpec
from runyard.contracts.webhooks import policy_of
from runyard.gateway.app import Gateway
from runyard.gateway.http import create_app
from runyard.gateway.submission_client import ENDPOINT, SubmissionClient
from runyard.messaging import KafkaSettings
from runyard.stack.context import ServiceContext
from runyard.submission import main as submission_main
from runyard.submission.errors import SubmissionError
from runyard.submission.pools import pool_views
from runyard.submission.rules import check_spec
from runyard.submission.service import Submissions

from tests.conftest import QUICK_GROUP
from tests.integration.test_gateway import BASE, config_dir
from tests.integration.test_relay import running_relay

pytestmark = pytest.mark.integration


@dataclass
class Services:
    """A submission service (`run(ctx)`), a gateway calling it, a member's client."""

    ctx: ServiceContext
    gateway: Gateway
    http: httpx.AsyncClient
    submission: asyncio.Task[None]

    async def counts(self) -> tuple[int, int, int]:
        """(events, secrets, submission calls) stored so far."""
        db = self.gateway.db
        return (
            int(await db.fetchval("SELECT count(*) FROM events")),
            int(await db.fetchval("SELECT count(*) FROM secrets")),
            int(await db.fetchval("SELECT count(*) FROM submission_calls")),
        )

    async def stop_submission(self) -> None:
        self.submission.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.submission


async def _published(ctx: ServiceContext) -> str:
    for _ in range(400):
        if address := ctx.endpoints.get(ENDPOINT):
            return address
        await asyncio.sleep(0.025)
    raise AssertionError("the submission service published no gRPC address")


@pytest.fixture
async def services(dsn: str, kafka: KafkaSettings, tmp_path: Path) -> AsyncIterator[Services]:
    ctx = ServiceContext(dsn=dsn, kafka=kafka, data_dir=tmp_path, config_dir=config_dir(tmp_path))
    submission = asyncio.create_task(submission_main.run(ctx), name="submission")
    await _published(ctx)
    token = credential.service_token({}, tmp_path)  # the file the service made, 0600
    client = SubmissionClient(ctx.endpoints, token)
    gateway = await Gateway.connect(dsn, ctx.config_dir, submission=client)
    member = await create_token(gateway.db, "t1", "alice", "member")
    transport = httpx.ASGITransport(app=create_app(gateway))
    headers = {"Authorization": f"Bearer {member}"}
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gw", headers=headers
        ) as http:
            yield Services(ctx, gateway, http, submission)
    finally:
        submission.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await submission
        await gateway.close()


async def test_a_spec_is_appended_by_the_submission_service_and_published(
    services: Services,
) -> None:
    async with running_relay(services.gateway.store, services.ctx.kafka):
        created = await services.http.post(
            "/v1/tasks", json={**BASE, "env": "TOKEN=s3cret", "creator_only": ["TOKEN"]}
        )
        assert created.status_code == 201, created.text
        task = created.json()
        assert (task["status"], task["creator"]) == ("new", "alice")
        assert task["spec"]["env"] == [
            {"name": "TOKEN", "value": "s3cret", "creator_only": True, "secret_ref": None}
        ]
        events = await services.gateway.store.read_stream(f"task-{task['task_id']}")
        assert [e.type for e in events] == ["TaskSubmitted"]
        assert events[0].metadata.actor == "user:t1/alice"
        sealed = events[0].event.spec.env[0]  # type: ignore[attr-defined]
        assert (sealed.value, sealed.secret_ref is not None) == (None, True)
        consumer = AIOKafkaConsumer(
            services.ctx.kafka.topics.for_category("task"),
            bootstrap_servers=services.ctx.kafka.bootstrap,
            auto_offset_reset="earliest",
            group_id="submission-test",
            **QUICK_GROUP,  # a reader of its own: it joins in about a second
        )
        await consumer.start()
        try:
            message = await asyncio.wait_for(consumer.getone(), 30)
        finally:
            await consumer.stop()
    value = json.loads(message.value)
    assert (value["type"], value["stream_id"]) == ("TaskSubmitted", f"task-{task['task_id']}")
    assert "s3cret" not in message.value.decode()


async def _rules_refusal(services: Services, body: dict[str, Any]) -> dict[str, Any]:
    """What the submission rules, called here directly, say of `body`."""
    spec = TaskSpec.model_validate(body)
    folder = services.ctx.config_dir
    view = await services.gateway.catalogue_view(Principal("t1", "alice", "member"))
    catalogue = Catalogue.model_validate(view)
    pool = (await pool_views(services.gateway.db, folder)).get(spec.pool)
    with pytest.raises(SubmissionError) as refused:
        check_spec(spec, catalogue, pool, webhooks=policy_of(folder).refusal)
    return refused.value.to_dict()


@pytest.mark.parametrize(
    "change",
    [
        {"image": "no-such-image:1"},
        {"worker_spec": "9gpu"},
        {"env": [{"name": "RANK", "value": "3"}]},
        {"alerts": [{"webhook_url": "http://169.254.169.254/latest/meta-data/"}]},
    ],
)
async def test_a_refused_spec_answers_the_rules_code_field_and_hint(
    services: Services, change: dict[str, Any]
) -> None:
    body = {**BASE, **change}
    before = await services.counts()
    answer = await services.http.post("/v1/tasks", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json() == await _rules_refusal(services, body)
    assert await services.counts() == before


async def test_a_refused_group_item_names_its_item(services: Services) -> None:
    before = await services.counts()
    body = {"template": BASE, "items": [{"name": "a"}, {"image": "no-such-image:1"}]}
    answer = await services.http.post("/v1/groups", json=body)
    assert answer.status_code == 400, answer.text
    refusal = answer.json()
    assert (refusal["code"], refusal["field"], refusal["item"]) == (
        "image.not_found",
        "items[1].image",
        1,
    )
    assert refusal["hint"]
    assert await services.counts() == before


async def test_the_internal_api_needs_the_service_credential(services: Services) -> None:
    before = await services.counts()
    request = pb.SubmitTaskRequest(
        context=pb.CallContext(
            caller=pb.Caller(tenant="t1", user="mallory", role="platform_admin"),
            request_id="r1",
            call_id="c1",
        ),
        spec_json=json.dumps(BASE),
    )
    async with grpc.aio.insecure_channel(services.ctx.endpoints[ENDPOINT]) as channel:
        stub = pb_grpc.SubmissionStub(channel)
        for metadata in ((), ((credential.METADATA_KEY, "not-the-token"),)):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.SubmitTask(request, metadata=metadata, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        health = health_pb2_grpc.HealthStub(channel)  # the health check answers anyone
        answer = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    assert await services.counts() == before


async def test_a_retried_call_is_answered_as_the_first_and_written_once(
    services: Services,
) -> None:
    token = credential.service_token({}, services.ctx.data_dir)
    request = pb.SubmitTaskRequest(
        context=pb.CallContext(
            caller=pb.Caller(tenant="t1", user="alice", role="member"),
            request_id="req-1",
            call_id="call-1",
        ),
        spec_json=json.dumps(BASE),
    )
    async with grpc.aio.insecure_channel(services.ctx.endpoints[ENDPOINT]) as channel:
        stub = pb_grpc.SubmissionStub(channel)
        metadata = ((credential.METADATA_KEY, token),)
        first, again = await asyncio.gather(
            stub.SubmitTask(request, metadata=metadata, timeout=30),
            stub.SubmitTask(request, metadata=metadata, timeout=30),
        )
        later = await stub.SubmitTask(request, metadata=metadata, timeout=30)
    assert first.task_id == again.task_id == later.task_id
    streams = await services.gateway.db.fetchval(
        "SELECT count(*) FROM streams WHERE stream_id LIKE 'task-%'"
    )
    assert streams == 1
    kept = Submissions(services.gateway.store, services.ctx.config_dir)
    assert (await kept.forget_calls(3600), await kept.forget_calls(0)) == (0, 1)


async def test_submission_down_is_a_503_naming_it_and_nothing_is_written(
    services: Services,
) -> None:
    created = await services.http.post("/v1/tasks", json=BASE)
    assert created.status_code == 201, created.text
    task_id = created.json()["task_id"]
    await services.http.post(f"/v1/tasks/{task_id}/stop")
    await services.stop_submission()
    assert ENDPOINT not in services.ctx.endpoints
    before = await services.counts()
    for method, path, body in (
        ("POST", "/v1/tasks", {**BASE, "env": "K=v", "creator_only": ["K"]}),
        ("POST", f"/v1/tasks/{task_id}/rerun", {}),
        ("POST", f"/v1/tasks/{task_id}/clone", {}),
        ("POST", "/v1/groups", {"template": BASE, "items": [{}]}),
    ):
        answer = await services.http.request(method, path, json=body)
        assert answer.status_code == 503, (path, answer.text)
        assert answer.headers["Retry-After"] == "2"
        error = answer.json()
        assert error["code"] == "service.unavailable"
        assert "submission service" in error["message"] and "submission" in error["hint"]
    assert await services.counts() == before
    # Reads go on: the task list and the task are the gateway's own.
    assert (await services.http.get(f"/v1/tasks/{task_id}")).status_code == 200


async def test_a_moved_submission_service_is_found_at_its_new_address(
    services: Services,
) -> None:
    """Stopped, then started again on another port: the gateway's next call finds it."""
    await services.stop_submission()
    services.submission = asyncio.create_task(submission_main.run(services.ctx))
    await _published(services.ctx)
    created = await services.http.post("/v1/tasks", json=BASE)
    assert created.status_code == 201, created.text
