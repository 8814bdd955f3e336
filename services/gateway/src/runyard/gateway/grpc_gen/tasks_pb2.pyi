import datetime

from google.protobuf import field_mask_pb2 as _field_mask_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATUS_UNSPECIFIED: _ClassVar[TaskStatus]
    TASK_STATUS_NEW: _ClassVar[TaskStatus]
    TASK_STATUS_QUEUED: _ClassVar[TaskStatus]
    TASK_STATUS_DEPLOYING: _ClassVar[TaskStatus]
    TASK_STATUS_ENV_CHECKING: _ClassVar[TaskStatus]
    TASK_STATUS_RUNNING: _ClassVar[TaskStatus]
    TASK_STATUS_RESTARTING: _ClassVar[TaskStatus]
    TASK_STATUS_SUCCEEDED: _ClassVar[TaskStatus]
    TASK_STATUS_FAILED: _ClassVar[TaskStatus]
    TASK_STATUS_STOPPED: _ClassVar[TaskStatus]
    TASK_STATUS_ABNORMAL: _ClassVar[TaskStatus]

class DeployStage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEPLOY_STAGE_UNSPECIFIED: _ClassVar[DeployStage]
    DEPLOY_STAGE_RESOURCE_ALLOCATION: _ClassVar[DeployStage]
    DEPLOY_STAGE_IMAGE_PULL: _ClassVar[DeployStage]
    DEPLOY_STAGE_STORAGE_MOUNT: _ClassVar[DeployStage]
    DEPLOY_STAGE_ENV_INIT: _ClassVar[DeployStage]

class StageResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STAGE_RESULT_UNSPECIFIED: _ClassVar[StageResult]
    STAGE_RESULT_RUNNING: _ClassVar[StageResult]
    STAGE_RESULT_COMPLETED: _ClassVar[StageResult]
    STAGE_RESULT_FAILED: _ClassVar[StageResult]
TASK_STATUS_UNSPECIFIED: TaskStatus
TASK_STATUS_NEW: TaskStatus
TASK_STATUS_QUEUED: TaskStatus
TASK_STATUS_DEPLOYING: TaskStatus
TASK_STATUS_ENV_CHECKING: TaskStatus
TASK_STATUS_RUNNING: TaskStatus
TASK_STATUS_RESTARTING: TaskStatus
TASK_STATUS_SUCCEEDED: TaskStatus
TASK_STATUS_FAILED: TaskStatus
TASK_STATUS_STOPPED: TaskStatus
TASK_STATUS_ABNORMAL: TaskStatus
DEPLOY_STAGE_UNSPECIFIED: DeployStage
DEPLOY_STAGE_RESOURCE_ALLOCATION: DeployStage
DEPLOY_STAGE_IMAGE_PULL: DeployStage
DEPLOY_STAGE_STORAGE_MOUNT: DeployStage
DEPLOY_STAGE_ENV_INIT: DeployStage
STAGE_RESULT_UNSPECIFIED: StageResult
STAGE_RESULT_RUNNING: StageResult
STAGE_RESULT_COMPLETED: StageResult
STAGE_RESULT_FAILED: StageResult

class EnvVar(_message.Message):
    __slots__ = ("name", "value", "creator_only", "secret_ref")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CREATOR_ONLY_FIELD_NUMBER: _ClassVar[int]
    SECRET_REF_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    creator_only: bool
    secret_ref: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ..., creator_only: _Optional[bool] = ..., secret_ref: _Optional[str] = ...) -> None: ...

class Mount(_message.Message):
    __slots__ = ("file_system", "volume", "mount_path", "read_only")
    FILE_SYSTEM_FIELD_NUMBER: _ClassVar[int]
    VOLUME_FIELD_NUMBER: _ClassVar[int]
    MOUNT_PATH_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    file_system: str
    volume: str
    mount_path: str
    read_only: bool
    def __init__(self, file_system: _Optional[str] = ..., volume: _Optional[str] = ..., mount_path: _Optional[str] = ..., read_only: _Optional[bool] = ...) -> None: ...

class FaultTolerance(_message.Message):
    __slots__ = ("env_check", "auto_restart", "max_restarts", "hang_timeout_s", "slowdown_detection", "resume_pattern")
    ENV_CHECK_FIELD_NUMBER: _ClassVar[int]
    AUTO_RESTART_FIELD_NUMBER: _ClassVar[int]
    MAX_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    HANG_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    SLOWDOWN_DETECTION_FIELD_NUMBER: _ClassVar[int]
    RESUME_PATTERN_FIELD_NUMBER: _ClassVar[int]
    env_check: bool
    auto_restart: bool
    max_restarts: int
    hang_timeout_s: int
    slowdown_detection: bool
    resume_pattern: str
    def __init__(self, env_check: _Optional[bool] = ..., auto_restart: _Optional[bool] = ..., max_restarts: _Optional[int] = ..., hang_timeout_s: _Optional[int] = ..., slowdown_detection: _Optional[bool] = ..., resume_pattern: _Optional[str] = ...) -> None: ...

class SpotOptions(_message.Message):
    __slots__ = ("max_queue_duration_s", "max_requeues")
    MAX_QUEUE_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEUES_FIELD_NUMBER: _ClassVar[int]
    max_queue_duration_s: int
    max_requeues: int
    def __init__(self, max_queue_duration_s: _Optional[int] = ..., max_requeues: _Optional[int] = ...) -> None: ...

class AlertSubscription(_message.Message):
    __slots__ = ("webhook_url", "alerts", "secret_ref")
    WEBHOOK_URL_FIELD_NUMBER: _ClassVar[int]
    ALERTS_FIELD_NUMBER: _ClassVar[int]
    SECRET_REF_FIELD_NUMBER: _ClassVar[int]
    webhook_url: str
    alerts: _containers.RepeatedScalarFieldContainer[str]
    secret_ref: str
    def __init__(self, webhook_url: _Optional[str] = ..., alerts: _Optional[_Iterable[str]] = ..., secret_ref: _Optional[str] = ...) -> None: ...

