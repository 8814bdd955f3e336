"""Translation between the gRPC messages (`proto/runyard/v1/tasks.proto`) and the
shapes of the HTTP API: the one place that knows both.

Requests become the bodies and query parameters the HTTP handlers take, so the
same application functions check them and refuse them with the same errors:

    spec_body(TaskSpec)           the body of POST /v1/tasks: the fields present
    changes_body(TaskChanges)     rerun changes, clone overrides, group items: the
                                  fields its `update_mask` names
    log_params(LogFilter)         the query parameters of /v1/tasks/{id}/logs

Answers are built from the HTTP answers (`task_message`, `event_message`, ...)
and read back into them (`task_dict`, `event_dict`, ...): `x_dict(x_message(d))
== d` for every answer `d` of the HTTP API, which the parity tests check over
both faces. The spec converts to and from the contract model too
(`spec_message`, `spec_model`).

One generic walk over the message descriptors does the work; what differs
between the faces is spelled out in small tables: field names (`submit_time` is
`submitted_at`), enums (`TASK_STATUS_RUNNING` is `running`, UNSPECIFIED is
null), times (`google.protobuf.Timestamp` is ISO 8601 text), and presence (an
unset `optional` field or message is null).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from google.protobuf import struct_pb2, timestamp_pb2
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message
from runyard.api.errors import BadRequest
from runyard.contracts.spec import TaskSpec
from runyard.gateway.grpc_gen import tasks_pb2 as pb

#: A protobuf message type (`to_message` fills one and gives it back).
M = TypeVar("M", bound=Message)

#: gRPC field name -> HTTP member name, where they differ (times are `*_time` in
#: proto, as Google's API design guide names them).
HTTP_NAMES: dict[str, str] = {
    "submit_time": "submitted_at",
    "queue_time": "queued_at",
    "start_time": "started_at",
    "finish_time": "finished_at",
    "create_time": "created_at",
    "update_time": "updated_at",
    "occur_time": "occurred_at",
    "capture_time": "captured_at",
    "arrive_time": "arrived_at",
    "real_place_time": "real_placed_at",
    "simulated_place_time": "simulated_placed_at",
    "from_point": "from",
    "to_point": "to",
    "from_value": "from",
    "to_value": "to",
    "pool_id": "pool_id",
}
#: Per message, field names that differ only there.
MESSAGE_NAMES: dict[str, dict[str, str]] = {
    "LogLine": {"time": "at"},
    "FaultToleranceLine": {"time": "at"},
    "WhatIfResponse": {"start_time": "from", "end_time": "to"},
    "WhatIfRequest": {"start_time": "from", "end_time": "to", "pool_id": "pool"},
    "WhatIfPool": {"pool_id": "id"},
    "LogFilter": {"workers": "workers"},
}
#: Members an HTTP answer has only in some cases: left out when null.
SOMETIMES: dict[str, frozenset[str]] = {
    "PoolCapacity": frozenset(
        {
            "total_gpus",
            "queued_tasks",
            "nodes",
            "schedulable_nodes",
            "schedulable_gpus",
            "free_gpus",
            "queue",
            "as_of",
        }
    ),
    "WhatIfOutcome": frozenset({"utilisation", "capacity_gpu_hours"}),
    "FirstError": frozenset(
        {"line", "exception", "before", "after", "layer", "rule", "why", "evidence", "status"}
    ),
}
#: Text fields that are empty where the HTTP answer has null (the last page's cursor).
NULL_WHEN_EMPTY = frozenset({"next_cursor", "tail_cursor"})
#: Lists whose items may be null (a free GPU has no owner): an empty text there.
NULL_ITEMS = frozenset({"NodeView.owners"})
_TIMESTAMP = timestamp_pb2.Timestamp.DESCRIPTOR.full_name
_STRUCT = struct_pb2.Struct.DESCRIPTOR.full_name
_VALUE = struct_pb2.Value.DESCRIPTOR.full_name


# --- names, enums, times ------------------------------------------------------------


def _http_name(message: Descriptor, field: FieldDescriptor) -> str:
    own = MESSAGE_NAMES.get(message.name, {})
    return own.get(field.name) or HTTP_NAMES.get(field.name, field.name)


def _enum_prefix(enum: EnumDescriptor) -> str:
    snake = "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(enum.name))
    return snake.upper() + "_"


def enum_name(enum: EnumDescriptor, number: int) -> str | None:
    """`running` for TASK_STATUS_RUNNING; None for the UNSPECIFIED zero."""
    if number == 0:
        return None
    name: str = enum.values_by_number[number].name
    return name.removeprefix(_enum_prefix(enum)).lower()


def enum_number(enum: EnumDescriptor, name: str | None, field: str) -> int:
    """The enum value of `running`; 0 for None. An unknown name is a 400."""
    if name is None:
        return 0
    value = enum.values_by_name.get(_enum_prefix(enum) + str(name).upper())
    if value is None or value.number == 0:
        raise BadRequest(
            "request.invalid", f"{field}: unknown value {name!r}", "see the proto enum", field
        )
    return int(value.number)


def timestamp(text: str) -> timestamp_pb2.Timestamp:
    """A Timestamp of ISO 8601 text with a zone."""
    at = timestamp_pb2.Timestamp()
    at.FromDatetime(datetime.fromisoformat(text))
    return at


def iso(at: timestamp_pb2.Timestamp) -> str:
    """ISO 8601 text of a Timestamp, in UTC (`+00:00`), as the HTTP answers write it."""
    when: datetime = at.ToDatetime(tzinfo=UTC)
    return when.isoformat()


# --- HTTP JSON -> message ------------------------------------------------------------


def to_message(message: M, data: Mapping[str, Any]) -> M:
    """Fill `message` from an HTTP JSON object (members it lacks, or null, stay unset)."""
    descriptor = message.DESCRIPTOR
    for field in descriptor.fields:
        value = data.get(_http_name(descriptor, field))
        if value is None:
            continue
        try:
            _set(message, field, value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{descriptor.name}.{field.name}: {exc}") from exc
    return message


def _set(message: Message, field: FieldDescriptor, value: Any) -> None:
    name = field.name
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        target = getattr(message, name)
        for key, item in value.items():
            target[key] = item
    elif field.is_repeated:
        target = getattr(message, name)
        for item in value:
            if field.message_type is None:
                target.append("" if item is None else _scalar(field, item))
            else:
                _fill(target.add(), field, item)
    elif field.message_type is None:
        setattr(message, name, _scalar(field, value))
    else:
        _fill(getattr(message, name), field, value)
        if not message.HasField(name):  # an empty message: present all the same
            getattr(message, name).SetInParent()


def _fill(target: Message, field: FieldDescriptor, value: Any) -> None:
    kind = field.message_type.full_name
    if kind == _TIMESTAMP:
        target.CopyFrom(timestamp(str(value)))
    elif kind == _STRUCT:
        target.update(value)
    elif kind == _VALUE:
        target.CopyFrom(value_message(value))
    elif kind == pb.ReplayPoint.DESCRIPTOR.full_name:
        point_message(target, value)
    else:
        to_message(target, value)


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.enum_type is not None:
        return enum_number(field.enum_type, value, field.name)
    return value


def value_message(value: Any) -> struct_pb2.Value:
    """A `google.protobuf.Value` of any JSON value."""
    holder = struct_pb2.Struct()
    holder.update({"v": value})
    return holder.fields["v"]


# --- message -> HTTP JSON ------------------------------------------------------------


def to_dict(message: Message) -> dict[str, Any]:
    """The HTTP JSON object of a message: every member, null where unset."""
    descriptor = message.DESCRIPTOR
    data: dict[str, Any] = {}
    sometimes = SOMETIMES.get(descriptor.name, frozenset())
    for field in descriptor.fields:
        value = _get(message, field)
        key = _http_name(descriptor, field)
        if value is None and key in sometimes:
            continue
        data[key] = None if value == "" and key in NULL_WHEN_EMPTY else value
    return data


def _get(message: Message, field: FieldDescriptor) -> Any:
    value = getattr(message, field.name)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return {k: _plain(v) for k, v in sorted(value.items())}
    if field.is_repeated:
        if field.message_type is None:
            nullable = f"{message.DESCRIPTOR.name}.{field.name}" in NULL_ITEMS
            return [None if nullable and v == "" else _read_scalar(field, v) for v in value]
        return [_read(field, v) for v in value]
    present = field.message_type is not None or field.has_presence
    if present and not message.HasField(field.name):
        return None
    if field.message_type is None:
        return _read_scalar(field, value)
    return _read(field, value)


def _read(field: FieldDescriptor, value: Message) -> Any:
    kind = field.message_type.full_name
    if kind == _TIMESTAMP:
        return iso(value)
    if kind in (_STRUCT, _VALUE):
        return _plain(_json_of(value))
    if kind == pb.ReplayPoint.DESCRIPTOR.full_name:
        return point_dict(value)
    return to_dict(value)


def _json_of(value: Message) -> Any:
    from google.protobuf import json_format

    return json_format.MessageToDict(value)


def _read_scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.enum_type is not None:
        return enum_name(field.enum_type, value)
    return value


def _plain(value: Any) -> Any:
    """JSON numbers as the HTTP API writes them: Struct keeps every number as a
    double, so a whole number is read back as an int."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


