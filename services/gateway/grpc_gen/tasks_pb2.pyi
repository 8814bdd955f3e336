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