class TaskSpec(_message.Message):
    __slots__ = ("name", "description", "tags", "task_type", "resource_type", "pool", "worker_spec", "worker_count", "custom_gpus", "rdma", "image", "framework", "command", "env", "mounts", "public_data", "tensorboard_dir", "output_dirs", "priority", "fault_tolerance", "spot", "alerts")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    WORKER_SPEC_FIELD_NUMBER: _ClassVar[int]
    WORKER_COUNT_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_GPUS_FIELD_NUMBER: _ClassVar[int]
    RDMA_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    FRAMEWORK_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_DATA_FIELD_NUMBER: _ClassVar[int]
    TENSORBOARD_DIR_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_DIRS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    FAULT_TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    SPOT_FIELD_NUMBER: _ClassVar[int]
    ALERTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    task_type: str
    resource_type: str
    pool: str
    worker_spec: str
    worker_count: int
    custom_gpus: int
    rdma: bool
    image: str
    framework: str
    command: str
    env: _containers.RepeatedCompositeFieldContainer[EnvVar]
    mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    public_data: bool
    tensorboard_dir: str
    output_dirs: _containers.RepeatedScalarFieldContainer[str]
    priority: int
    fault_tolerance: FaultTolerance
    spot: SpotOptions
    alerts: _containers.RepeatedCompositeFieldContainer[AlertSubscription]
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., task_type: _Optional[str] = ..., resource_type: _Optional[str] = ..., pool: _Optional[str] = ..., worker_spec: _Optional[str] = ..., worker_count: _Optional[int] = ..., custom_gpus: _Optional[int] = ..., rdma: _Optional[bool] = ..., image: _Optional[str] = ..., framework: _Optional[str] = ..., command: _Optional[str] = ..., env: _Optional[_Iterable[_Union[EnvVar, _Mapping]]] = ..., mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., public_data: _Optional[bool] = ..., tensorboard_dir: _Optional[str] = ..., output_dirs: _Optional[_Iterable[str]] = ..., priority: _Optional[int] = ..., fault_tolerance: _Optional[_Union[FaultTolerance, _Mapping]] = ..., spot: _Optional[_Union[SpotOptions, _Mapping]] = ..., alerts: _Optional[_Iterable[_Union[AlertSubscription, _Mapping]]] = ...) -> None: ...