# --- requests ------------------------------------------------------------------------


def present(message: Message) -> dict[str, Any]:
    """The fields of a request message that are present: set `optional` fields and
    messages, other scalars that are not zero, lists that are not empty."""
    descriptor = message.DESCRIPTOR
    data: dict[str, Any] = {}
    for field, value in message.ListFields():
        key = _http_name(descriptor, field)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            data[key] = dict(value)
        elif field.is_repeated and field.message_type is not None:
            data[key] = [_present_of(field, v) for v in value]
        elif field.is_repeated:
            data[key] = [_read_scalar(field, v) for v in value]
        elif field.message_type is not None:
            data[key] = _present_of(field, value)
        else:
            data[key] = _read_scalar(field, value)
    return data


def _present_of(field: FieldDescriptor, value: Message) -> Any:
    if field.message_type.full_name in (_TIMESTAMP, _STRUCT, _VALUE):
        return _read(field, value)
    return present(value)


def spec_body(spec: pb.TaskSpec) -> dict[str, Any]:
    """The body of POST /v1/tasks for a typed spec (absent fields take their defaults)."""
    return present(spec)


def changes_body(changes: pb.TaskChanges, field: str = "update_mask") -> dict[str, Any]:
    """The HTTP changes object of a `TaskChanges`: each field its mask names, with
    the spec's value of it (null for an unset `optional` field or message). A path
    may name a field of a field (`fault_tolerance.auto_restart`)."""
    body: dict[str, Any] = {}
    for path in changes.update_mask.paths:
        message: Message = changes.spec
        target = body
        parts = path.split(".")
        for depth, part in enumerate(parts):
            described = message.DESCRIPTOR.fields_by_name.get(part)
            if described is None:
                raise BadRequest(
                    "request.invalid",
                    f"{field}: {path!r} is not a field of TaskSpec",
                    "name fields of TaskSpec, e.g. command or worker_spec",
                    field,
                )
            key = _http_name(message.DESCRIPTOR, described)
            last = depth == len(parts) - 1
            if last:
                target[key] = _changed(message, described)
            else:
                if described.message_type is None or described.is_repeated:
                    raise BadRequest(
                        "request.invalid",
                        f"{field}: {path!r} goes into a field that has no fields",
                        "name a field of TaskSpec or of one of its messages",
                        field,
                    )
                target = target.setdefault(key, {})
                message = getattr(message, part)
    return body


