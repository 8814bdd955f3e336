"""Limits: no request of one tenant can wedge the platform, crash a handler or write
half a task (docs/limits.md). One test per finding; each failed before the limits.

Every refusal is a 4xx with the field and a hint, and writes nothing: the event
count and the secret store are compared before and after.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
from aiokafka import AIOKafkaConsumer
from runyard.api.auth import Principal
from runyard.contracts import Metadata, NewEvent
from runyard.contracts.envelope import utcnow
from runyard.contracts.spec import TaskSpec
from runyard.domain import Submit, decide
from runyard.eventstore import MAX_EVENT_BYTES, EventTooLarge, PostgresEventStore
from runyard.gateway import grpc_convert as convert
from runyard.gateway.grpc_gen import tasks_pb2 as pb
from runyard.gateway.grpc_gen import tasks_pb2_grpc as pb_grpc
from runyard.gateway.grpc_server import start_server
from runyard.messaging import KafkaSettings
from runyard.relay import OutboxRelay

from tests.conftest import QUICK_GROUP
from tests.contract.sample_events import Renamed, happened, sample_mapper
from tests.integration import test_gateway
from tests.integration.test_gateway import BASE, Api
from tests.integration.test_relay import running_consumer, wait_until

pytestmark = pytest.mark.integration
api = test_gateway.api  # the same fixture: an in-process gateway and a client per user


async def written(api: Api) -> tuple[int, int]:
    """(events, secrets) stored so far."""
    db = api.gateway.db
    return (
        int(await db.fetchval("SELECT count(*) FROM events")),
        int(await db.fetchval("SELECT count(*) FROM secrets")),
    )


async def refused(
    api: Api, answer: httpx.Response, code: str, field: str, before: tuple[int, int]
) -> dict[str, Any]:
    """The answer is a 4xx naming `field` with `code` and a hint, and nothing was written."""
    assert 400 <= answer.status_code < 500, answer.text
    body: dict[str, Any] = answer.json()
    assert (body["code"], body["field"]) == (code, field), body
    assert body["hint"], body
    assert await written(api) == before
    return body


# -- sizes of what a task carries ---------------------------------------------------------


async def test_a_1mb_description_is_refused_and_nothing_is_written(api: Api) -> None:
    before = await written(api)
    answer = await api.submit(description="d" * 1_000_000, env="KEY=v", creator_only=["KEY"])
    body = await refused(api, answer, "spec.invalid", "description", before)
    assert "4096" in body["message"]


async def test_a_body_over_1mib_is_413_before_it_is_parsed(api: Api) -> None:
    before = await written(api)
    answer = await api.submit(description="d" * 2_000_000)
    assert answer.status_code == 413
    await refused(api, answer, "request.too_large", "body", before)


async def test_a_chunked_body_over_1mib_is_413_while_it_arrives(api: Api) -> None:
    """No Content-Length: the gateway counts while reading and stops at the limit."""
    sent: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"name": "x", "description": "'
        for _ in range(64):
            sent.append(1)
            yield b"d" * 65536
        yield b'"}'

    before = await written(api)
    answer = await api.call("alice", "POST", "/v1/tasks", content=chunks())
    assert answer.status_code == 413
    await refused(api, answer, "request.too_large", "body", before)
    # The 16th 64 KiB chunk takes the body past 1 MiB; nothing after it is read.
    assert len(sent) == 16


async def test_a_512kb_command_is_refused_and_other_requests_are_answered(api: Api) -> None:
    """The command limit (64 KiB) is checked before any rule looks at the command."""
    before = await written(api)
    submit = api.submit(command="python train.py | tee log\n" * 20_000)
    pools = api.call("bob", "GET", "/v1/pools")
    answer, listed = await asyncio.gather(submit, pools)
    await refused(api, answer, "spec.invalid", "command", before)
    assert listed.status_code == 200 and listed.json()


async def test_a_64kb_command_of_pipes_is_accepted_with_a_few_warnings(api: Api) -> None:
    answer = await api.submit(command=("python train.py | tee log\n" * 2600)[:65536])
    assert answer.status_code == 201, answer.text
    assert 1 <= len(answer.json()["warnings"]) <= 5


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"tags": [f"t{i}" for i in range(10_000)]}, "tags"),
        ({"tags": ["x" * 65]}, "tags.0"),
        ({"env": [{"name": f"V{i}", "value": "1"} for i in range(10_000)]}, "env"),
        ({"alerts": [{"webhook_url": "https://open.feishu.cn/x"}] * 1_000}, "alerts"),
        ({"mounts": [{"file_system": "f", "volume": "v", "mount_path": "/m"}] * 100}, "mounts"),
        ({"output_dirs": ["/mnt/x"] * 1_000}, "output_dirs"),
        ({"name": "n" * 201}, "name"),
        ({"image": "i" * 513}, "image"),
        ({"worker_count": 10**12}, "worker_count"),
        ({"worker_spec": None, "custom_gpus": 10**12}, "custom_gpus"),
        ({"priority": 10**12}, "priority"),
        ({"fault_tolerance": {"hang_timeout_s": 10**12}}, "fault_tolerance.hang_timeout_s"),
        ({"fault_tolerance": {"max_restarts": 10**12}}, "fault_tolerance.max_restarts"),
    ],
)
async def test_every_list_text_and_number_of_a_spec_is_bounded(
    api: Api, changes: dict[str, Any], field: str
) -> None:
    before = await written(api)
    await refused(api, await api.submit(**changes), "spec.invalid", field, before)


async def test_the_whole_environment_is_bounded(api: Api) -> None:
    env = [{"name": f"V{i}", "value": "x" * 16_000} for i in range(5)]
    before = await written(api)
    await refused(api, await api.submit(env=env), "env.too_large", "env", before)


async def test_the_limits_are_published_in_the_openapi_document(api: Api) -> None:
    document = (await api.http.get("/openapi.json")).json()
    schemas = document["components"]["schemas"]

    def body_of(path: str) -> dict[str, Any]:
        """The named model of the route's request body."""
        ref = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        named: dict[str, Any] = schemas[ref["schema"]["$ref"].rsplit("/", 1)[-1]]
        return named

    spec = body_of("/v1/tasks")["properties"]
    assert spec["command"]["maxLength"] == 65536
    assert spec["tags"]["maxItems"] == 32
    assert spec["worker_count"]["maximum"] == 1024
    assert (
        document["components"]["schemas"]["EnvVar"]["properties"]["value"]["anyOf"][0]["maxLength"]
        == 16384
    )
    group_id = body_of("/v1/groups")["properties"]["group_id"]
    assert group_id["anyOf"][0]["maxLength"] == 128


