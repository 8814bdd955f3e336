"""What the submission rules accept but a person should know (R-13, R-14, R-04).

Warnings come back with the accepted task and are stored with its submission
event (`TaskSubmitted.warnings`), so the model is the event contract's
`SubmissionWarning` (code, field, message), re-exported here; this module
adds the stable codes the rules use. Warnings never stop a submission.
"""

from __future__ import annotations

from enum import StrEnum

from runyard.contracts.task_events import SubmissionWarning

__all__ = ["SubmissionWarning", "WarningCode"]


class WarningCode(StrEnum):
    """Stable machine codes of warnings; never rename one, only add."""

    STORAGE_LOCAL_OUTPUT = "storage.local_output"
    STORAGE_READ_ONLY_OUTPUT = "storage.read_only_output"
    COMMAND_PIPE_WITHOUT_PIPEFAIL = "command.pipe_without_pipefail"
    COMMAND_MASKS_FAILURE = "command.masks_failure"
    COMMAND_CONDA_NOT_INITIALISED = "command.conda_not_initialised"
    COMMAND_PATH_NOT_ON_WORKER = "command.path_not_on_worker"
    WORKERS_UNEVEN_GPUS = "workers.uneven_gpus"
    RESTARTS_WITHOUT_AUTO_RESTART = "fault_tolerance.restarts_without_auto_restart"