def _changed(message: Message, field: FieldDescriptor) -> Any:
    value = getattr(message, field.name)
    if field.is_repeated and field.message_type is not None:
        return [present(v) for v in value]
    if field.is_repeated:
        return [_read_scalar(field, v) for v in value]
    if (field.message_type is not None or field.has_presence) and not message.HasField(field.name):
        return None
    if field.message_type is not None:
        return present(value)
    return _read_scalar(field, value)


def changes_message(changes: Mapping[str, Any]) -> pb.TaskChanges:
    """A `TaskChanges` of an HTTP changes object (a client's side of `changes_body`)."""
    message = pb.TaskChanges()
    to_message(message.spec, changes)
    message.update_mask.paths.extend(_spec_field(key) for key in changes)
    return message


def _spec_field(key: str) -> str:
    for field in pb.TaskSpec.DESCRIPTOR.fields:
        if _http_name(pb.TaskSpec.DESCRIPTOR, field) == key:
            return str(field.name)
    return key


def log_params(message: pb.LogFilter) -> dict[str, Any]:
    """The HTTP query parameters of a `LogFilter` (unset optionals: absent)."""
    params: dict[str, Any] = {"worker": list(message.workers)} if message.workers else {}
    for name in ("run", "attempt", "words", "phrase", "regex"):
        if message.HasField(name):
            params[name] = getattr(message, name)
    for name in ("since", "until"):
        if message.HasField(name):
            params[name] = iso(getattr(message, name))
    if message.ignore_case:
        params["ignore_case"] = "true"
    return params