# -- text the store cannot hold, ids ------------------------------------------------------


async def post_json_text(api: Api, path: str, text: str) -> httpx.Response:
    """A body sent as JSON text as is (JSON can spell a lone surrogate: "\\ud800")."""
    headers = {"content-type": "application/json"}
    return await api.call("alice", "POST", path, content=text, headers=headers)


async def test_a_lone_surrogate_is_a_400_naming_the_field(api: Api) -> None:
    before = await written(api)
    listed = json.dumps({**BASE, "env": [{"name": "A", "value": "x\ud800"}]})
    answer = await post_json_text(api, "/v1/tasks", listed)
    body = await refused(api, answer, "request.invalid", "env[0].value", before)
    assert "surrogate" in body["message"]
    text = json.dumps({**BASE, "env": "A=x\udfff"})
    answer = await post_json_text(api, "/v1/tasks", text)
    await refused(api, answer, "request.invalid", "env", before)


async def test_deeply_nested_json_is_a_400(api: Api) -> None:
    before = await written(api)
    deep = "[" * 100_000 + "]" * 100_000
    answer = await api.call(
        "alice",
        "POST",
        "/v1/tasks",
        content=f'{{"name": "x", "description": {deep}}}',
        headers={"content-type": "application/json"},
    )
    await refused(api, answer, "request.invalid", "body", before)
    nested: Any = "x"
    for _ in range(40):
        nested = {"a": nested}
    answer = await api.submit(labels=nested)
    body = await refused(api, answer, "request.invalid", answer.json()["field"], before)
    assert "nested" in body["message"]


async def test_a_1mb_group_id_is_refused_and_nothing_is_written(api: Api) -> None:
    before = await written(api)
    group = {"template": BASE, "items": [{"name": "a"}], "group_id": "g" * 1_000_000}
    answer = await api.call("alice", "POST", "/v1/groups", json=group)
    await refused(api, answer, "request.invalid", "group_id", before)
    group["group_id"] = "g" * 129
    answer = await api.call("alice", "POST", "/v1/groups", json=group)
    await refused(api, answer, "request.invalid", "group_id", before)


