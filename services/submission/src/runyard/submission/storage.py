"""Storage rules (R-13): volumes, mount paths, public data, and local output paths.

A worker has a 50 GiB system disk that is not persisted; only mounted
high-performance volumes keep files after the task ends. Output, checkpoint
and TensorBoard paths outside them are accepted with a warning.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator

from runyard.contracts.resources import PUBLIC_DATA_PATH, Catalogue, PoolView
from runyard.contracts.spec import EnvVar, TaskSpec, VolumeMount
from runyard.domain.launch_command import MAX_WARNINGS_PER_CHECK
from runyard.submission.errors import ErrorCode, StorageError
from runyard.submission.warnings import SubmissionWarning, WarningCode

#: Mount paths that would hide what the image or the platform needs.
RESERVED_MOUNT_PATHS = frozenset({"/"})
#: System and platform directories: nothing may be mounted on them or under them
#: (the runtime creates a mount point, and on the local runtime a host path, for
#: each mount; the worker's /tmp and home are its own scratch).
RESERVED_MOUNT_TREES = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/srv",
    "/sys",
    "/tmp",
    "/usr",
    "/var",
    PUBLIC_DATA_PATH.rstrip("/"),
)

#: Output-like options of common launchers (HF Trainer, LLaMA-Factory, Megatron-LM, ...).
_OUTPUT_OPTION = re.compile(
    r"--(?:save|(?:output|save|ckpt|checkpoint|logging|log|tensorboard(?:[_-]log)?)[_-]?dir)"
    r"(?:=|\s+)(['\"]?)([^\s'\";|&]+)\1"
)
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def check_storage(spec: TaskSpec, catalogue: Catalogue, pool: PoolView) -> None:
    """Refuse unknown or out-of-zone volumes, bad mount paths, missing public data."""
    paths: list[str] = []
    for i, mount in enumerate(spec.mounts):
        _check_volume(mount, catalogue, pool, f"mounts[{i}]")
        path = _check_mount_path(mount.mount_path, f"mounts[{i}].mount_path")
        _check_no_overlap(path, paths, f"mounts[{i}].mount_path")
        paths.append(path)
    _check_public_data(spec, catalogue, pool)


def _check_volume(mount: VolumeMount, catalogue: Catalogue, pool: PoolView, field: str) -> None:
    named = catalogue.volumes_named(mount.file_system, mount.volume)
    label = f"{mount.file_system}/{mount.volume}"
    if not named:
        raise StorageError(
            ErrorCode.VOLUME_NOT_FOUND,
            field,
            f"volume {label} does not exist",
            f"check the file system and volume names, or create the volume in zone {pool.zone}",
        )
    if all(v.zone != pool.zone for v in named):
        zones = ", ".join(sorted({v.zone for v in named}))
        raise StorageError(
            ErrorCode.VOLUME_WRONG_ZONE,
            field,
            f"volume {label} is in zone {zones}, pool {pool.pool_id} is in zone {pool.zone}",
            f"mount a volume of zone {pool.zone} (copy the data there), "
            f"or clone the task to a pool in zone {zones}",
        )


def _check_mount_path(path: str, field: str) -> str:
    if not path.startswith("/") or ".." in path.split("/") or "\x00" in path:
        raise StorageError(
            ErrorCode.MOUNT_INVALID_PATH,
            field,
            f"mount path `{path}` is not an absolute path",
            "use an absolute path without `..`, e.g. /mnt/public",
        )
    normal = _normal(path)
    if normal in RESERVED_MOUNT_PATHS or any(_is_under(normal, t) for t in RESERVED_MOUNT_TREES):
        raise StorageError(
            ErrorCode.MOUNT_RESERVED_PATH,
            field,
            f"mount path `{path}` is, or is under, a system or platform directory "
            f"({', '.join(sorted(RESERVED_MOUNT_PATHS | set(RESERVED_MOUNT_TREES)))})",
            "mount the volume under /mnt (e.g. /mnt/public) or another path of your own",
        )
    return normal


def _check_no_overlap(path: str, earlier: list[str], field: str) -> None:
    for other in earlier:
        if _is_under(path, other) or _is_under(other, path):
            raise StorageError(
                ErrorCode.MOUNT_PATH_OVERLAP,
                field,
                f"mount path `{path}` overlaps mount path `{other}`",
                "give each volume its own mount path, neither inside the other",
            )


def _check_public_data(spec: TaskSpec, catalogue: Catalogue, pool: PoolView) -> None:
    if spec.public_data and catalogue.public_data_in(pool.zone) is None:
        zones = ", ".join(catalogue.public_data_zones()) or "none"
        raise StorageError(
            ErrorCode.PUBLIC_DATA_UNAVAILABLE,
            "public_data",
            f"zone {pool.zone} of pool {pool.pool_id} has no public data",
            f"turn public data off, or clone the task to a pool in a zone that has it ({zones})",
        )


def output_path_warnings(spec: TaskSpec) -> list[SubmissionWarning]:
    """R-13 warnings for output, checkpoint and TensorBoard paths off mounted shared storage.

    One warning per path, and at most `MAX_WARNINGS_PER_CHECK` for the paths of the
    launch command (a command may name thousands; warnings travel in the events)."""
    warnings: list[SubmissionWarning] = []
    seen: set[tuple[str, str]] = set()
    from_command = 0
    for field, raw in _output_paths(spec):
        path = _expand(raw, spec.env)
        if path.startswith("$") or (field, raw) in seen:
            continue  # set by a variable we cannot see, or said already
        seen.add((field, raw))
        warning = _path_warning(field, _clip(raw), path, spec.mounts)
        if warning is None:
            continue
        if field == "command":
            from_command += 1
            if from_command > MAX_WARNINGS_PER_CHECK:
                continue
        warnings.append(warning)
    return warnings


def _clip(text: str) -> str:
    return text if len(text) <= 200 else text[:197] + "..."


def _output_paths(spec: TaskSpec) -> Iterator[tuple[str, str]]:
    if spec.tensorboard_dir:
        yield "tensorboard_dir", spec.tensorboard_dir
    for i, path in enumerate(spec.output_dirs):
        yield f"output_dirs[{i}]", path
    for match in _OUTPUT_OPTION.finditer(spec.command):
        yield "command", match.group(2)


def _path_warning(
    field: str, raw: str, path: str, mounts: tuple[VolumeMount, ...]
) -> SubmissionWarning | None:
    if path.startswith("/"):
        normal = _normal(path)
        mount = next((m for m in mounts if _is_under(normal, _normal(m.mount_path))), None)
        if mount is not None:
            return None if not mount.read_only else _read_only(field, raw, mount.mount_path)
        if _is_under(normal, PUBLIC_DATA_PATH.rstrip("/")):
            return _read_only(field, raw, PUBLIC_DATA_PATH)
    return _local(field, raw, mounts)


def _local(field: str, raw: str, mounts: tuple[VolumeMount, ...]) -> SubmissionWarning:
    example = mounts[0].mount_path if mounts else "a mounted high-performance volume"
    return SubmissionWarning(
        code=WarningCode.STORAGE_LOCAL_OUTPUT,
        field=field,
        message=(
            f"`{raw}` is on the worker's local disk, not on mounted shared storage: "
            f"files there are gone when the task ends; write them under {example}"
        ),
    )


def _read_only(field: str, raw: str, mount_path: str) -> SubmissionWarning:
    return SubmissionWarning(
        code=WarningCode.STORAGE_READ_ONLY_OUTPUT,
        field=field,
        message=(
            f"`{raw}` is under {mount_path}, which is mounted read-only: writes there fail; "
            "write outputs to a volume mounted read-write"
        ),
    )


def _expand(path: str, env: tuple[EnvVar, ...]) -> str:
    # Creator-only values are never used: the result may be shown in a warning.
    values: dict[str, str] = {
        v.name: v.value for v in env if not v.creator_only and v.value is not None
    }

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, match.group(0))

    return _VARIABLE.sub(replace, path)


def _normal(path: str) -> str:
    normal = posixpath.normpath(path)
    return "/" + normal.lstrip("/")


def _is_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