class TaskChanges(_message.Message):
    __slots__ = ("spec", "update_mask")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    spec: TaskSpec
    update_mask: _field_mask_pb2.FieldMask
    def __init__(self, spec: _Optional[_Union[TaskSpec, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ...) -> None: ...

class CreateTaskRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: TaskSpec
    def __init__(self, spec: _Optional[_Union[TaskSpec, _Mapping]] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class StopTaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class RerunTaskRequest(_message.Message):
    __slots__ = ("task_id", "changes")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    changes: TaskChanges
    def __init__(self, task_id: _Optional[str] = ..., changes: _Optional[_Union[TaskChanges, _Mapping]] = ...) -> None: ...

class CloneTaskRequest(_message.Message):
    __slots__ = ("task_id", "overrides")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    overrides: TaskChanges
    def __init__(self, task_id: _Optional[str] = ..., overrides: _Optional[_Union[TaskChanges, _Mapping]] = ...) -> None: ...

class SubmissionWarning(_message.Message):
    __slots__ = ("code", "field", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    field: str
    message: str
    def __init__(self, code: _Optional[str] = ..., field: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class QueuePlace(_message.Message):
    __slots__ = ("reason", "position", "gpus_needed", "launchable", "blocked", "queued_at", "as_of")
    REASON_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    GPUS_NEEDED_FIELD_NUMBER: _ClassVar[int]
    LAUNCHABLE_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_FIELD_NUMBER: _ClassVar[int]
    QUEUED_AT_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    reason: str
    position: int
    gpus_needed: int
    launchable: int
    blocked: bool
    queued_at: _timestamp_pb2.Timestamp
    as_of: _timestamp_pb2.Timestamp
    def __init__(self, reason: _Optional[str] = ..., position: _Optional[int] = ..., gpus_needed: _Optional[int] = ..., launchable: _Optional[int] = ..., blocked: _Optional[bool] = ..., queued_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class TaskCounters(_message.Message):
    __slots__ = ("restarts", "reschedules", "requeues", "preemptions", "hangs", "slowdowns")
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    RESCHEDULES_FIELD_NUMBER: _ClassVar[int]
    REQUEUES_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    HANGS_FIELD_NUMBER: _ClassVar[int]
    SLOWDOWNS_FIELD_NUMBER: _ClassVar[int]
    restarts: int
    reschedules: int
    requeues: int
    preemptions: int
    hangs: int
    slowdowns: int
    def __init__(self, restarts: _Optional[int] = ..., reschedules: _Optional[int] = ..., requeues: _Optional[int] = ..., preemptions: _Optional[int] = ..., hangs: _Optional[int] = ..., slowdowns: _Optional[int] = ...) -> None: ...

class StageSpan(_message.Message):
    __slots__ = ("run", "attempt", "stage", "start_time", "finish_time", "duration_ms", "result", "reason")
    RUN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run: int
    attempt: int
    stage: DeployStage
    start_time: _timestamp_pb2.Timestamp
    finish_time: _timestamp_pb2.Timestamp
    duration_ms: int
    result: StageResult
    reason: str
    def __init__(self, run: _Optional[int] = ..., attempt: _Optional[int] = ..., stage: _Optional[_Union[DeployStage, str]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., duration_ms: _Optional[int] = ..., result: _Optional[_Union[StageResult, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("task_id", "tenant", "creator", "name", "status", "stage", "run", "attempt", "spec", "warnings", "group_id", "cloned_from", "clones", "submit_time", "queue_time", "start_time", "finish_time", "queue", "last_failure_reason", "stop_reason", "counters", "stages", "version")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CREATOR_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    CLONED_FROM_FIELD_NUMBER: _ClassVar[int]
    CLONES_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_TIME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    LAST_FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    tenant: str
    creator: str
    name: str
    status: TaskStatus
    stage: DeployStage
    run: int
    attempt: int
    spec: TaskSpec
    warnings: _containers.RepeatedCompositeFieldContainer[SubmissionWarning]
    group_id: str
    cloned_from: str
    clones: _containers.RepeatedScalarFieldContainer[str]
    submit_time: _timestamp_pb2.Timestamp
    queue_time: _timestamp_pb2.Timestamp
    start_time: _timestamp_pb2.Timestamp
    finish_time: _timestamp_pb2.Timestamp
    queue: QueuePlace
    last_failure_reason: str
    stop_reason: str
    counters: TaskCounters
    stages: _containers.RepeatedCompositeFieldContainer[StageSpan]
    version: int
    def __init__(self, task_id: _Optional[str] = ..., tenant: _Optional[str] = ..., creator: _Optional[str] = ..., name: _Optional[str] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., stage: _Optional[_Union[DeployStage, str]] = ..., run: _Optional[int] = ..., attempt: _Optional[int] = ..., spec: _Optional[_Union[TaskSpec, _Mapping]] = ..., warnings: _Optional[_Iterable[_Union[SubmissionWarning, _Mapping]]] = ..., group_id: _Optional[str] = ..., cloned_from: _Optional[str] = ..., clones: _Optional[_Iterable[str]] = ..., submit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., queue_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., queue: _Optional[_Union[QueuePlace, _Mapping]] = ..., last_failure_reason: _Optional[str] = ..., stop_reason: _Optional[str] = ..., counters: _Optional[_Union[TaskCounters, _Mapping]] = ..., stages: _Optional[_Iterable[_Union[StageSpan, _Mapping]]] = ..., version: _Optional[int] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("status", "name", "tag", "pool", "creator", "limit", "cursor", "tenant")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    CREATOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    status: str
    name: str
    tag: str
    pool: str
    creator: str
    limit: int
    cursor: str
    tenant: str
    def __init__(self, status: _Optional[str] = ..., name: _Optional[str] = ..., tag: _Optional[str] = ..., pool: _Optional[str] = ..., creator: _Optional[str] = ..., limit: _Optional[int] = ..., cursor: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class TaskSummary(_message.Message):
    __slots__ = ("task_id", "tenant", "creator", "name", "status", "stage", "pool", "tags", "group_id", "cloned_from", "run", "create_time", "update_time", "workers", "restarts", "queue")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CREATOR_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    CLONED_FROM_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    tenant: str
    creator: str
    name: str
    status: TaskStatus
    stage: DeployStage
    pool: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    group_id: str
    cloned_from: str
    run: int
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    workers: int
    restarts: int
    queue: QueuePlace
    def __init__(self, task_id: _Optional[str] = ..., tenant: _Optional[str] = ..., creator: _Optional[str] = ..., name: _Optional[str] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., stage: _Optional[_Union[DeployStage, str]] = ..., pool: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., group_id: _Optional[str] = ..., cloned_from: _Optional[str] = ..., run: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., workers: _Optional[int] = ..., restarts: _Optional[int] = ..., queue: _Optional[_Union[QueuePlace, _Mapping]] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks", "next_cursor")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskSummary]
    next_cursor: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskSummary, _Mapping]]] = ..., next_cursor: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("position", "event_id", "version", "type", "occur_time", "actor", "correlation_id", "causation_id", "data")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OCCUR_TIME_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    CAUSATION_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    position: int
    event_id: str
    version: int
    type: str
    occur_time: _timestamp_pb2.Timestamp
    actor: str
    correlation_id: str
    causation_id: str
    data: _struct_pb2.Struct
    def __init__(self, position: _Optional[int] = ..., event_id: _Optional[str] = ..., version: _Optional[int] = ..., type: _Optional[str] = ..., occur_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., actor: _Optional[str] = ..., correlation_id: _Optional[str] = ..., causation_id: _Optional[str] = ..., data: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class ListTaskEventsRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class ListTaskEventsResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

class WatchTaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class GetPoolCapacityRequest(_message.Message):
    __slots__ = ("pool_id",)
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    def __init__(self, pool_id: _Optional[str] = ...) -> None: ...

class PoolCapacity(_message.Message):
    __slots__ = ("pool_id", "source", "launchable", "custom_gpus_max", "total_gpus", "queued_tasks", "nodes", "schedulable_nodes", "schedulable_gpus", "free_gpus", "occupancy", "queue", "as_of")
    class LaunchableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    LAUNCHABLE_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_GPUS_MAX_FIELD_NUMBER: _ClassVar[int]
    TOTAL_GPUS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_TASKS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    SCHEDULABLE_NODES_FIELD_NUMBER: _ClassVar[int]
    SCHEDULABLE_GPUS_FIELD_NUMBER: _ClassVar[int]
    FREE_GPUS_FIELD_NUMBER: _ClassVar[int]
    OCCUPANCY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    source: str
    launchable: _containers.ScalarMap[str, int]
    custom_gpus_max: int
    total_gpus: int
    queued_tasks: int
    nodes: int
    schedulable_nodes: int
    schedulable_gpus: int
    free_gpus: int
    occupancy: Occupancy
    queue: QueueLoad
    as_of: _timestamp_pb2.Timestamp
    def __init__(self, pool_id: _Optional[str] = ..., source: _Optional[str] = ..., launchable: _Optional[_Mapping[str, int]] = ..., custom_gpus_max: _Optional[int] = ..., total_gpus: _Optional[int] = ..., queued_tasks: _Optional[int] = ..., nodes: _Optional[int] = ..., schedulable_nodes: _Optional[int] = ..., schedulable_gpus: _Optional[int] = ..., free_gpus: _Optional[int] = ..., occupancy: _Optional[_Union[Occupancy, _Mapping]] = ..., queue: _Optional[_Union[QueueLoad, _Mapping]] = ..., as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateGroupRequest(_message.Message):
    __slots__ = ("template", "items", "group_id")
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    template: TaskSpec
    items: _containers.RepeatedCompositeFieldContainer[TaskChanges]
    group_id: str
    def __init__(self, template: _Optional[_Union[TaskSpec, _Mapping]] = ..., items: _Optional[_Iterable[_Union[TaskChanges, _Mapping]]] = ..., group_id: _Optional[str] = ...) -> None: ...

class GetGroupRequest(_message.Message):
    __slots__ = ("group_id", "tenant")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    tenant: str
    def __init__(self, group_id: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class StopGroupRequest(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class Group(_message.Message):
    __slots__ = ("group_id", "tasks", "status_counts")
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
    group_id: str
    tasks: _containers.RepeatedCompositeFieldContainer[TaskSummary]
    status_counts: _containers.ScalarMap[str, int]
    def __init__(self, group_id: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[TaskSummary, _Mapping]]] = ..., status_counts: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("limit", "tenant", "cursor")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    limit: int
    tenant: str
    cursor: str
    def __init__(self, limit: _Optional[int] = ..., tenant: _Optional[str] = ..., cursor: _Optional[str] = ...) -> None: ...

class GroupSummary(_message.Message):
    __slots__ = ("group_id", "tasks", "status_counts", "create_time", "update_time")
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
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    tasks: int
    status_counts: _containers.ScalarMap[str, int]
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, group_id: _Optional[str] = ..., tasks: _Optional[int] = ..., status_counts: _Optional[_Mapping[str, int]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups", "next_cursor")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupSummary]
    next_cursor: str
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupSummary, _Mapping]]] = ..., next_cursor: _Optional[str] = ...) -> None: ...

class RerunGroupRequest(_message.Message):
    __slots__ = ("group_id", "changes")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    changes: TaskChanges
    def __init__(self, group_id: _Optional[str] = ..., changes: _Optional[_Union[TaskChanges, _Mapping]] = ...) -> None: ...

class LogFilter(_message.Message):
    __slots__ = ("workers", "run", "since", "until", "words", "phrase", "regex", "ignore_case", "attempt")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    WORDS_FIELD_NUMBER: _ClassVar[int]
    PHRASE_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    IGNORE_CASE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedScalarFieldContainer[int]
    run: int
    since: _timestamp_pb2.Timestamp
    until: _timestamp_pb2.Timestamp
    words: str
    phrase: str
    regex: str
    ignore_case: bool
    attempt: int
    def __init__(self, workers: _Optional[_Iterable[int]] = ..., run: _Optional[int] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., words: _Optional[str] = ..., phrase: _Optional[str] = ..., regex: _Optional[str] = ..., ignore_case: _Optional[bool] = ..., attempt: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("time", "run", "attempt", "worker", "stream", "line")
    TIME_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    run: int
    attempt: int
    worker: int
    stream: str
    line: str
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., run: _Optional[int] = ..., attempt: _Optional[int] = ..., worker: _Optional[int] = ..., stream: _Optional[str] = ..., line: _Optional[str] = ...) -> None: ...

class SearchLogsResponse(_message.Message):
    __slots__ = ("lines", "next_cursor", "tail_cursor")
    LINES_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    TAIL_CURSOR_FIELD_NUMBER: _ClassVar[int]
    lines: _containers.RepeatedCompositeFieldContainer[LogLine]
    next_cursor: str
    tail_cursor: str
    def __init__(self, lines: _Optional[_Iterable[_Union[LogLine, _Mapping]]] = ..., next_cursor: _Optional[str] = ..., tail_cursor: _Optional[str] = ...) -> None: ...

class FollowLogsResponse(_message.Message):
    __slots__ = ("lines", "next_cursor", "tail_cursor")
    LINES_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    TAIL_CURSOR_FIELD_NUMBER: _ClassVar[int]
    lines: _containers.RepeatedCompositeFieldContainer[LogLine]
    next_cursor: str
    tail_cursor: str
    def __init__(self, lines: _Optional[_Iterable[_Union[LogLine, _Mapping]]] = ..., next_cursor: _Optional[str] = ..., tail_cursor: _Optional[str] = ...) -> None: ...

class GetFirstErrorRequest(_message.Message):
    __slots__ = ("task_id", "run")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    run: int
    def __init__(self, task_id: _Optional[str] = ..., run: _Optional[int] = ...) -> None: ...

class FirstError(_message.Message):
    __slots__ = ("task_id", "found", "line", "exception", "before", "after", "layer", "rule", "why", "evidence", "status")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    EXCEPTION_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    found: bool
    line: LogLine
    exception: LogLine
    before: _containers.RepeatedCompositeFieldContainer[LogLine]
    after: _containers.RepeatedCompositeFieldContainer[LogLine]
    layer: str
    rule: str
    why: str
    evidence: str
    status: TaskStatus
    def __init__(self, task_id: _Optional[str] = ..., found: _Optional[bool] = ..., line: _Optional[_Union[LogLine, _Mapping]] = ..., exception: _Optional[_Union[LogLine, _Mapping]] = ..., before: _Optional[_Iterable[_Union[LogLine, _Mapping]]] = ..., after: _Optional[_Iterable[_Union[LogLine, _Mapping]]] = ..., layer: _Optional[str] = ..., rule: _Optional[str] = ..., why: _Optional[str] = ..., evidence: _Optional[str] = ..., status: _Optional[_Union[TaskStatus, str]] = ...) -> None: ...

class StartLogExportRequest(_message.Message):
    __slots__ = ("task_id", "filter", "format")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    filter: LogFilter
    format: str
    def __init__(self, task_id: _Optional[str] = ..., filter: _Optional[_Union[LogFilter, _Mapping]] = ..., format: _Optional[str] = ...) -> None: ...

class GetLogExportRequest(_message.Message):
    __slots__ = ("export_id",)
    EXPORT_ID_FIELD_NUMBER: _ClassVar[int]
    export_id: str
    def __init__(self, export_id: _Optional[str] = ...) -> None: ...

class ListLogExportsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LogExport(_message.Message):
    __slots__ = ("export_id", "task_id", "query", "format", "state", "lines_done", "lines_total", "error", "create_time", "finish_time")
    EXPORT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LINES_DONE_FIELD_NUMBER: _ClassVar[int]
    LINES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    export_id: str
    task_id: str
    query: LogFilter
    format: str
    state: str
    lines_done: int
    lines_total: int
    error: str
    create_time: _timestamp_pb2.Timestamp
    finish_time: _timestamp_pb2.Timestamp
    def __init__(self, export_id: _Optional[str] = ..., task_id: _Optional[str] = ..., query: _Optional[_Union[LogFilter, _Mapping]] = ..., format: _Optional[str] = ..., state: _Optional[str] = ..., lines_done: _Optional[int] = ..., lines_total: _Optional[int] = ..., error: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListLogExportsResponse(_message.Message):
    __slots__ = ("exports",)
    EXPORTS_FIELD_NUMBER: _ClassVar[int]
    exports: _containers.RepeatedCompositeFieldContainer[LogExport]
    def __init__(self, exports: _Optional[_Iterable[_Union[LogExport, _Mapping]]] = ...) -> None: ...

class GetTaskAtRequest(_message.Message):
    __slots__ = ("task_id", "at")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    at: str
    def __init__(self, task_id: _Optional[str] = ..., at: _Optional[str] = ...) -> None: ...

class ReplayPoint(_message.Message):
    __slots__ = ("position_point", "time_point", "position", "version", "occur_time", "last_event", "stream_events")
    POSITION_POINT_FIELD_NUMBER: _ClassVar[int]
    TIME_POINT_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OCCUR_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_EVENT_FIELD_NUMBER: _ClassVar[int]
    STREAM_EVENTS_FIELD_NUMBER: _ClassVar[int]
    position_point: int
    time_point: _timestamp_pb2.Timestamp
    position: int
    version: int
    occur_time: _timestamp_pb2.Timestamp
    last_event: str
    stream_events: int
    def __init__(self, position_point: _Optional[int] = ..., time_point: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., position: _Optional[int] = ..., version: _Optional[int] = ..., occur_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_event: _Optional[str] = ..., stream_events: _Optional[int] = ...) -> None: ...

class WorkerPlacement(_message.Message):
    __slots__ = ("worker", "node", "gpus", "started", "exit_code")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    worker: int
    node: str
    gpus: _containers.RepeatedScalarFieldContainer[int]
    started: bool
    exit_code: int
    def __init__(self, worker: _Optional[int] = ..., node: _Optional[str] = ..., gpus: _Optional[_Iterable[int]] = ..., started: _Optional[bool] = ..., exit_code: _Optional[int] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("pool", "run", "attempt", "workers")
    POOL_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    pool: str
    run: int
    attempt: int
    workers: _containers.RepeatedCompositeFieldContainer[WorkerPlacement]
    def __init__(self, pool: _Optional[str] = ..., run: _Optional[int] = ..., attempt: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[WorkerPlacement, _Mapping]]] = ...) -> None: ...

class GetTaskAtResponse(_message.Message):
    __slots__ = ("task_id", "as_of", "task", "placement")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    as_of: ReplayPoint
    task: Task
    placement: Placement
    def __init__(self, task_id: _Optional[str] = ..., as_of: _Optional[_Union[ReplayPoint, _Mapping]] = ..., task: _Optional[_Union[Task, _Mapping]] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ...) -> None: ...

class DiffTaskRequest(_message.Message):
    __slots__ = ("task_id", "from_point", "to_point")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_POINT_FIELD_NUMBER: _ClassVar[int]
    TO_POINT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    from_point: str
    to_point: str
    def __init__(self, task_id: _Optional[str] = ..., from_point: _Optional[str] = ..., to_point: _Optional[str] = ...) -> None: ...

class FieldChange(_message.Message):
    __slots__ = ("field", "from_value", "to_value")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    FROM_VALUE_FIELD_NUMBER: _ClassVar[int]
    TO_VALUE_FIELD_NUMBER: _ClassVar[int]
    field: str
    from_value: _struct_pb2.Value
    to_value: _struct_pb2.Value
    def __init__(self, field: _Optional[str] = ..., from_value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., to_value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...

class DiffTaskResponse(_message.Message):
    __slots__ = ("task_id", "from_point", "to_point", "changes", "events", "events_between", "truncated")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_POINT_FIELD_NUMBER: _ClassVar[int]
    TO_POINT_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_BETWEEN_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    from_point: ReplayPoint
    to_point: ReplayPoint
    changes: _containers.RepeatedCompositeFieldContainer[FieldChange]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    events_between: int
    truncated: bool
    def __init__(self, task_id: _Optional[str] = ..., from_point: _Optional[_Union[ReplayPoint, _Mapping]] = ..., to_point: _Optional[_Union[ReplayPoint, _Mapping]] = ..., changes: _Optional[_Iterable[_Union[FieldChange, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., events_between: _Optional[int] = ..., truncated: _Optional[bool] = ...) -> None: ...

class GetPoolsAtRequest(_message.Message):
    __slots__ = ("at", "pool_id")
    AT_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    at: str
    pool_id: str
    def __init__(self, at: _Optional[str] = ..., pool_id: _Optional[str] = ...) -> None: ...

class PoolCounts(_message.Message):
    __slots__ = ("nodes", "schedulable_nodes", "schedulable_gpus", "free_gpus", "launchable", "custom_gpus_max")
    class LaunchableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODES_FIELD_NUMBER: _ClassVar[int]
    SCHEDULABLE_NODES_FIELD_NUMBER: _ClassVar[int]
    SCHEDULABLE_GPUS_FIELD_NUMBER: _ClassVar[int]
    FREE_GPUS_FIELD_NUMBER: _ClassVar[int]
    LAUNCHABLE_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_GPUS_MAX_FIELD_NUMBER: _ClassVar[int]
    nodes: int
    schedulable_nodes: int
    schedulable_gpus: int
    free_gpus: int
    launchable: _containers.ScalarMap[str, int]
    custom_gpus_max: int
    def __init__(self, nodes: _Optional[int] = ..., schedulable_nodes: _Optional[int] = ..., schedulable_gpus: _Optional[int] = ..., free_gpus: _Optional[int] = ..., launchable: _Optional[_Mapping[str, int]] = ..., custom_gpus_max: _Optional[int] = ...) -> None: ...

class NodeHealthCounts(_message.Message):
    __slots__ = ("healthy", "faulty", "cordoned")
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    FAULTY_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    healthy: int
    faulty: int
    cordoned: int
    def __init__(self, healthy: _Optional[int] = ..., faulty: _Optional[int] = ..., cordoned: _Optional[int] = ...) -> None: ...

class NodeView(_message.Message):
    __slots__ = ("node", "health", "fault", "gpus", "free", "owners")
    NODE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    FAULT_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    node: str
    health: str
    fault: str
    gpus: int
    free: int
    owners: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node: _Optional[str] = ..., health: _Optional[str] = ..., fault: _Optional[str] = ..., gpus: _Optional[int] = ..., free: _Optional[int] = ..., owners: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeList(_message.Message):
    __slots__ = ("total", "truncated", "items")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    total: int
    truncated: bool
    items: _containers.RepeatedCompositeFieldContainer[NodeView]
    def __init__(self, total: _Optional[int] = ..., truncated: _Optional[bool] = ..., items: _Optional[_Iterable[_Union[NodeView, _Mapping]]] = ...) -> None: ...

class AllocatedWorker(_message.Message):
    __slots__ = ("index", "node", "gpus")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    index: int
    node: str
    gpus: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, index: _Optional[int] = ..., node: _Optional[str] = ..., gpus: _Optional[_Iterable[int]] = ...) -> None: ...

class PoolAllocation(_message.Message):
    __slots__ = ("task_id", "run", "attempt", "priority", "resource_type", "gpus", "workers")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    run: int
    attempt: int
    priority: int
    resource_type: str
    gpus: int
    workers: _containers.RepeatedCompositeFieldContainer[AllocatedWorker]
    def __init__(self, task_id: _Optional[str] = ..., run: _Optional[int] = ..., attempt: _Optional[int] = ..., priority: _Optional[int] = ..., resource_type: _Optional[str] = ..., gpus: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[AllocatedWorker, _Mapping]]] = ...) -> None: ...

class Occupancy(_message.Message):
    __slots__ = ("tasks", "allocated_gpus", "truncated", "items")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_GPUS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    tasks: int
    allocated_gpus: int
    truncated: bool
    items: _containers.RepeatedCompositeFieldContainer[PoolAllocation]
    def __init__(self, tasks: _Optional[int] = ..., allocated_gpus: _Optional[int] = ..., truncated: _Optional[bool] = ..., items: _Optional[_Iterable[_Union[PoolAllocation, _Mapping]]] = ...) -> None: ...

class QueuedTask(_message.Message):
    __slots__ = ("task_id", "position", "priority", "worker_gpus", "gpus", "waited_s", "reason")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    WORKER_GPUS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    WAITED_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    position: int
    priority: int
    worker_gpus: _containers.RepeatedScalarFieldContainer[int]
    gpus: int
    waited_s: float
    reason: str
    def __init__(self, task_id: _Optional[str] = ..., position: _Optional[int] = ..., priority: _Optional[int] = ..., worker_gpus: _Optional[_Iterable[int]] = ..., gpus: _Optional[int] = ..., waited_s: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class QueueLoad(_message.Message):
    __slots__ = ("waiting", "gpus", "oldest_wait_s", "head", "items")
    WAITING_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    OLDEST_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    waiting: int
    gpus: int
    oldest_wait_s: float
    head: str
    items: _containers.RepeatedCompositeFieldContainer[QueuedTask]
    def __init__(self, waiting: _Optional[int] = ..., gpus: _Optional[int] = ..., oldest_wait_s: _Optional[float] = ..., head: _Optional[str] = ..., items: _Optional[_Iterable[_Union[QueuedTask, _Mapping]]] = ...) -> None: ...

class PoolAt(_message.Message):
    __slots__ = ("pool_id", "zone", "resource_type", "gpu_model", "network", "capacity", "health", "nodes", "occupancy", "as_of")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    OCCUPANCY_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    zone: str
    resource_type: str
    gpu_model: str
    network: str
    capacity: PoolCounts
    health: NodeHealthCounts
    nodes: NodeList
    occupancy: Occupancy
    as_of: ReplayPoint
    def __init__(self, pool_id: _Optional[str] = ..., zone: _Optional[str] = ..., resource_type: _Optional[str] = ..., gpu_model: _Optional[str] = ..., network: _Optional[str] = ..., capacity: _Optional[_Union[PoolCounts, _Mapping]] = ..., health: _Optional[_Union[NodeHealthCounts, _Mapping]] = ..., nodes: _Optional[_Union[NodeList, _Mapping]] = ..., occupancy: _Optional[_Union[Occupancy, _Mapping]] = ..., as_of: _Optional[_Union[ReplayPoint, _Mapping]] = ...) -> None: ...

class GetPoolsAtResponse(_message.Message):
    __slots__ = ("position_point", "time_point", "pools", "absent")
    POSITION_POINT_FIELD_NUMBER: _ClassVar[int]
    TIME_POINT_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    ABSENT_FIELD_NUMBER: _ClassVar[int]
    position_point: int
    time_point: _timestamp_pb2.Timestamp
    pools: _containers.RepeatedCompositeFieldContainer[PoolAt]
    absent: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, position_point: _Optional[int] = ..., time_point: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pools: _Optional[_Iterable[_Union[PoolAt, _Mapping]]] = ..., absent: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeNames(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeRange(_message.Message):
    __slots__ = ("prefix", "count", "gpus")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    count: int
    gpus: int
    def __init__(self, prefix: _Optional[str] = ..., count: _Optional[int] = ..., gpus: _Optional[int] = ...) -> None: ...

class WhatIfPool(_message.Message):
    __slots__ = ("pool_id", "node_names", "node_range")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_NAMES_FIELD_NUMBER: _ClassVar[int]
    NODE_RANGE_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    node_names: NodeNames
    node_range: NodeRange
    def __init__(self, pool_id: _Optional[str] = ..., node_names: _Optional[_Union[NodeNames, _Mapping]] = ..., node_range: _Optional[_Union[NodeRange, _Mapping]] = ...) -> None: ...

class WhatIfRequest(_message.Message):
    __slots__ = ("start_time", "end_time", "pools", "policy", "pool_id")
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    pools: _containers.RepeatedCompositeFieldContainer[WhatIfPool]
    policy: str
    pool_id: str
    def __init__(self, start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pools: _Optional[_Iterable[_Union[WhatIfPool, _Mapping]]] = ..., policy: _Optional[str] = ..., pool_id: _Optional[str] = ...) -> None: ...

class RealAndSimulated(_message.Message):
    __slots__ = ("real", "simulated")
    REAL_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_FIELD_NUMBER: _ClassVar[int]
    real: int
    simulated: int
    def __init__(self, real: _Optional[int] = ..., simulated: _Optional[int] = ...) -> None: ...

class WhatIfOutcome(_message.Message):
    __slots__ = ("runs", "placed", "waiting_at_end", "left_queue", "p50_s", "p90_s", "p99_s", "max_s", "mean_s", "gpu_hours", "utilisation", "capacity_gpu_hours")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    PLACED_FIELD_NUMBER: _ClassVar[int]
    WAITING_AT_END_FIELD_NUMBER: _ClassVar[int]
    LEFT_QUEUE_FIELD_NUMBER: _ClassVar[int]
    P50_S_FIELD_NUMBER: _ClassVar[int]
    P90_S_FIELD_NUMBER: _ClassVar[int]
    P99_S_FIELD_NUMBER: _ClassVar[int]
    MAX_S_FIELD_NUMBER: _ClassVar[int]
    MEAN_S_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_FIELD_NUMBER: _ClassVar[int]
    UTILISATION_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_GPU_HOURS_FIELD_NUMBER: _ClassVar[int]
    runs: int
    placed: int
    waiting_at_end: int
    left_queue: int
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float
    mean_s: float
    gpu_hours: float
    utilisation: float
    capacity_gpu_hours: float
    def __init__(self, runs: _Optional[int] = ..., placed: _Optional[int] = ..., waiting_at_end: _Optional[int] = ..., left_queue: _Optional[int] = ..., p50_s: _Optional[float] = ..., p90_s: _Optional[float] = ..., p99_s: _Optional[float] = ..., max_s: _Optional[float] = ..., mean_s: _Optional[float] = ..., gpu_hours: _Optional[float] = ..., utilisation: _Optional[float] = ..., capacity_gpu_hours: _Optional[float] = ...) -> None: ...

class WhatIfSpec(_message.Message):
    __slots__ = ("spec", "real", "simulated")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REAL_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_FIELD_NUMBER: _ClassVar[int]
    spec: str
    real: WhatIfOutcome
    simulated: WhatIfOutcome
    def __init__(self, spec: _Optional[str] = ..., real: _Optional[_Union[WhatIfOutcome, _Mapping]] = ..., simulated: _Optional[_Union[WhatIfOutcome, _Mapping]] = ...) -> None: ...

class WhatIfPoolReport(_message.Message):
    __slots__ = ("pool_id", "nodes", "gpus", "real", "simulated", "specs", "node_changes", "node_changes_skipped", "displaced", "runs_skipped")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    REAL_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_FIELD_NUMBER: _ClassVar[int]
    SPECS_FIELD_NUMBER: _ClassVar[int]
    NODE_CHANGES_FIELD_NUMBER: _ClassVar[int]
    NODE_CHANGES_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    DISPLACED_FIELD_NUMBER: _ClassVar[int]
    RUNS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    nodes: RealAndSimulated
    gpus: RealAndSimulated
    real: WhatIfOutcome
    simulated: WhatIfOutcome
    specs: _containers.RepeatedCompositeFieldContainer[WhatIfSpec]
    node_changes: int
    node_changes_skipped: int
    displaced: int
    runs_skipped: int
    def __init__(self, pool_id: _Optional[str] = ..., nodes: _Optional[_Union[RealAndSimulated, _Mapping]] = ..., gpus: _Optional[_Union[RealAndSimulated, _Mapping]] = ..., real: _Optional[_Union[WhatIfOutcome, _Mapping]] = ..., simulated: _Optional[_Union[WhatIfOutcome, _Mapping]] = ..., specs: _Optional[_Iterable[_Union[WhatIfSpec, _Mapping]]] = ..., node_changes: _Optional[int] = ..., node_changes_skipped: _Optional[int] = ..., displaced: _Optional[int] = ..., runs_skipped: _Optional[int] = ...) -> None: ...

class WhatIfRun(_message.Message):
    __slots__ = ("task_id", "run", "pool", "spec", "arrive_time", "real_place_time", "simulated_place_time", "real_wait_s", "simulated_wait_s")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    ARRIVE_TIME_FIELD_NUMBER: _ClassVar[int]
    REAL_PLACE_TIME_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_PLACE_TIME_FIELD_NUMBER: _ClassVar[int]
    REAL_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    run: int
    pool: str
    spec: str
    arrive_time: _timestamp_pb2.Timestamp
    real_place_time: _timestamp_pb2.Timestamp
    simulated_place_time: _timestamp_pb2.Timestamp
    real_wait_s: float
    simulated_wait_s: float
    def __init__(self, task_id: _Optional[str] = ..., run: _Optional[int] = ..., pool: _Optional[str] = ..., spec: _Optional[str] = ..., arrive_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., real_place_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., simulated_place_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., real_wait_s: _Optional[float] = ..., simulated_wait_s: _Optional[float] = ...) -> None: ...

class WhatIfResponse(_message.Message):
    __slots__ = ("start_time", "end_time", "policy", "events_read", "pools", "runs", "runs_listed", "runs_total")
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    EVENTS_READ_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    RUNS_LISTED_FIELD_NUMBER: _ClassVar[int]
    RUNS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    policy: str
    events_read: int
    pools: _containers.RepeatedCompositeFieldContainer[WhatIfPoolReport]
    runs: _containers.RepeatedCompositeFieldContainer[WhatIfRun]
    runs_listed: int
    runs_total: int
    def __init__(self, start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., policy: _Optional[str] = ..., events_read: _Optional[int] = ..., pools: _Optional[_Iterable[_Union[WhatIfPoolReport, _Mapping]]] = ..., runs: _Optional[_Iterable[_Union[WhatIfRun, _Mapping]]] = ..., runs_listed: _Optional[int] = ..., runs_total: _Optional[int] = ...) -> None: ...

class TraceRequest(_message.Message):
    __slots__ = ("task_id", "event_id", "limit")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    event_id: str
    limit: int
    def __init__(self, task_id: _Optional[str] = ..., event_id: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class TraceNode(_message.Message):
    __slots__ = ("position", "event_id", "stream_id", "version", "type", "occur_time", "actor", "causation_id", "correlation_id", "trace_id", "redacted", "depth", "parent")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OCCUR_TIME_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    CAUSATION_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    REDACTED_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    position: int
    event_id: str
    stream_id: str
    version: int
    type: str
    occur_time: _timestamp_pb2.Timestamp
    actor: str
    causation_id: str
    correlation_id: str
    trace_id: str
    redacted: bool
    depth: int
    parent: str
    def __init__(self, position: _Optional[int] = ..., event_id: _Optional[str] = ..., stream_id: _Optional[str] = ..., version: _Optional[int] = ..., type: _Optional[str] = ..., occur_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., actor: _Optional[str] = ..., causation_id: _Optional[str] = ..., correlation_id: _Optional[str] = ..., trace_id: _Optional[str] = ..., redacted: _Optional[bool] = ..., depth: _Optional[int] = ..., parent: _Optional[str] = ...) -> None: ...

class TraceResponse(_message.Message):
    __slots__ = ("task_id", "event_id", "correlation_ids", "trace_ids", "events", "truncated", "limit", "tree")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_IDS_FIELD_NUMBER: _ClassVar[int]
    TRACE_IDS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    event_id: str
    correlation_ids: _containers.RepeatedScalarFieldContainer[str]
    trace_ids: _containers.RepeatedScalarFieldContainer[str]
    events: int
    truncated: bool
    limit: int
    tree: _containers.RepeatedCompositeFieldContainer[TraceNode]
    def __init__(self, task_id: _Optional[str] = ..., event_id: _Optional[str] = ..., correlation_ids: _Optional[_Iterable[str]] = ..., trace_ids: _Optional[_Iterable[str]] = ..., events: _Optional[int] = ..., truncated: _Optional[bool] = ..., limit: _Optional[int] = ..., tree: _Optional[_Iterable[_Union[TraceNode, _Mapping]]] = ...) -> None: ...

class GetFaultToleranceLogRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class FaultToleranceLine(_message.Message):
    __slots__ = ("time", "run", "attempt", "kind", "level", "text")
    TIME_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    run: int
    attempt: int
    kind: str
    level: str
    text: str
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., run: _Optional[int] = ..., attempt: _Optional[int] = ..., kind: _Optional[str] = ..., level: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class FaultToleranceCounts(_message.Message):
    __slots__ = ("restarts", "reschedules", "hangs", "slowdowns")
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    RESCHEDULES_FIELD_NUMBER: _ClassVar[int]
    HANGS_FIELD_NUMBER: _ClassVar[int]
    SLOWDOWNS_FIELD_NUMBER: _ClassVar[int]
    restarts: int
    reschedules: int
    hangs: int
    slowdowns: int
    def __init__(self, restarts: _Optional[int] = ..., reschedules: _Optional[int] = ..., hangs: _Optional[int] = ..., slowdowns: _Optional[int] = ...) -> None: ...

class FaultToleranceLog(_message.Message):
    __slots__ = ("task_id", "status", "run", "counts", "lines")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    status: TaskStatus
    run: int
    counts: FaultToleranceCounts
    lines: _containers.RepeatedCompositeFieldContainer[FaultToleranceLine]
    def __init__(self, task_id: _Optional[str] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., run: _Optional[int] = ..., counts: _Optional[_Union[FaultToleranceCounts, _Mapping]] = ..., lines: _Optional[_Iterable[_Union[FaultToleranceLine, _Mapping]]] = ...) -> None: ...

class ListStackReportsRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class StackReportSummary(_message.Message):
    __slots__ = ("report_id", "run", "attempt", "capture_time", "summary")
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_TIME_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    report_id: str
    run: int
    attempt: int
    capture_time: _timestamp_pb2.Timestamp
    summary: str
    def __init__(self, report_id: _Optional[str] = ..., run: _Optional[int] = ..., attempt: _Optional[int] = ..., capture_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., summary: _Optional[str] = ...) -> None: ...

class ListStackReportsResponse(_message.Message):
    __slots__ = ("task_id", "reports")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    reports: _containers.RepeatedCompositeFieldContainer[StackReportSummary]
    def __init__(self, task_id: _Optional[str] = ..., reports: _Optional[_Iterable[_Union[StackReportSummary, _Mapping]]] = ...) -> None: ...

class CaptureStacksRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class GetStackReportRequest(_message.Message):
    __slots__ = ("task_id", "report_id")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    report_id: str
    def __init__(self, task_id: _Optional[str] = ..., report_id: _Optional[str] = ...) -> None: ...

class StackFrame(_message.Message):
    __slots__ = ("name", "filename", "line")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    name: str
    filename: str
    line: int
    def __init__(self, name: _Optional[str] = ..., filename: _Optional[str] = ..., line: _Optional[int] = ...) -> None: ...

class ThreadStack(_message.Message):
    __slots__ = ("pid", "thread_id", "thread_name", "active", "frames")
    PID_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_NAME_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    pid: int
    thread_id: int
    thread_name: str
    active: bool
    frames: _containers.RepeatedCompositeFieldContainer[StackFrame]
    def __init__(self, pid: _Optional[int] = ..., thread_id: _Optional[int] = ..., thread_name: _Optional[str] = ..., active: _Optional[bool] = ..., frames: _Optional[_Iterable[_Union[StackFrame, _Mapping]]] = ...) -> None: ...

class ProcessStacks(_message.Message):
    __slots__ = ("pid", "threads", "error")
    PID_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    pid: int
    threads: _containers.RepeatedCompositeFieldContainer[ThreadStack]
    error: str
    def __init__(self, pid: _Optional[int] = ..., threads: _Optional[_Iterable[_Union[ThreadStack, _Mapping]]] = ..., error: _Optional[str] = ...) -> None: ...

class WorkerStacks(_message.Message):
    __slots__ = ("worker", "processes")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    worker: int
    processes: _containers.RepeatedCompositeFieldContainer[ProcessStacks]
    def __init__(self, worker: _Optional[int] = ..., processes: _Optional[_Iterable[_Union[ProcessStacks, _Mapping]]] = ...) -> None: ...

class WorkerFrames(_message.Message):
    __slots__ = ("worker", "frames")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    worker: int
    frames: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker: _Optional[int] = ..., frames: _Optional[_Iterable[str]] = ...) -> None: ...

class FunctionUse(_message.Message):
    __slots__ = ("function", "threads", "workers")
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    function: str
    threads: int
    workers: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, function: _Optional[str] = ..., threads: _Optional[int] = ..., workers: _Optional[_Iterable[int]] = ...) -> None: ...

class StackReport(_message.Message):
    __slots__ = ("report_id", "task_id", "run", "attempt", "capture_time", "workers", "frames_by_worker", "functions", "odd_ones_out", "summary", "note")
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_TIME_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    FRAMES_BY_WORKER_FIELD_NUMBER: _ClassVar[int]
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    ODD_ONES_OUT_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    report_id: str
    task_id: str
    run: int
    attempt: int
    capture_time: _timestamp_pb2.Timestamp
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStacks]
    frames_by_worker: _containers.RepeatedCompositeFieldContainer[WorkerFrames]
    functions: _containers.RepeatedCompositeFieldContainer[FunctionUse]
    odd_ones_out: _containers.RepeatedScalarFieldContainer[int]
    summary: str
    note: str
    def __init__(self, report_id: _Optional[str] = ..., task_id: _Optional[str] = ..., run: _Optional[int] = ..., attempt: _Optional[int] = ..., capture_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., workers: _Optional[_Iterable[_Union[WorkerStacks, _Mapping]]] = ..., frames_by_worker: _Optional[_Iterable[_Union[WorkerFrames, _Mapping]]] = ..., functions: _Optional[_Iterable[_Union[FunctionUse, _Mapping]]] = ..., odd_ones_out: _Optional[_Iterable[int]] = ..., summary: _Optional[str] = ..., note: _Optional[str] = ...) -> None: ...
