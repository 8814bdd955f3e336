from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskRef(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class CreateTaskRequest(_message.Message):
    __slots__ = ("spec_json",)
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    spec_json: str
    def __init__(self, spec_json: _Optional[str] = ...) -> None: ...

class RerunTaskRequest(_message.Message):
    __slots__ = ("task_id", "changes_json")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CHANGES_JSON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    changes_json: str
    def __init__(self, task_id: _Optional[str] = ..., changes_json: _Optional[str] = ...) -> None: ...

class CloneTaskRequest(_message.Message):
    __slots__ = ("task_id", "overrides_json")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_JSON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    overrides_json: str
    def __init__(self, task_id: _Optional[str] = ..., overrides_json: _Optional[str] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("task_id", "name", "status", "creator", "run", "json")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CREATOR_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    name: str
    status: str
    creator: str
    run: int
    json: str
    def __init__(self, task_id: _Optional[str] = ..., name: _Optional[str] = ..., status: _Optional[str] = ..., creator: _Optional[str] = ..., run: _Optional[int] = ..., json: _Optional[str] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("status", "name", "tag", "pool", "creator", "limit", "cursor")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    CREATOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    status: str
    name: str
    tag: str
    pool: str
    creator: str
    limit: int
    cursor: str
    def __init__(self, status: _Optional[str] = ..., name: _Optional[str] = ..., tag: _Optional[str] = ..., pool: _Optional[str] = ..., creator: _Optional[str] = ..., limit: _Optional[int] = ..., cursor: _Optional[str] = ...) -> None: ...

class TaskSummary(_message.Message):
    __slots__ = ("task_id", "name", "status", "pool", "creator", "run", "json")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    CREATOR_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    name: str
    status: str
    pool: str
    creator: str
    run: int
    json: str
    def __init__(self, task_id: _Optional[str] = ..., name: _Optional[str] = ..., status: _Optional[str] = ..., pool: _Optional[str] = ..., creator: _Optional[str] = ..., run: _Optional[int] = ..., json: _Optional[str] = ...) -> None: ...

class TaskPage(_message.Message):
    __slots__ = ("items", "next_cursor")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[TaskSummary]
    next_cursor: str
    def __init__(self, items: _Optional[_Iterable[_Union[TaskSummary, _Mapping]]] = ..., next_cursor: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("position", "version", "type", "occurred_at", "actor", "correlation_id", "json")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    position: int
    version: int
    type: str
    occurred_at: str
    actor: str
    correlation_id: str
    json: str
    def __init__(self, position: _Optional[int] = ..., version: _Optional[int] = ..., type: _Optional[str] = ..., occurred_at: _Optional[str] = ..., actor: _Optional[str] = ..., correlation_id: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class EventList(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

class PoolRef(_message.Message):
    __slots__ = ("pool_id",)
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    def __init__(self, pool_id: _Optional[str] = ...) -> None: ...

class JsonReply(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class CreateGroupRequest(_message.Message):
    __slots__ = ("template_json", "items_json", "group_id")
    TEMPLATE_JSON_FIELD_NUMBER: _ClassVar[int]
    ITEMS_JSON_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    template_json: str
    items_json: _containers.RepeatedScalarFieldContainer[str]
    group_id: str
    def __init__(self, template_json: _Optional[str] = ..., items_json: _Optional[_Iterable[str]] = ..., group_id: _Optional[str] = ...) -> None: ...

class GroupRef(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class Group(_message.Message):
    __slots__ = ("group_id", "tasks", "status_counts", "json")
    class StatusCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    STATUS_COUNTS_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    tasks: _containers.RepeatedCompositeFieldContainer[TaskSummary]
    status_counts: _containers.ScalarMap[str, int]
    json: str
    def __init__(self, group_id: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[TaskSummary, _Mapping]]] = ..., status_counts: _Optional[_Mapping[str, int]] = ..., json: _Optional[str] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class GroupSummary(_message.Message):
    __slots__ = ("group_id", "tasks", "status_counts", "json")
    class StatusCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    STATUS_COUNTS_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    tasks: int
    status_counts: _containers.ScalarMap[str, int]
    json: str
    def __init__(self, group_id: _Optional[str] = ..., tasks: _Optional[int] = ..., status_counts: _Optional[_Mapping[str, int]] = ..., json: _Optional[str] = ...) -> None: ...

class GroupList(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupSummary]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupSummary, _Mapping]]] = ...) -> None: ...

class RerunGroupRequest(_message.Message):
    __slots__ = ("group_id", "changes_json")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    CHANGES_JSON_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    changes_json: str
    def __init__(self, group_id: _Optional[str] = ..., changes_json: _Optional[str] = ...) -> None: ...

class LogFilter(_message.Message):
    __slots__ = ("workers", "run", "since", "until", "words", "phrase", "regex", "ignore_case")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    WORDS_FIELD_NUMBER: _ClassVar[int]
    PHRASE_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    IGNORE_CASE_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedScalarFieldContainer[int]
    run: int
    since: str
    until: str
    words: str
    phrase: str
    regex: str
    ignore_case: bool
    def __init__(self, workers: _Optional[_Iterable[int]] = ..., run: _Optional[int] = ..., since: _Optional[str] = ..., until: _Optional[str] = ..., words: _Optional[str] = ..., phrase: _Optional[str] = ..., regex: _Optional[str] = ..., ignore_case: _Optional[bool] = ...) -> None: ...

class SearchLogsRequest(_message.Message):
    __slots__ = ("task_id", "filter", "order", "limit", "cursor")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    filter: LogFilter
    order: str
    limit: int
    cursor: str
    def __init__(self, task_id: _Optional[str] = ..., filter: _Optional[_Union[LogFilter, _Mapping]] = ..., order: _Optional[str] = ..., limit: _Optional[int] = ..., cursor: _Optional[str] = ...) -> None: ...

class FollowLogsRequest(_message.Message):
    __slots__ = ("task_id", "filter", "cursor", "limit")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    filter: LogFilter
    cursor: str
    limit: int
    def __init__(self, task_id: _Optional[str] = ..., filter: _Optional[_Union[LogFilter, _Mapping]] = ..., cursor: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class LogLine(_message.Message):
    __slots__ = ("at", "run", "attempt", "worker", "stream", "line")
    AT_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    at: str
    run: int
    attempt: int
    worker: int
    stream: str
    line: str
    def __init__(self, at: _Optional[str] = ..., run: _Optional[int] = ..., attempt: _Optional[int] = ..., worker: _Optional[int] = ..., stream: _Optional[str] = ..., line: _Optional[str] = ...) -> None: ...

class LogPage(_message.Message):
    __slots__ = ("lines", "next_cursor", "tail_cursor", "json")
    LINES_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    TAIL_CURSOR_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    lines: _containers.RepeatedCompositeFieldContainer[LogLine]
    next_cursor: str
    tail_cursor: str
    json: str
    def __init__(self, lines: _Optional[_Iterable[_Union[LogLine, _Mapping]]] = ..., next_cursor: _Optional[str] = ..., tail_cursor: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class FirstErrorRequest(_message.Message):
    __slots__ = ("task_id", "run")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    run: int
    def __init__(self, task_id: _Optional[str] = ..., run: _Optional[int] = ...) -> None: ...

class FirstError(_message.Message):
    __slots__ = ("found", "line", "layer", "rule", "json")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    found: bool
    line: LogLine
    layer: str
    rule: str
    json: str
    def __init__(self, found: _Optional[bool] = ..., line: _Optional[_Union[LogLine, _Mapping]] = ..., layer: _Optional[str] = ..., rule: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class StartLogExportRequest(_message.Message):
    __slots__ = ("task_id", "filter", "format")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    filter: LogFilter
    format: str
    def __init__(self, task_id: _Optional[str] = ..., filter: _Optional[_Union[LogFilter, _Mapping]] = ..., format: _Optional[str] = ...) -> None: ...

class ExportRef(_message.Message):
    __slots__ = ("export_id",)
    EXPORT_ID_FIELD_NUMBER: _ClassVar[int]
    export_id: str
    def __init__(self, export_id: _Optional[str] = ...) -> None: ...

class ListLogExportsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LogExport(_message.Message):
    __slots__ = ("export_id", "task_id", "state", "lines_done", "lines_total", "json")
    EXPORT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LINES_DONE_FIELD_NUMBER: _ClassVar[int]
    LINES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    export_id: str
    task_id: str
    state: str
    lines_done: int
    lines_total: int
    json: str
    def __init__(self, export_id: _Optional[str] = ..., task_id: _Optional[str] = ..., state: _Optional[str] = ..., lines_done: _Optional[int] = ..., lines_total: _Optional[int] = ..., json: _Optional[str] = ...) -> None: ...

class LogExportList(_message.Message):
    __slots__ = ("exports",)
    EXPORTS_FIELD_NUMBER: _ClassVar[int]
    exports: _containers.RepeatedCompositeFieldContainer[LogExport]
    def __init__(self, exports: _Optional[_Iterable[_Union[LogExport, _Mapping]]] = ...) -> None: ...

class TaskAtRequest(_message.Message):
    __slots__ = ("task_id", "at")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    at: str
    def __init__(self, task_id: _Optional[str] = ..., at: _Optional[str] = ...) -> None: ...

class DiffTaskRequest(_message.Message):
    __slots__ = ("task_id", "from_point", "to_point")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_POINT_FIELD_NUMBER: _ClassVar[int]
    TO_POINT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    from_point: str
    to_point: str
    def __init__(self, task_id: _Optional[str] = ..., from_point: _Optional[str] = ..., to_point: _Optional[str] = ...) -> None: ...

class PoolsAtRequest(_message.Message):
    __slots__ = ("at", "pool_id")
    AT_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    at: str
    pool_id: str
    def __init__(self, at: _Optional[str] = ..., pool_id: _Optional[str] = ...) -> None: ...

class WhatIfRequest(_message.Message):
    __slots__ = ("from_point", "to_point", "pools_json", "policy", "pool_id")
    FROM_POINT_FIELD_NUMBER: _ClassVar[int]
    TO_POINT_FIELD_NUMBER: _ClassVar[int]
    POOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    from_point: str
    to_point: str
    pools_json: str
    policy: str
    pool_id: str
    def __init__(self, from_point: _Optional[str] = ..., to_point: _Optional[str] = ..., pools_json: _Optional[str] = ..., policy: _Optional[str] = ..., pool_id: _Optional[str] = ...) -> None: ...

class TraceRequest(_message.Message):
    __slots__ = ("task_id", "event_id", "limit")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    event_id: str
    limit: int
    def __init__(self, task_id: _Optional[str] = ..., event_id: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...