def log_filter(params: Mapping[str, Any]) -> pb.LogFilter:
    """A `LogFilter` of the HTTP query parameters (a client's side of `log_params`)."""
    where = pb.LogFilter()
    where.workers.extend(int(w) for w in _listed(params.get("worker", ())))
    for name in ("run", "attempt", "words", "phrase", "regex"):
        if params.get(name) is not None:
            setattr(where, name, params[name])
    for name in ("since", "until"):
        if params.get(name):
            getattr(where, name).CopyFrom(timestamp(str(params[name])))
    where.ignore_case = str(params.get("ignore_case", "")).lower() in ("true", "1")
    return where


def _listed(value: Any) -> Iterable[Any]:
    return value if isinstance(value, list | tuple) else [value]


# --- the spec and the contract model -------------------------------------------------


def spec_message(spec: TaskSpec) -> pb.TaskSpec:
    """The typed spec of a contract model (every field, as an answer shows it)."""
    message = pb.TaskSpec()
    to_message(message, spec.model_dump(mode="json"))
    return message


def spec_model(message: pb.TaskSpec) -> TaskSpec:
    """The contract model of a typed spec as an answer carries it."""
    return TaskSpec.model_validate(to_dict(message))


# --- answers -------------------------------------------------------------------------


def task_message(task: Mapping[str, Any]) -> pb.Task:
    """A task's detail (the HTTP answer of GET /v1/tasks/{id})."""
    return to_message(pb.Task(), task)


def task_dict(message: pb.Task) -> dict[str, Any]:
    return to_dict(message)


def summary_message(row: Mapping[str, Any]) -> pb.TaskSummary:
    """One item of the task list."""
    return to_message(pb.TaskSummary(), row)


def event_message(event: Mapping[str, Any]) -> pb.Event:
    """One event of the audit timeline."""
    return to_message(pb.Event(), event)


def group_message(group: Mapping[str, Any]) -> pb.Group:
    return to_message(pb.Group(), group)


def group_dict(message: pb.Group) -> dict[str, Any]:
    """The HTTP group: its task rows carry no queue place (the task list's do)."""
    data = to_dict(message)
    data["tasks"] = [{k: v for k, v in t.items() if k != "queue"} for t in data["tasks"]]
    return data


def group_summary_message(group: Mapping[str, Any]) -> pb.GroupSummary:
    return to_message(pb.GroupSummary(), group)


def capacity_message(answer: Mapping[str, Any]) -> pb.PoolCapacity:
    return to_message(pb.PoolCapacity(), answer)