async def test_a_task_whose_row_the_list_cannot_hold_still_appears(api: Api) -> None:
    """An event from before the limits (a 100 KB group id, too big for the index) must
    neither vanish from the list nor stop the projection for the tasks after it."""
    spec = TaskSpec.model_validate(BASE)
    now = utcnow()
    big = secrets.token_urlsafe(75_000)  # 100 KB that does not compress
    for task_id, group_id in (("old-big", big), ("after", None)):
        submit = Submit(task_id, "t1", "alice", spec, group_id=group_id)
        events = decide(None, submit, now=now, ids=lambda: str(uuid.uuid4()))
        meta = Metadata(actor="user:t1/alice")
        new = [NewEvent(event=e, metadata=meta, occurred_at=now) for e in events]
        await api.gateway.store.append(f"task-{task_id}", new)
    answer = await api.call("alice", "GET", "/v1/tasks")
    assert answer.status_code == 200, answer.text
    rows = {row["task_id"]: row for row in answer.json()["items"]}
    assert set(rows) == {"old-big", "after"}
    assert rows["old-big"]["group_id"] == big[:128]


async def test_an_8kb_request_id_is_refused(api: Api) -> None:
    before = await written(api)
    answer = await api.submit(headers={"X-Request-Id": "r" * 8192})
    await refused(api, answer, "request.invalid", "x-request-id", before)


async def test_a_100kb_tenant_name_cannot_be_given_a_token(api: Api) -> None:
    body = {"tenant": "t" * 100_000, "user": "u", "role": "member"}
    answer = await api.call("admin", "POST", "/v1/admin/tokens", json=body)
    assert answer.status_code == 400 and answer.json()["field"] == "tenant"
    tokens = await api.gateway.db.fetchval("SELECT count(*) FROM api_tokens")
    assert tokens == len(api.tokens)


async def test_a_log_search_until_year_9999_is_a_400(api: Api) -> None:
    task_id = (await api.submit()).json()["task_id"]
    for name in ("until", "since"):
        params = {name: "9999-12-31T23:59:59+00:00"}
        answer = await api.call("alice", "GET", f"/v1/tasks/{task_id}/logs", params=params)
        assert answer.status_code == 400, answer.text
        assert (answer.json()["code"], answer.json()["field"]) == ("logs.time_range", name)
    early = {"since": "0001-01-01T00:00:00+14:00"}
    answer = await api.call("alice", "GET", f"/v1/tasks/{task_id}/logs", params=early)
    assert answer.status_code == 400, answer.text


# -- paths and names that reach the hosts ------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/root", "/root/.ssh", "/var/lib/x", "/tmp/x", "/etc", "/proc/1", "/usr/local/x"]
)
async def test_mount_paths_on_system_directories_are_refused(api: Api, path: str) -> None:
    mounts = [{"file_system": "fs-main", "volume": "datasets", "mount_path": path}]
    before = await written(api)
    answer = await api.submit(mounts=mounts)
    body = await refused(api, answer, "mount.reserved_path", "mounts[0].mount_path", before)
    assert "/mnt" in body["hint"]


@pytest.mark.parametrize(
    "volume",
    [
        {"file_system": "../../..", "volume": "v", "zone": "cn-north-1"},
        {"file_system": "fs", "volume": "../../etc", "zone": "cn-north-1"},
        {"file_system": "fs", "volume": "a/b", "zone": "cn-north-1"},
        {"file_system": "fs", "volume": "..", "zone": "cn-north-1"},
        {"file_system": "fs", "volume": "v", "zone": "../z"},
    ],
)
async def test_volume_names_that_leave_the_volumes_root_are_refused(
    api: Api, volume: dict[str, str]
) -> None:
    reader = Principal("t1", "alice", "member")
    catalogue = await api.gateway.catalogue_view(reader)
    answer = await api.call("admin", "POST", "/v1/admin/volumes", json=volume)
    assert answer.status_code == 400, answer.text
    assert "no `/`" in answer.json()["message"]
    assert await api.gateway.catalogue_view(reader) == catalogue
    assert await api.gateway.db.fetchval("SELECT count(*) FROM catalogue_entries") == 0


# -- environment and patterns -------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["PATH", "RUNYARD_TASK_ID", "CUDA_VISIBLE_DEVICES", "BASH_ENV", "LD_PRELOAD", "RANK"]
)
async def test_variables_the_platform_sets_are_refused(api: Api, name: str) -> None:
    before = await written(api)
    answer = await api.submit(env=f"A=1;{name}=x")
    await refused(api, answer, "env.reserved_name", "env[1].name", before)


