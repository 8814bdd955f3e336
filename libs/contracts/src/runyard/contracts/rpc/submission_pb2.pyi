from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Caller(_message.Message):
    __slots__ = ("tenant", "user", "role", "token_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user: str
    role: str
    token_id: str
    def __init__(self, tenant: _Optional[str] = ..., user: _Optional[str] = ..., role: _Optional[str] = ..., token_id: _Optional[str] = ...) -> None: ...

class CallContext(_message.Message):
    __slots__ = ("caller", "request_id", "trace_context", "call_id")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CALLER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    request_id: str
    trace_context: _containers.ScalarMap[str, str]
    call_id: str
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., request_id: _Optional[str] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., call_id: _Optional[str] = ...) -> None: ...

class Warning(_message.Message):
    __slots__ = ("code", "field", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    field: str
    message: str
    def __init__(self, code: _Optional[str] = ..., field: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class SubmitTaskRequest(_message.Message):
    __slots__ = ("context", "spec_json")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    context: CallContext
    spec_json: str
    def __init__(self, context: _Optional[_Union[CallContext, _Mapping]] = ..., spec_json: _Optional[str] = ...) -> None: ...

class TaskReply(_message.Message):
    __slots__ = ("task_id", "warnings")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    warnings: _containers.RepeatedCompositeFieldContainer[Warning]
    def __init__(self, task_id: _Optional[str] = ..., warnings: _Optional[_Iterable[_Union[Warning, _Mapping]]] = ...) -> None: ...

class RerunTaskRequest(_message.Message):
    __slots__ = ("context", "task_id", "changes_json")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CHANGES_JSON_FIELD_NUMBER: _ClassVar[int]
    context: CallContext
    task_id: str
    changes_json: str
    def __init__(self, context: _Optional[_Union[CallContext, _Mapping]] = ..., task_id: _Optional[str] = ..., changes_json: _Optional[str] = ...) -> None: ...

class CloneTaskRequest(_message.Message):
    __slots__ = ("context", "task_id", "overrides_json")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_JSON_FIELD_NUMBER: _ClassVar[int]
    context: CallContext
    task_id: str
    overrides_json: str
    def __init__(self, context: _Optional[_Union[CallContext, _Mapping]] = ..., task_id: _Optional[str] = ..., overrides_json: _Optional[str] = ...) -> None: ...

class SubmitGroupRequest(_message.Message):
    __slots__ = ("context", "group_json")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    GROUP_JSON_FIELD_NUMBER: _ClassVar[int]
    context: CallContext
    group_json: str
    def __init__(self, context: _Optional[_Union[CallContext, _Mapping]] = ..., group_json: _Optional[str] = ...) -> None: ...

class RerunGroupRequest(_message.Message):
    __slots__ = ("context", "group_id", "task_ids", "changes_json")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    CHANGES_JSON_FIELD_NUMBER: _ClassVar[int]
    context: CallContext
    group_id: str
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    changes_json: str
    def __init__(self, context: _Optional[_Union[CallContext, _Mapping]] = ..., group_id: _Optional[str] = ..., task_ids: _Optional[_Iterable[str]] = ..., changes_json: _Optional[str] = ...) -> None: ...

class GroupReply(_message.Message):
    __slots__ = ("group_id", "task_ids")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group_id: _Optional[str] = ..., task_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SetCatalogueEntryRequest(_message.Message):
    __slots__ = ("context", "kind", "entry_json")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ENTRY_JSON_FIELD_NUMBER: _ClassVar[int]
    context: CallContext
    kind: str
    entry_json: str
    def __init__(self, context: _Optional[_Union[CallContext, _Mapping]] = ..., kind: _Optional[str] = ..., entry_json: _Optional[str] = ...) -> None: ...

class CatalogueEntryReply(_message.Message):
    __slots__ = ("entry_json",)
    ENTRY_JSON_FIELD_NUMBER: _ClassVar[int]
    entry_json: str
    def __init__(self, entry_json: _Optional[str] = ...) -> None: ...

class GetCatalogueRequest(_message.Message):
    __slots__ = ("context",)
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    context: CallContext
    def __init__(self, context: _Optional[_Union[CallContext, _Mapping]] = ...) -> None: ...

class CatalogueReply(_message.Message):
    __slots__ = ("catalogue_json",)
    CATALOGUE_JSON_FIELD_NUMBER: _ClassVar[int]
    catalogue_json: str
    def __init__(self, catalogue_json: _Optional[str] = ...) -> None: ...