def capacity_dict(message: pb.PoolCapacity) -> dict[str, Any]:
    """The HTTP answer: its members depend on `source` (config or scheduler)."""
    data = to_dict(message)
    if message.source != "scheduler":  # pools.yaml: only the size is known
        data = {k: v for k, v in data.items() if k not in ("queue", "as_of")}
        data.setdefault("total_gpus", None)
        data.setdefault("queued_tasks", None)
    return data


def log_page_message(page: Mapping[str, Any]) -> pb.SearchLogsResponse:
    return to_message(pb.SearchLogsResponse(), page)


def follow_page_message(page: Mapping[str, Any]) -> pb.FollowLogsResponse:
    return to_message(pb.FollowLogsResponse(), page)


def first_error_message(answer: Mapping[str, Any]) -> pb.FirstError:
    return to_message(pb.FirstError(), answer)


def first_error_dict(message: pb.FirstError) -> dict[str, Any]:
    """The HTTP answer: a found error has its line, context and classification."""
    data = to_dict(message)
    if not message.found:
        return {k: v for k, v in data.items() if k in ("task_id", "status", "found")}
    data.setdefault("exception", None)
    return data


def export_message(export: Mapping[str, Any]) -> pb.LogExport:
    return to_message(pb.LogExport(), export)


def export_dict(message: pb.LogExport) -> dict[str, Any]:
    """The HTTP export record (its query spelled as the log service stores it)."""
    data = to_dict(message)
    query = to_dict(message.query)
    query["workers"] = list(message.query.workers)
    query["ignore_case"] = message.query.ignore_case
    data["query"] = query
    return data


def task_at_message(answer: Mapping[str, Any]) -> pb.GetTaskAtResponse:
    """The replayed task: its placement travels beside it, not in the task."""
    task = dict(answer["task"])
    placement = task.pop("placement", None)
    message = pb.GetTaskAtResponse(task_id=answer["task_id"])
    point_message(message.as_of, answer["as_of"])
    to_message(message.task, task)
    if placement is not None:
        to_message(message.placement, placement)
    return message


def task_at_dict(message: pb.GetTaskAtResponse) -> dict[str, Any]:
    task = to_dict(message.task)
    task["placement"] = to_dict(message.placement) if message.HasField("placement") else None
    return {"task_id": message.task_id, "as_of": point_dict(message.as_of), "task": task}


def point_message(message: pb.ReplayPoint, as_of: Mapping[str, Any]) -> pb.ReplayPoint:
    """A replay point `{point, position, version, occurred_at, last_event, stream_events}`."""
    to_message(message, {k: v for k, v in as_of.items() if k != "point"})
    point = as_of.get("point")
    if isinstance(point, int):
        message.position_point = point
    elif isinstance(point, str):
        message.time_point.CopyFrom(timestamp(point))
    return message


def point_dict(message: pb.ReplayPoint) -> dict[str, Any]:
    data = to_dict(message)
    position, at = data.pop("position_point"), data.pop("time_point")
    return {"point": position if position is not None else at, **data}


def diff_message(answer: Mapping[str, Any]) -> pb.DiffTaskResponse:
    message = pb.DiffTaskResponse(
        task_id=answer["task_id"],
        events_between=answer["events_between"],
        truncated=answer["truncated"],
    )
    point_message(message.from_point, answer["from"])
    point_message(message.to_point, answer["to"])
    for change in answer["changes"]:
        to_message(message.changes.add(), change)
    for event in answer["events"]:
        to_message(message.events.add(), event)
    return message


def diff_dict(message: pb.DiffTaskResponse) -> dict[str, Any]:
    data = to_dict(message)
    data["from"], data["to"] = point_dict(message.from_point), point_dict(message.to_point)
    return data


def trace_message(answer: Mapping[str, Any]) -> pb.TraceResponse:
    message = pb.TraceResponse()
    to_message(message, {k: v for k, v in answer.items() if k != "of"})
    of = answer["of"]
    if "task_id" in of:
        message.task_id = of["task_id"]
    else:
        message.event_id = of["event_id"]
    return message