async def test_a_resume_pattern_re2_cannot_run_is_refused(api: Api) -> None:
    before = await written(api)
    fault_tolerance = {"auto_restart": True, "resume_pattern": r"step (\d+) \1"}
    answer = await api.submit(fault_tolerance=fault_tolerance)
    body = await refused(
        api, answer, "fault_tolerance.invalid_pattern", "fault_tolerance.resume_pattern", before
    )
    assert "RE2" in body["message"]


# -- gRPC ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def grpc_stub(api: Api) -> AsyncIterator[pb_grpc.TasksStub]:
    server, port = await start_server(api.gateway, "127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 8 << 20)]
    )
    try:
        yield pb_grpc.TasksStub(channel)
    finally:
        await channel.close()
        await server.stop(None)


def typed_spec(**changes: Any) -> pb.TaskSpec:
    spec = pb.TaskSpec()
    convert.to_message(spec, {**BASE, **changes})
    return spec


async def test_specs_over_their_bounds_over_grpc_are_refused(api: Api) -> None:
    """A typed spec cannot nest or carry a lone surrogate (protobuf refuses to encode
    one); what it can carry is bounded as over HTTP, and a refusal writes nothing."""
    auth = (("authorization", f"Bearer {api.tokens['alice']}"),)
    before = await written(api)
    async with grpc_stub(api) as stub:
        for spec, field in (
            (typed_spec(description="d" * 5000), "description"),
            (typed_spec(env=[{"name": "A", "value": "x\x00"}]), "spec.env[0].value"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.CreateTask(pb.CreateTaskRequest(spec=spec), metadata=auth)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            trailing = dict(info.value.trailing_metadata() or ())
            assert trailing["runyard-field"] == field
        with pytest.raises(grpc.aio.AioRpcError) as info:
            big = typed_spec(description="d" * 2_000_000)
            await stub.CreateTask(pb.CreateTaskRequest(spec=big), metadata=auth)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.aio.AioRpcError) as info:
            long_id = (*auth, ("x-request-id", "r" * 8192))
            request = pb.CreateTaskRequest(spec=typed_spec())
            await stub.CreateTask(request, metadata=long_id)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetTask(pb.GetTaskRequest(task_id="t" * 5000), metadata=auth)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await written(api) == before


# -- event size and the relay -------------------------------------------------------------


def renamed(size: int) -> NewEvent[Renamed]:
    event = Renamed(first="a" * size, last="b")
    return NewEvent(event, Metadata(actor="user:acme/alice"), occurred_at=utcnow())


async def test_the_store_refuses_an_event_over_its_size_limit(dsn: str) -> None:
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    try:
        with pytest.raises(EventTooLarge) as info:
            await store.append("test-1", [happened(1), renamed(MAX_EVENT_BYTES)])
        assert info.value.limit == MAX_EVENT_BYTES and info.value.event_type == "Renamed"
        assert await store.head_position() == 0
    finally:
        await store.close()


async def test_the_relay_survives_an_oversized_event_in_the_store(
    dsn: str, kafka: KafkaSettings
) -> None:
    """An event stored before the size check (here: by a store without it) is over the
    broker's message size: the relay parks it and every later event still flows."""
    unchecked = await PostgresEventStore.connect(dsn, sample_mapper(), max_event_bytes=8 << 20)
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    await unchecked.append("test-1", [happened(1)])
    await unchecked.append("test-2", [renamed(2_000_000)])
    await unchecked.append("test-3", [happened(3)])
    relay = OutboxRelay(store, kafka, broker_check_interval=0.2)
    async with running_consumer(dsn, kafka) as (consumer, collector):
        task = asyncio.create_task(relay.run())
        try:
            await wait_until(lambda: consumer.stats.processed == 2, within=60)
            await store.append("test-4", [happened(4)])
            await wait_until(lambda: consumer.stats.processed == 3, within=60)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert [e.event.n for e in collector.seen] == [1, 3, 4]  # type: ignore[attr-defined]
    assert relay.stats.dead_lettered == 1
    dlq = AIOKafkaConsumer(
        kafka.topics.dead_letter,
        bootstrap_servers=kafka.bootstrap,
        auto_offset_reset="earliest",
        group_id="dlq-limits",
        **QUICK_GROUP,  # a reader of its own: it joins in about a second
    )
    await dlq.start()
    try:
        parked = await asyncio.wait_for(dlq.getone(), 30)
    finally:
        await dlq.stop()
    assert json.loads(parked.value)["stream_id"] == "test-2"
    await unchecked.close()
    await store.close()
