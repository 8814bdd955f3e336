"""The gRPC messages and the HTTP shapes translate into each other without loss
(runyard.gateway.grpc_convert): the spec and the contract model, task views,
events, changes with their field masks, log filters; every task status and
deploy stage of the domain has its enum value."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, get_args

import pytest
from google.protobuf import field_mask_pb2
from hypothesis import given, settings
from hypothesis import strategies as st
from runyard.api.errors import BadRequest
from runyard.contracts.spec import (
    AlertSubscription,
    EnvVar,
    FaultToleranceOptions,
    SpotOptions,
    TaskSpec,
    VolumeMount,
)
from runyard.contracts.task_events import DeployStageName
from runyard.domain import TaskStatus
from runyard.gateway import grpc_convert as convert
from runyard.gateway.grpc_gen import tasks_pb2 as pb

#: Text protobuf can carry (no lone surrogates) and the spec's names accept.
TEXT = st.text(st.characters(codec="utf-8"), max_size=20)
#: A required text: proto3 cannot tell an empty string from an absent one, so an
#: empty required field reads as missing (refused as such, never taken as "").
REQUIRED = TEXT.filter(bool)
NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
INT = st.integers(min_value=1, max_value=100)
TIMES = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2040, 1, 1), timezones=st.just(UTC)
)

envs = st.builds(
    EnvVar,
    name=NAME,
    value=st.none() | TEXT,
    creator_only=st.booleans(),
    secret_ref=st.none() | NAME,
)
mounts = st.builds(
    VolumeMount, file_system=NAME, volume=NAME, mount_path=REQUIRED, read_only=st.booleans()
)
fault_tolerance = st.builds(
    FaultToleranceOptions,
    env_check=st.booleans(),
    auto_restart=st.booleans(),
    max_restarts=st.integers(0, 100),
    hang_timeout_s=st.none() | st.integers(10, 3600),
    slowdown_detection=st.booleans(),
    resume_pattern=st.none() | TEXT,
)
spots = st.builds(
    SpotOptions, max_queue_duration_s=st.integers(1, 86400), max_requeues=st.integers(0, 100)
)
alerts = st.builds(
    AlertSubscription,
    webhook_url=REQUIRED,
    # proto3 cannot tell an empty list from an absent one: empty means the default list
    alerts=st.lists(NAME, min_size=1, max_size=3).map(tuple),
    secret_ref=st.none() | NAME,
)
specs = st.builds(
    TaskSpec,
    name=REQUIRED,
    description=TEXT,
    tags=st.lists(NAME, max_size=3).map(tuple),
    task_type=st.sampled_from(["training", "data_processing"]),
    resource_type=st.sampled_from(["subscription", "spot"]),
    pool=NAME,
    worker_spec=st.none() | NAME,
    worker_count=INT,
    custom_gpus=st.none() | INT,
    rdma=st.booleans(),
    image=REQUIRED,
    framework=st.sampled_from(["single", "pytorch_ddp", "mpi", "ray"]),
    command=REQUIRED,
    env=st.lists(envs, max_size=3).map(tuple),
    mounts=st.lists(mounts, max_size=2).map(tuple),
    public_data=st.booleans(),
    tensorboard_dir=st.none() | TEXT,
    output_dirs=st.lists(TEXT, max_size=2).map(tuple),
    priority=st.integers(-1000, 1000),
    fault_tolerance=fault_tolerance,
    spot=st.none() | spots,
    alerts=st.lists(alerts, max_size=2).map(tuple),
)


def iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None


@settings(max_examples=200, deadline=None)
@given(specs)
def test_a_spec_survives_the_message_both_ways(spec: TaskSpec) -> None:
    message = convert.spec_message(spec)
    assert convert.spec_model(message) == spec
    assert pb.TaskSpec.FromString(message.SerializeToString()) == message


@settings(max_examples=200, deadline=None)
@given(specs)
def test_a_typed_spec_sent_is_the_spec_the_gateway_reads(spec: TaskSpec) -> None:
    """The request body of a spec (its present fields) validates to the same spec:
    what is left out takes the default it has."""
    assert TaskSpec.model_validate(convert.spec_body(convert.spec_message(spec))) == spec


def test_absent_fields_stay_absent_in_the_request_body() -> None:
    spec = pb.TaskSpec(name="n", pool="p", image="i", command="c")
    spec.fault_tolerance.max_restarts = 0  # optional: a zero there is a value
    assert convert.spec_body(spec) == {
        "name": "n",
        "pool": "p",
        "image": "i",
        "command": "c",
        "fault_tolerance": {"max_restarts": 0},
    }


def _view(
    spec: TaskSpec, status: str, stage: str | None, submitted: datetime, queued: bool
) -> dict[str, Any]:
    later = submitted + timedelta(seconds=3)
    return {
        "task_id": "t-1",
        "tenant": "acme",
        "creator": "alice",
        "name": spec.name,
        "status": status,
        "stage": stage,
        "run": 2,
        "attempt": 1,
        "spec": spec.model_dump(mode="json"),
        "warnings": [{"code": "storage.local_output", "field": "output_dirs[0]", "message": "m"}],
        "group_id": None,
        "cloned_from": "t-0",
        "clones": ["t-2", "t-3"],
        "submitted_at": iso(submitted),
        "queued_at": iso(later) if queued else None,
        "started_at": None,
        "finished_at": None,
        "queue": {
            "reason": "capacity",
            "position": 3,
            "gpus_needed": 8,
            "launchable": 0,
            "blocked": False,
            "queued_at": iso(later),
            "as_of": None,
        }
        if queued
        else None,
        "last_failure_reason": None,
        "stop_reason": "stopped by user:acme/alice (member)",
        "counters": dict.fromkeys(
            ("restarts", "reschedules", "requeues", "preemptions", "hangs", "slowdowns"), 1
        ),
        "stages": [
            {
                "run": 2,
                "attempt": 1,
                "stage": "image_pull",
                "started_at": iso(submitted),
                "finished_at": iso(later),
                "duration_ms": 3000,
                "result": "completed",
                "reason": None,
            }
        ],
        "version": 12,
    }


@settings(max_examples=100, deadline=None)
@given(
    specs,
    st.sampled_from(get_args(TaskStatus)),
    st.none() | st.sampled_from(get_args(DeployStageName)),
    TIMES,
    st.booleans(),
)
def test_a_task_view_survives_the_message(
    spec: TaskSpec, status: str, stage: str | None, submitted: datetime, queued: bool
) -> None:
    view = _view(spec, status, stage, submitted, queued)
    message = convert.task_message(view)
    assert convert.task_dict(message) == view
    assert pb.TaskStatus.Name(message.status) == f"TASK_STATUS_{status.upper()}"


def test_every_status_and_stage_of_the_domain_has_its_enum_value() -> None:
    statuses = {convert.enum_name(pb.TaskStatus.DESCRIPTOR, n) for n in pb.TaskStatus.values()}
    assert statuses == {None, *get_args(TaskStatus)}
    stages = {convert.enum_name(pb.DeployStage.DESCRIPTOR, n) for n in pb.DeployStage.values()}
    assert stages == {None, *get_args(DeployStageName)}
    with pytest.raises(BadRequest):
        convert.enum_number(pb.TaskStatus.DESCRIPTOR, "sleeping", "status")


PAYLOAD = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAME, inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(NAME, PAYLOAD, max_size=5), TIMES, st.none() | NAME)
def test_an_event_survives_the_message_with_its_payload(
    data: dict[str, Any], at: datetime, causation: str | None
) -> None:
    event = {
        "position": 41,
        "event_id": "e-1",
        "version": 3,
        "type": "TaskQueued",
        "occurred_at": at.isoformat(),
        "actor": "service:scheduler",
        "correlation_id": "req-1",
        "causation_id": causation,
        "data": data,
    }
    assert convert.to_dict(convert.event_message(event)) == event


def test_changes_are_the_fields_the_mask_names() -> None:
    changes = pb.TaskChanges(
        update_mask=field_mask_pb2.FieldMask(
            paths=["command", "custom_gpus", "tags", "spot", "fault_tolerance.auto_restart"]
        )
    )
    changes.spec.command = "python train.py"
    changes.spec.worker_spec = "8gpu"  # not named: not a change
    changes.spec.fault_tolerance.auto_restart = True
    assert convert.changes_body(changes) == {
        "command": "python train.py",
        "custom_gpus": None,  # named and unset: cleared
        "tags": [],
        "spot": None,
        "fault_tolerance": {"auto_restart": True},
    }
    assert convert.changes_body(pb.TaskChanges()) == {}
    back = convert.changes_message({"command": "x", "worker_count": 4, "tensorboard_dir": None})
    assert sorted(back.update_mask.paths) == ["command", "tensorboard_dir", "worker_count"]
    assert convert.changes_body(back) == {
        "command": "x",
        "worker_count": 4,
        "tensorboard_dir": None,
    }


@pytest.mark.parametrize("path", ["colour", "command.text", "env.name"])
def test_a_mask_path_outside_the_spec_is_refused(path: str) -> None:
    changes = pb.TaskChanges(update_mask=field_mask_pb2.FieldMask(paths=[path]))
    with pytest.raises(BadRequest) as refused:
        convert.changes_body(changes, "changes.update_mask")
    assert (refused.value.code, refused.value.field) == ("request.invalid", "changes.update_mask")


def test_log_filters_are_the_query_parameters() -> None:
    params = {
        "worker": [0, 2],
        "run": 1,
        "attempt": 2,
        "since": "2026-12-01T10:00:00+00:00",
        "until": "2026-12-01T11:00:00+00:00",
        "words": "loss",
        "phrase": "",
        "regex": "loss=[0-9]+",
        "ignore_case": "true",
    }
    assert convert.log_params(convert.log_filter(params)) == params
    assert convert.log_params(pb.LogFilter()) == {}


def test_a_replay_point_keeps_whether_it_was_a_position_or_a_time() -> None:
    for point in (1234, "2026-12-01T10:00:00+00:00"):
        as_of = {
            "point": point,
            "position": 1234,
            "version": 7,
            "occurred_at": "2026-12-01T09:59:58+00:00",
            "last_event": "TaskStarted",
            "stream_events": 9,
        }
        assert convert.point_dict(convert.point_message(pb.ReplayPoint(), as_of)) == as_of


def test_a_node_keeps_its_free_gpus_as_null_owners() -> None:
    node = {
        "node": "n-0",
        "health": "faulty",
        "fault": "xid 79",
        "gpus": 4,
        "free": 2,
        "owners": ["t-1", None, "(another tenant)", None],
    }
    message = pb.NodeView()
    convert.to_message(message, node)
    assert list(message.owners) == ["t-1", "", "(another tenant)", ""]
    assert convert.to_dict(message) == node


def test_a_capacity_keeps_the_members_of_its_source() -> None:
    config = {
        "pool_id": "pool-a",
        "source": "config",
        "total_gpus": 16,
        "launchable": {"1gpu": 16, "8gpu": 2},
        "custom_gpus_max": 16,
        "occupancy": None,
        "queued_tasks": None,
    }
    scheduler = {
        "pool_id": "pool-a",
        "source": "scheduler",
        "nodes": 2,
        "schedulable_nodes": 2,
        "schedulable_gpus": 16,
        "free_gpus": 8,
        "launchable": {"8": 1},
        "custom_gpus_max": 8,
        "occupancy": {
            "tasks": 1,
            "allocated_gpus": 8,
            "truncated": False,
            "items": [
                {
                    "task_id": "t-1",
                    "run": 1,
                    "attempt": 1,
                    "priority": 0,
                    "resource_type": "subscription",
                    "gpus": 8,
                    "workers": [{"index": 0, "node": "n-0", "gpus": [0, 1, 2, 3, 4, 5, 6, 7]}],
                }
            ],
        },
        "queue": {
            "waiting": 1,
            "gpus": 16,
            "oldest_wait_s": 12.5,
            "head": "t-2",
            "items": [
                {
                    "task_id": "t-2",
                    "position": 0,
                    "priority": 0,
                    "worker_gpus": [8, 8],
                    "gpus": 16,
                    "waited_s": 12.5,
                    "reason": "waiting for 16 GPUs",
                }
            ],
        },
        "as_of": "2026-12-01T10:00:00+00:00",
    }
    for answer in (config, scheduler):
        assert convert.capacity_dict(convert.capacity_message(answer)) == answer