def trace_dict(message: pb.TraceResponse) -> dict[str, Any]:
    data = to_dict(message)
    task_id, event_id = data.pop("task_id"), data.pop("event_id")
    of = {"task_id": task_id} if message.WhichOneof("subject") == "task_id" else {}
    if message.WhichOneof("subject") == "event_id":
        of = {"event_id": event_id}
    return {"of": of, **data}


def pools_at_message(answer: Mapping[str, Any]) -> pb.GetPoolsAtResponse:
    """The pools replayed at a point (`point` a position or a time, as asked)."""
    message = pb.GetPoolsAtResponse()
    to_message(message, {k: v for k, v in answer.items() if k != "point"})
    point = answer.get("point")
    if isinstance(point, int):
        message.position_point = point
    elif isinstance(point, str):
        message.time_point.CopyFrom(timestamp(point))
    return message


def pools_at_dict(message: pb.GetPoolsAtResponse) -> dict[str, Any]:
    data = to_dict(message)
    position, at = data.pop("position_point"), data.pop("time_point")
    return {"point": position if position is not None else at, **data}


def whatif_body(request: pb.WhatIfRequest) -> dict[str, Any]:
    """The body of POST /v1/pools/whatif."""
    body = present(request)
    pools = body.get("pools")
    if pools is not None:
        body["pools"] = [_pool_body(p) for p in request.pools]
    return body


def _pool_body(pool: pb.WhatIfPool) -> dict[str, Any]:
    nodes: Any = None
    if pool.HasField("node_names"):
        nodes = list(pool.node_names.names)
    elif pool.HasField("node_range"):
        nodes = present(pool.node_range)
    return {"id": pool.pool_id, "nodes": nodes}


def whatif_message(answer: Mapping[str, Any]) -> pb.WhatIfResponse:
    return to_message(pb.WhatIfResponse(), answer)


def stack_report_message(report: Mapping[str, Any]) -> pb.StackReport:
    """A stack report; its per-worker maps (keyed by the worker index as text in
    JSON) become lists of messages that name the worker."""
    keyed = ("workers", "frames_by_worker", "functions")
    message = pb.StackReport()
    to_message(message, {k: v for k, v in report.items() if k not in keyed})
    for worker, processes in report.get("workers", {}).items():
        to_message(message.workers.add(), {"worker": int(worker), "processes": processes})
    for worker, frames in report.get("frames_by_worker", {}).items():
        message.frames_by_worker.add(worker=int(worker), frames=frames)
    for function, use in report.get("functions", {}).items():
        message.functions.add(function=function, threads=use["threads"], workers=use["workers"])
    return message


def stack_report_dict(message: pb.StackReport) -> dict[str, Any]:
    """The HTTP stack report of a message (the inverse of `stack_report_message`)."""
    data = to_dict(message)
    data["workers"] = {str(w.worker): [to_dict(p) for p in w.processes] for w in message.workers}
    data["frames_by_worker"] = {str(w.worker): list(w.frames) for w in message.frames_by_worker}
    data["functions"] = {
        f.function: {"threads": f.threads, "workers": list(f.workers)} for f in message.functions
    }
    return data


__all__ = [
    "capacity_dict",
    "capacity_message",
    "changes_body",
    "changes_message",
    "diff_dict",
    "diff_message",
    "enum_name",
    "enum_number",
    "event_message",
    "export_dict",
    "export_message",
    "first_error_dict",
    "first_error_message",
    "follow_page_message",
    "group_dict",
    "group_message",
    "group_summary_message",
    "iso",
    "log_filter",
    "log_page_message",
    "log_params",
    "point_dict",
    "pools_at_dict",
    "pools_at_message",
    "present",
    "spec_body",
    "spec_message",
    "spec_model",
    "stack_report_dict",
    "stack_report_message",
    "summary_message",
    "task_at_dict",
    "task_at_message",
    "task_dict",
    "timestamp",
    "to_dict",
    "to_message",
    "trace_dict",
    "trace_message",
    "value_message",
    "whatif_body",
    "whatif_message",
]
