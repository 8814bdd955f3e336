"""Submission rules (R-09 to R-17): every refusal's code, field and hint; every warning."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from runyard.contracts.resources import Catalogue, Image, PoolView, PublicData, Volume
from runyard.contracts.spec import (
    MASK,
    MAX_GROUP_SIZE,
    EnvVar,
    SpotOptions,
    TaskSpec,
    VolumeMount,
    mask_spec,
)
from runyard.domain.launch_command import command_warnings
from runyard.submission.changes import (
    check_group,
    clone_spec,
    expand_group,
    rerun_with_changes,
)
from runyard.submission.env import check_env, parse_env
from runyard.submission.errors import (
    ChangeError,
    EnvError,
    GroupItemError,
    ImageError,
    RdmaError,
    SpecError,
    StorageError,
    SubmissionError,
)
from runyard.submission.rules import IMAGES_NAMED, check_spec, closest_images
from runyard.submission.warnings import SubmissionWarning

CATALOGUE = Catalogue.from_dict(
    {
        "images": [
            {
                "name": "pytorch:2.3",
                "zones": ["cn-a", "cn-b"],
                "services": ["training", "dev_machine"],
            },
            {"name": "devbox:1", "zones": ["cn-a"], "services": ["dev_machine"]},
            {"name": "llm:1", "zones": ["cn-b"], "services": ["training"]},
        ],
        "volumes": [
            {"file_system": "fs1", "volume": "proj-a", "zone": "cn-a"},
            {"file_system": "fs1", "volume": "proj-c", "zone": "cn-a"},
            {"file_system": "fs2", "volume": "proj-b", "zone": "cn-b"},
        ],
        "public_data": [{"zone": "cn-a"}],
    }
)
SPECS = {"1gpu": 1, "2gpu": 2, "4gpu": 4, "8gpu": 8}
POOLS = {
    "pool-a": PoolView(
        pool_id="pool-a",
        zone="cn-a",
        resource_type="subscription",
        network="roce",
        specs=SPECS,
        total_gpus=64,
    ),
    "pool-eth": PoolView(
        pool_id="pool-eth",
        zone="cn-a",
        resource_type="subscription",
        network="ethernet",
        specs=SPECS,
    ),
    "spot-b": PoolView(
        pool_id="spot-b", zone="cn-b", resource_type="spot", network="ib", specs={"8gpu": 8}
    ),
}
SHARED = VolumeMount(file_system="fs1", volume="proj-a", mount_path="/mnt/public")


def make_spec(**changes: Any) -> TaskSpec:
    fields: dict[str, Any] = {
        "name": "llm-sft",
        "pool": "pool-a",
        "worker_spec": "8gpu",
        "image": "pytorch:2.3",
        "command": "cd /mnt/public/llm && python train.py",
        "mounts": (SHARED,),
    }
    return TaskSpec(**{**fields, **changes})


def check(spec: TaskSpec) -> list[SubmissionWarning]:
    warnings: list[SubmissionWarning] = check_spec(spec, CATALOGUE, POOLS.get(spec.pool))
    return warnings


def refusal(
    kind: type[SubmissionError], call: Callable[[], object], code: str, field: str
) -> SubmissionError:
    with pytest.raises(kind) as info:
        call()
    assert (info.value.code, info.value.field) == (code, field)
    assert info.value.hint
    return info.value


def codes(warnings: list[SubmissionWarning]) -> list[tuple[str, str]]:
    return [(str(w.code), w.field) for w in warnings]


# -- accepted ------------------------------------------------------------------------------


def test_a_good_spec_is_accepted_without_warnings() -> None:
    assert check(make_spec()) == []


def test_a_ddp_spot_task_on_an_ib_pool_with_rdma_is_accepted() -> None:
    spec = make_spec(
        pool="spot-b",
        resource_type="spot",
        spot=SpotOptions(),
        image="llm:1",
        rdma=True,
        framework="pytorch_ddp",
        worker_count=4,
        mounts=(),
        command="torchrun --nnodes $WORLD_SIZE train.py",
    )
    assert check(spec) == []


# -- pool, resource type, worker spec and count ---------------------------


def test_unknown_pool() -> None:
    err = refusal(SpecError, lambda: check(make_spec(pool="nope")), "pool.not_found", "pool")
    assert "nope" in err.message


def test_resource_type_must_match_the_pool() -> None:
    err = refusal(
        SpecError,
        lambda: check(make_spec(pool="spot-b", image="llm:1", mounts=())),
        "pool.resource_type_mismatch",
        "resource_type",
    )
    assert "spot" in err.hint


def test_spot_options_only_on_spot_tasks() -> None:
    err = refusal(
        SpecError, lambda: check(make_spec(spot=SpotOptions())), "spot.options_not_spot", "spot"
    )
    assert "remove the spot options" in err.hint


def test_a_worker_spec_or_custom_count_is_required() -> None:
    err = refusal(
        SpecError, lambda: check(make_spec(worker_spec=None)), "spec.missing", "worker_spec"
    )
    assert "1gpu, 2gpu, 4gpu, 8gpu" in err.hint


def test_worker_spec_and_custom_count_conflict() -> None:
    refusal(SpecError, lambda: check(make_spec(custom_gpus=4)), "spec.conflict", "custom_gpus")


def test_custom_count_takes_no_worker_count() -> None:
    spec = make_spec(worker_spec=None, custom_gpus=16, worker_count=2, framework="mpi")
    refusal(SpecError, lambda: check(spec), "workers.custom_count_conflict", "worker_count")


def test_worker_spec_must_exist_in_the_pool() -> None:
    err = refusal(
        SpecError, lambda: check(make_spec(worker_spec="16gpu")), "spec.unknown", "worker_spec"
    )
    assert "16gpu" in err.message
    assert "8gpu" in err.hint


def test_a_task_larger_than_the_pool_is_refused() -> None:
    spec = make_spec(framework="pytorch_ddp", worker_count=9)
    err = refusal(SpecError, lambda: check(spec), "workers.exceed_pool", "worker_count")
    assert "72 GPUs" in err.message and "64" in err.message


def test_pool_view_accepts_only_1_2_4_8_gpu_specs() -> None:
    with pytest.raises(ValueError, match="1, 2, 4 or 8"):
        PoolView(pool_id="p", zone="z", resource_type="spot", network="ib", specs={"3gpu": 3})


def test_uneven_custom_count_warns() -> None:
    spec = make_spec(worker_spec=None, custom_gpus=19, framework="pytorch_ddp")
    warnings = check(spec)
    assert codes(warnings) == [("workers.uneven_gpus", "custom_gpus")]
    assert "8 + 8 + 3" in warnings[0].message


@pytest.mark.parametrize("gpus", [3, 8, 16])
def test_even_or_single_worker_custom_count_does_not_warn(gpus: int) -> None:
    framework = "single" if gpus <= 8 else "mpi"
    assert check(make_spec(worker_spec=None, custom_gpus=gpus, framework=framework)) == []


# -- a restart limit that restarts nothing ---------------------------------------------


@pytest.mark.parametrize("limit", [1, 5])
def test_a_restart_limit_with_auto_restart_off_warns(limit: int) -> None:
    spec = make_spec(fault_tolerance={"max_restarts": limit})
    warnings = check(spec)
    assert codes(warnings) == [
        ("fault_tolerance.restarts_without_auto_restart", "fault_tolerance.max_restarts")
    ]
    assert f"max_restarts is {limit} but auto_restart is off" in warnings[0].message
    assert "auto_restart: true" in warnings[0].message


@pytest.mark.parametrize(
    "options",
    [
        {},  # the defaults: nothing was asked
        {"max_restarts": 0},  # no restart is wanted
        {"max_restarts": 3},  # the default, as a stored spec spells it out
        {"auto_restart": True, "max_restarts": 1},
    ],
)
def test_restart_options_that_do_what_they_say_do_not_warn(options: dict[str, Any]) -> None:
    assert check(make_spec(fault_tolerance=options)) == []


# -- framework -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"worker_count": 2}, "worker_count"),
        ({"worker_spec": None, "custom_gpus": 12}, "custom_gpus"),
    ],
)
def test_single_framework_has_exactly_one_worker(changes: dict[str, Any], field: str) -> None:
    err = refusal(SpecError, lambda: check(make_spec(**changes)), "framework.single_worker", field)
    assert "pytorch_ddp" in err.hint


@pytest.mark.parametrize("framework", ["pytorch_ddp", "mpi", "ray"])
def test_distributed_frameworks_take_several_workers(framework: str) -> None:
    assert check(make_spec(framework=framework, worker_count=4)) == []


# -- RDMA --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"pool": "pool-eth"}, "ethernet"),
        ({"worker_spec": "4gpu"}, "4 GPUs"),
        ({"worker_spec": None, "custom_gpus": 12, "framework": "mpi"}, "4, 8 GPUs"),
    ],
)
def test_rdma_needs_8_gpu_workers_on_a_roce_or_ib_pool(
    changes: dict[str, Any], reason: str
) -> None:
    spec = make_spec(rdma=True, **changes)
    err = refusal(RdmaError, lambda: check(spec), "rdma.not_allowed", "rdma")
    assert reason in err.message
    assert "RDMA needs 8-GPU workers on a RoCE/IB pool" in err.hint


def test_rdma_with_full_custom_workers_is_accepted() -> None:
    spec = make_spec(rdma=True, worker_spec=None, custom_gpus=16, framework="pytorch_ddp")
    assert check(spec) == []


# -- image -------------------------------------------------------------------------------


def test_image_must_exist() -> None:
    err = refusal(ImageError, lambda: check(make_spec(image="ghost:0")), "image.not_found", "image")
    assert "import the image to zone cn-a" in err.hint


def test_image_not_found_names_the_closest_images_of_the_zone() -> None:
    """The hint offers the zone's training images closest to the name asked, at most
    IMAGES_NAMED of them, and how to list them all."""
    err = refusal(
        ImageError, lambda: check(make_spec(image="pytorch:2.4")), "image.not_found", "image"
    )
    assert "images of zone cn-a closest to it: pytorch:2.3;" in err.hint, err.hint
    assert "`runyard images --zone cn-a` lists them all" in err.hint
    # neither devbox:1 (not for training) nor llm:1 (another zone) is offered
    assert "devbox" not in err.hint and "llm" not in err.hint

    many = Catalogue.from_dict(
        {
            "images": [
                {"name": n, "zones": ["cn-a"], "services": ["training"]}
                for n in ("bash", "pytorch:2.1", "pytorch:2.3", "pytorch:1.0", "jax:0.4", "tf:2")
            ]
        }
    )
    closest = ["pytorch:2.1", "pytorch:2.3", "pytorch:1.0"][:IMAGES_NAMED]
    assert closest_images("pytorch:2.2", many, "cn-a") == closest
    assert closest_images("x", Catalogue(), "cn-a") == []
    empty = refusal(
        ImageError,
        lambda: check_spec(make_spec(image="ghost:0"), Catalogue(), POOLS["pool-a"]),
        "image.not_found",
        "image",
    )
    assert "closest" not in empty.hint and "runyard images --zone cn-a" in empty.hint


def test_image_must_list_training_among_its_services() -> None:
    err = refusal(
        ImageError, lambda: check(make_spec(image="devbox:1")), "image.service_missing", "image"
    )
    assert "dev_machine" in err.message
    assert err.hint == "edit the available services of image devbox:1 to include training"


def test_image_must_be_in_the_pools_zone() -> None:
    err = refusal(ImageError, lambda: check(make_spec(image="llm:1")), "image.wrong_zone", "image")
    assert "cn-b" in err.message
    assert err.hint == "import or migrate the image to zone cn-a"


def test_editing_the_launch_command_does_not_bypass_the_image_check() -> None:
    spec = make_spec(image="llm:1", command="docker pull llm:1 && python train.py")
    refusal(ImageError, lambda: check(spec), "image.wrong_zone", "image")


# -- environment variables ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        ("A=x", [("A", "x")]),
        ("A=x;B=y;RUN_ID=exp-001", [("A", "x"), ("B", "y"), ("RUN_ID", "exp-001")]),
        ("A=x; B=y;", [("A", "x"), ("B", "y")]),
        ("ARGS=--lr=0.1 --bs=8", [("ARGS", "--lr=0.1 --bs=8")]),
        ("EMPTY=", [("EMPTY", "")]),
        ("_private=1;lower_case2=ok", [("_private", "1"), ("lower_case2", "ok")]),
        ("DATA_DIR=/mnt/public/data", [("DATA_DIR", "/mnt/public/data")]),
    ],
)
def test_parse_env_accepts(text: str, expected: list[tuple[str, str]]) -> None:
    assert [(v.name, v.value) for v in parse_env(text)] == expected


@pytest.mark.parametrize(
    ("text", "code", "part"),
    [
        ("A=x;oops;B=y", "env.malformed_pair", "`oops`"),
        ("A=x;=y", "env.malformed_pair", "`=y`"),
        ("1ABC=x", "env.invalid_name", "`1ABC`"),
        ("A-B=x", "env.invalid_name", "`A-B`"),
        ("MY VAR=x", "env.invalid_name", "`MY VAR`"),
        ("A=x;B=y;A=z", "env.duplicate", "`A`"),
        ("A=x\x00y", "env.invalid_value", "`A`"),
    ],
)
def test_parse_env_rejects_naming_the_offending_part(text: str, code: str, part: str) -> None:
    err = refusal(EnvError, lambda: parse_env(text), code, "env")
    assert part in err.message


def test_parse_env_marks_creator_only_variables() -> None:
    env = parse_env("API_KEY=s3cret;RUN_ID=exp-001", creator_only={"API_KEY"})
    assert [(v.name, v.creator_only) for v in env] == [("API_KEY", True), ("RUN_ID", False)]


def test_parse_env_refuses_an_unset_creator_only_name() -> None:
    err = refusal(
        EnvError,
        lambda: parse_env("A=x", creator_only={"TOKEN"}),
        "env.creator_only_unknown",
        "env",
    )
    assert "TOKEN" in err.message


@pytest.mark.parametrize(
    ("env", "code", "field"),
    [
        ((EnvVar(name="A-B", value="x"),), "env.invalid_name", "env[0].name"),
        ((EnvVar(name="A", value="x"), EnvVar(name="A", value="y")), "env.duplicate", "env"),
        ((EnvVar(name="A", value="x"), EnvVar(name="B")), "env.missing_value", "env[1].value"),
    ],
)
def test_structured_env_is_checked(env: tuple[EnvVar, ...], code: str, field: str) -> None:
    refusal(EnvError, lambda: check(make_spec(env=env)), code, field)


@pytest.mark.parametrize(
    ("framework", "name", "hint"),
    [
        ("pytorch_ddp", "RANK", "distributed training"),
        ("single", "RANK", "distributed training"),
        ("mpi", "OMPI_COMM_WORLD_RANK", "MPI launcher"),
        ("ray", "RAY_ADDRESS", "Ray"),
        ("single", "CUDA_VISIBLE_DEVICES", "visible GPUs"),
        ("single", "RUNYARD_TASK_ID", "RUNYARD_"),
        ("single", "PATH", "export PATH=/my/bin:$PATH"),
        ("single", "BASH_ENV", "shell"),
        ("single", "LD_PRELOAD", "launch command"),
        ("single", "BASH_FUNC_setup", "shell functions"),
    ],
)
def test_variables_the_platform_sets_are_reserved(framework: str, name: str, hint: str) -> None:
    env = (EnvVar(name="A", value="1"), EnvVar(name=name, value="0"))
    spec = make_spec(framework=framework, env=env)
    err = refusal(EnvError, lambda: check_env(spec), "env.reserved_name", "env[1].name")
    assert name in err.message and hint in err.hint


def test_master_port_and_ordinary_variables_may_be_set() -> None:
    env = (
        EnvVar(name="MASTER_PORT", value="29600"),
        EnvVar(name="LD_LIBRARY_PATH", value="/opt/lib"),
        EnvVar(name="NCCL_DEBUG", value="INFO"),
        EnvVar(name="OMPI_MCA_btl", value="^openib"),
    )
    assert check(make_spec(framework="pytorch_ddp", env=env)) == []


def test_the_whole_environment_is_bounded() -> None:
    env = tuple(EnvVar(name=f"V{i}", value="x" * 10_000) for i in range(7))
    refusal(EnvError, lambda: check_env(make_spec(env=env)), "env.too_large", "env")


def test_a_lone_surrogate_in_a_value_is_refused() -> None:
    err = refusal(EnvError, lambda: parse_env("A=x\ud800y"), "env.invalid_value", "env")
    assert "surrogate" in err.message


def test_a_creator_only_variable_may_be_held_by_secret_reference() -> None:
    env = (EnvVar(name="API_KEY", creator_only=True, secret_ref="secret/1"),)
    assert check(make_spec(env=env)) == []


# -- creator-only masking ----------------------------------------------------------------------

SECRET_ENV = (
    EnvVar(name="API_KEY", value="s3cret", creator_only=True, secret_ref="secret/1"),
    EnvVar(name="RUN_ID", value="exp-001"),
)


def test_others_see_creator_only_values_masked() -> None:
    masked = mask_spec(make_spec(env=SECRET_ENV), viewer_is_creator=False)
    assert [(v.name, v.value, v.secret_ref) for v in masked.env] == [
        ("API_KEY", MASK, None),
        ("RUN_ID", "exp-001", None),
    ]
    assert "s3cret" not in masked.model_dump_json()


def test_the_creator_sees_the_values() -> None:
    spec = make_spec(env=SECRET_ENV)
    assert mask_spec(spec, viewer_is_creator=True) == spec


def test_a_spec_without_creator_only_variables_is_unchanged() -> None:
    spec = make_spec(env=(EnvVar(name="A", value="x"),))
    assert mask_spec(spec, viewer_is_creator=False) is spec


# -- storage -----------------------------------------------------------------------------


def mounts(*items: tuple[str, str, str]) -> tuple[VolumeMount, ...]:
    return tuple(VolumeMount(file_system=f, volume=v, mount_path=p) for f, v, p in items)


@pytest.mark.parametrize(
    ("mount_list", "code", "field", "hint"),
    [
        (mounts(("fs1", "nope", "/mnt/x")), "volume.not_found", "mounts[0]", "create the volume"),
        (mounts(("fs2", "proj-b", "/mnt/x")), "volume.wrong_zone", "mounts[0]", "zone cn-a"),
        (
            mounts(("fs1", "proj-a", "mnt/x")),
            "mount.invalid_path",
            "mounts[0].mount_path",
            "absolute",
        ),
        (
            mounts(("fs1", "proj-a", "/mnt/../etc")),
            "mount.invalid_path",
            "mounts[0].mount_path",
            "absolute",
        ),
        (mounts(("fs1", "proj-a", "/")), "mount.reserved_path", "mounts[0].mount_path", "/mnt"),
        (mounts(("fs1", "proj-a", "/usr")), "mount.reserved_path", "mounts[0].mount_path", "/mnt"),
        (
            mounts(("fs1", "proj-a", "/etc/mpi")),
            "mount.reserved_path",
            "mounts[0].mount_path",
            "/mnt",
        ),
        (
            mounts(("fs1", "proj-a", "/infini-data/x")),
            "mount.reserved_path",
            "mounts[0].mount_path",
            "/mnt",
        ),
        (
            mounts(("fs1", "proj-a", "/mnt/a"), ("fs1", "proj-c", "/mnt/a/b")),
            "mount.path_overlap",
            "mounts[1].mount_path",
            "own mount path",
        ),
        (
            mounts(("fs1", "proj-a", "/mnt/a/"), ("fs1", "proj-c", "/mnt/a")),
            "mount.path_overlap",
            "mounts[1].mount_path",
            "own mount path",
        ),
    ],
)
def test_storage_mounts_are_checked(
    mount_list: tuple[VolumeMount, ...], code: str, field: str, hint: str
) -> None:
    err = refusal(StorageError, lambda: check(make_spec(mounts=mount_list)), code, field)
    assert hint in err.hint


def test_sibling_mount_paths_do_not_overlap() -> None:
    spec = make_spec(
        mounts=mounts(("fs1", "proj-a", "/mnt/a"), ("fs1", "proj-c", "/mnt/ab")),
        command="cd /mnt/a/llm && python train.py",
    )
    assert check(spec) == []


def test_public_data_only_where_the_zone_has_it() -> None:
    ok = make_spec(public_data=True)
    spot = make_spec(
        public_data=True, pool="spot-b", resource_type="spot", image="llm:1", mounts=()
    )
    assert check(ok) == []
    err = refusal(StorageError, lambda: check(spot), "public_data.unavailable", "public_data")
    assert "cn-a" in err.hint


@pytest.mark.parametrize("path", ["/tmp/out", "/root/ckpt", "/workspace/runs", "outputs", "~/x"])
def test_output_paths_off_shared_storage_warn(path: str) -> None:
    warnings = check(make_spec(output_dirs=("/mnt/public/ok", path)))
    assert codes(warnings) == [("storage.local_output", "output_dirs[1]")]
    assert path in warnings[0].message and "/mnt/public" in warnings[0].message


def test_tensorboard_dir_off_shared_storage_warns() -> None:
    warnings = check(make_spec(tensorboard_dir="/tmp/tb"))
    assert codes(warnings) == [("storage.local_output", "tensorboard_dir")]


def test_output_paths_on_shared_storage_do_not_warn() -> None:
    spec = make_spec(
        tensorboard_dir="/mnt/public/runs/${RUN_ID}", output_dirs=("/mnt/public/ckpt/",)
    )
    assert check(spec) == []


def test_output_options_in_the_launch_command_are_checked() -> None:
    spec = make_spec(command="python train.py --output_dir /tmp/out --save=/mnt/public/ckpt")
    warnings = check(spec)
    assert codes(warnings) == [("storage.local_output", "command")]
    assert "/tmp/out" in warnings[0].message


def test_variables_in_output_paths_are_expanded_from_the_env() -> None:
    env = (EnvVar(name="OUT", value="/workspace/out"),)
    spec = make_spec(env=env, output_dirs=("${OUT}/ckpt", "$UNKNOWN/ckpt"))
    assert codes(check(spec)) == [("storage.local_output", "output_dirs[0]")]


def test_creator_only_values_never_appear_in_warnings() -> None:
    env = (EnvVar(name="OUT", value="/tmp/s3cret", creator_only=True),)
    spec = make_spec(env=env, output_dirs=("${OUT}/ckpt", "/tmp/x"))
    warnings = check(spec)
    assert codes(warnings) == [("storage.local_output", "output_dirs[1]")]
    assert all("s3cret" not in w.message for w in warnings)


@pytest.mark.parametrize("path", ["/mnt/ro/out", "/infini-data/models/out"])
def test_outputs_on_read_only_storage_warn(path: str) -> None:
    ro = VolumeMount(file_system="fs1", volume="proj-c", mount_path="/mnt/ro", read_only=True)
    spec = make_spec(mounts=(SHARED, ro), public_data=True, output_dirs=(path,))
    assert codes(check(spec)) == [("storage.read_only_output", "output_dirs[0]")]


# -- launch command --------------------------------------------------------------------

PIPE = "command.pipe_without_pipefail"
MASKS = "command.masks_failure"
CONDA = "command.conda_not_initialised"


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("python train.py", []),
        ("cd /mnt/public/llm-train\nbash scripts/train_ddp.sh", []),
        ("python train.py | tee train.log", [PIPE]),
        ("python train.py 2>&1 |& tee train.log", [PIPE]),
        ("torchrun train.py | grep -v debug", [PIPE]),
        ("set -o pipefail\npython train.py | tee train.log", []),
        ("set -euo pipefail\ntorchrun train.py 2>&1 | tee /mnt/public/log", []),
        ("nvidia-smi | tee gpu.txt\npython train.py", [PIPE]),
        ("python train.py; echo done", [MASKS]),
        ("python train.py\nsleep 3600", [MASKS]),
        ("bash train.sh && aws s3 cp out s3://bucket/ ; echo ok", [MASKS]),
        ("python train.py || echo failed", [MASKS]),
        ("if python train.py; then echo ok; else echo failed; fi", [MASKS]),
        ("python train.py & wait", [MASKS]),
        ("python train.py && echo done", []),
        ("python train.py || exit 1", []),
        ("python train.py || { echo failed; exit 1; }", []),
        ("set -e\npython train.py\necho done", []),
        ("python train.py; rc=$?; ossutil cp -r out oss://b/; exit $rc", []),
        ("python train.py; sleep 600; exit ${PIPESTATUS[0]}", []),
        ("python train.py; exit $?", []),
        ("python train.py; echo done; exit $?", [MASKS]),
        ("python train.py; echo done; exit 0", [MASKS]),
        ("echo 'start; sleep 9' # a comment; sleep\npython train.py", []),
        ("python -m pip install -r req.txt; python train.py", []),
        ("python train.py | tee log; echo done", [PIPE, MASKS]),
        ("conda activate llm\npython train.py", [CONDA]),
        ('eval "$(conda shell.bash hook)"\nconda activate llm\npython train.py', []),
        ("source /opt/conda/etc/profile.d/conda.sh && conda activate llm && python t.py", []),
        ("source ~/.bashrc; conda activate llm; python train.py", []),
        ("conda activate llm; python train.py | tee log; sleep 60", [PIPE, MASKS, CONDA]),
    ],
)
def test_launch_command_warnings(command: str, expected: list[str]) -> None:
    warnings = command_warnings(command)
    assert [str(w.code) for w in warnings] == expected
    assert all(w.field == "command" for w in warnings)


def test_launch_command_warnings_say_how_to_fix() -> None:
    [pipe] = command_warnings("python train.py | tee log")
    [masks] = command_warnings("python train.py; sleep 600")
    [conda] = command_warnings("conda activate x; python train.py")
    assert "set -o pipefail" in pipe.message
    assert "`sleep 600`" in masks.message and "exit $rc" in masks.message
    assert "login shell" in conda.message and "conda shell.bash hook" in conda.message


def test_command_warnings_come_back_from_check_spec() -> None:
    spec = make_spec(command="python train.py | tee /mnt/public/log")
    assert codes(check(spec)) == [(PIPE, "command")]


# -- other fields ------------------------------------------------------------------------------


def test_blank_name_is_refused() -> None:
    refusal(SpecError, lambda: check(make_spec(name="  ")), "name.blank", "name")


def test_resume_pattern_must_be_a_regular_expression() -> None:
    spec = make_spec(fault_tolerance={"auto_restart": True, "resume_pattern": "load (ckpt"})
    refusal(
        SpecError,
        lambda: check(spec),
        "fault_tolerance.invalid_pattern",
        "fault_tolerance.resume_pattern",
    )


@pytest.mark.parametrize("pattern", ["load (\\w+) \\1", "(?=step)\\d+", "(?<!x)ckpt"])
def test_resume_pattern_must_compile_with_re2(pattern: str) -> None:
    spec = make_spec(fault_tolerance={"auto_restart": True, "resume_pattern": pattern})
    err = refusal(
        SpecError,
        lambda: check(spec),
        "fault_tolerance.invalid_pattern",
        "fault_tolerance.resume_pattern",
    )
    assert "RE2" in err.message and "backreferences" in err.hint


def test_a_pattern_that_backtracks_in_other_engines_is_accepted_for_re2() -> None:
    spec = make_spec(fault_tolerance={"auto_restart": True, "resume_pattern": "(a+)+$"})
    assert check(spec) == []


def test_a_long_command_is_checked_in_linear_time_with_few_warnings() -> None:
    """Thousands of pipes make three warnings, each quoting at most 200 characters."""
    command = "python train.py | tee log\n" * 2500
    warnings = command_warnings(command)
    assert [w.code for w in warnings] == ["command.pipe_without_pipefail"] * 3
    assert all(len(w.message) < 800 for w in warnings)


def test_alert_webhook_must_be_a_url() -> None:
    spec = make_spec(alerts=({"webhook_url": "open.feishu.cn/hook"},))
    refusal(SpecError, lambda: check(spec), "alert.invalid_webhook", "alerts[0].webhook_url")


@pytest.mark.parametrize("url", ["https://[::1", "https://[open.feishu.cn]/x", "http://]"])
def test_a_webhook_url_python_cannot_parse_is_refused_not_a_server_error(url: str) -> None:
    spec = make_spec(alerts=({"webhook_url": "https://open.feishu.cn/x"}, {"webhook_url": url}))
    field = "alerts[1].webhook_url"
    error = refusal(SpecError, lambda: check(spec), "alert.invalid_webhook", field)
    assert "is not a webhook URL" in str(error.message), error.message


# -- rerun with changes, clone -----------------------------------------------------------


def test_rerun_may_change_command_worker_spec_count_and_image() -> None:
    original = make_spec(framework="pytorch_ddp", worker_count=2)
    changes = {
        "command": "python train.py --lr 1e-4",
        "worker_spec": "4gpu",
        "worker_count": 4,
        "image": "llm:1",
    }
    rerun = rerun_with_changes(original, changes)
    assert (rerun.command, rerun.worker_spec, rerun.worker_count, rerun.image) == (
        "python train.py --lr 1e-4",
        "4gpu",
        4,
        "llm:1",
    )
    assert rerun.model_copy(update={k: getattr(original, k) for k in changes}) == original
    # The changed image is checked again: llm:1 is not in pool-a's zone.
    refusal(ImageError, lambda: check(rerun), "image.wrong_zone", "image")


@pytest.mark.parametrize(
    ("field", "value", "label"),
    [
        ("pool", "pool-eth", "pool"),
        ("resource_type", "spot", "resource type"),
        ("name", "other", "name"),
        ("description", "new words", "description"),
        ("env", "A=x", "environment variables"),
        ("rdma", True, "rdma"),
    ],
)
def test_rerun_cannot_change_other_fields(field: str, value: Any, label: str) -> None:
    err = refusal(
        ChangeError,
        lambda: rerun_with_changes(make_spec(), {field: value}),
        "rerun.field_not_changeable",
        field,
    )
    assert err.hint == f"use clone to change the {label}"


def test_rerun_accepts_unchanged_fields_and_masked_env_sent_back() -> None:
    original = make_spec(env=SECRET_ENV)
    shown = mask_spec(original, viewer_is_creator=False).model_dump()
    rerun = rerun_with_changes(original, {**shown, "command": "python train.py --resume"})
    assert rerun.env == original.env
    assert rerun.command == "python train.py --resume"


def test_rerun_refuses_unknown_fields_and_invalid_values() -> None:
    refusal(
        ChangeError,
        lambda: rerun_with_changes(make_spec(), {"gpus": 8}),
        "spec.unknown_field",
        "gpus",
    )
    refusal(
        SpecError,
        lambda: rerun_with_changes(make_spec(), {"worker_count": 0}),
        "spec.invalid",
        "worker_count",
    )


def test_rerun_switches_between_spec_and_custom_count() -> None:
    custom = rerun_with_changes(make_spec(worker_count=1), {"custom_gpus": 16})
    assert (custom.worker_spec, custom.custom_gpus, custom.worker_count) == (None, 16, 1)
    back = rerun_with_changes(custom, {"worker_spec": "8gpu", "worker_count": 2})
    assert (back.worker_spec, back.custom_gpus, back.worker_count) == ("8gpu", None, 2)


def test_clone_may_change_everything_the_pool_included() -> None:
    clone = clone_spec(
        make_spec(),
        {
            "pool": "spot-b",
            "resource_type": "spot",
            "image": "llm:1",
            "mounts": (),
            "name": "llm-sft-spot",
            "env": "RUN_ID=exp-002",
        },
    )
    assert (clone.pool, clone.name, clone.env) == (
        "spot-b",
        "llm-sft-spot",
        (EnvVar(name="RUN_ID", value="exp-002"),),
    )
    # accepted; the command still enters the volume the clone no longer mounts
    assert codes(check(clone)) == [("command.path_not_on_worker", "command")]


def test_clone_refuses_unknown_fields() -> None:
    refusal(
        ChangeError, lambda: clone_spec(make_spec(), {"zone": "cn-b"}), "spec.unknown_field", "zone"
    )


def test_clone_by_another_user_does_not_copy_creator_only_values() -> None:
    clone = clone_spec(make_spec(env=SECRET_ENV), {})
    assert [(v.name, v.value, v.secret_ref) for v in clone.env] == [
        ("API_KEY", None, None),
        ("RUN_ID", "exp-001", None),
    ]
    err = refusal(EnvError, lambda: check(clone), "env.missing_value", "env[0].value")
    assert "API_KEY" in err.hint


def test_clone_by_the_creator_keeps_creator_only_values() -> None:
    original = make_spec(env=SECRET_ENV)
    assert clone_spec(original, {}, by_creator=True).env == original.env


def test_masked_values_sent_back_to_clone_stand_for_the_hidden_value() -> None:
    original = make_spec(env=SECRET_ENV)
    shown = mask_spec(original, viewer_is_creator=False).model_dump()["env"]
    assert clone_spec(original, {"env": shown}, by_creator=True).env == original.env
    by_other = clone_spec(original, {"env": shown})
    assert by_other.env[0].value is None and by_other.env[0].creator_only


# -- task groups -------------------------------------------------------------------------


def test_a_group_expands_to_one_spec_per_item() -> None:
    template = make_spec(env=SECRET_ENV, framework="pytorch_ddp")
    items = [
        {"command": f"python train.py --lr {lr}", "name": f"sweep-{lr}"} for lr in ("1e-4", "3e-4")
    ]
    specs = expand_group(template, [*items, {}])
    assert [s.name for s in specs] == ["sweep-1e-4", "sweep-3e-4", "llm-sft"]
    assert specs[1].command == "python train.py --lr 3e-4"
    assert all(s.env == template.env for s in specs)


def test_a_group_needs_items() -> None:
    refusal(GroupItemError, lambda: expand_group(make_spec(), []), "group.empty", "items")
    too_many: list[dict[str, Any]] = [{}] * (MAX_GROUP_SIZE + 1)
    refusal(GroupItemError, lambda: expand_group(make_spec(), too_many), "group.too_large", "items")


def test_group_rules_run_once_per_distinct_spec_and_blank_names_are_still_refused() -> None:
    """1000 items sharing a long command cost one check of it, not 1000."""
    urls: list[str] = []

    def webhooks(url: str) -> None:
        urls.append(url)

    template = make_spec(
        alerts=({"webhook_url": "https://open.feishu.cn/open-apis/bot/v2/hook/x"},)
    )
    specs = expand_group(template, [{"name": f"n{i}"} for i in range(MAX_GROUP_SIZE)])
    warnings = check_group(specs, CATALOGUE, POOLS, webhooks=webhooks)
    assert len(warnings) == MAX_GROUP_SIZE and len(urls) == 1
    blank = expand_group(template, [{"name": "a"}, {"name": " "}])
    err = refusal(
        GroupItemError, lambda: check_group(blank, CATALOGUE, POOLS), "name.blank", "items[1].name"
    )
    assert isinstance(err, GroupItemError) and err.item == 1


def test_a_group_of_long_commands_is_bounded_in_total() -> None:
    template = make_spec(command="python train.py # " + "x" * 60_000)
    specs = expand_group(template, [{"name": f"n{i}"} for i in range(300)])
    refusal(
        GroupItemError, lambda: check_group(specs, CATALOGUE, POOLS), "group.too_large", "items"
    )


def test_a_refused_group_item_is_named_by_its_index() -> None:
    items = [{}, {"worker_count": 2}, {"worker_count": 0}]
    err = refusal(
        GroupItemError,
        lambda: expand_group(make_spec(), items),
        "spec.invalid",
        "items[2].worker_count",
    )
    assert isinstance(err, GroupItemError) and err.item == 2
    assert err.message.startswith("item 2:")
    assert err.to_dict()["item"] == 2


def test_checking_a_group_names_the_failing_item() -> None:
    specs = expand_group(make_spec(), [{}, {"image": "ghost:0"}])
    err = refusal(
        GroupItemError,
        lambda: check_group(specs, CATALOGUE, POOLS),
        "image.not_found",
        "items[1].image",
    )
    assert "import the image" in err.hint


def test_checking_a_group_returns_each_items_warnings() -> None:
    specs = expand_group(make_spec(), [{}, {"output_dirs": ("/tmp/x",)}])
    assert [codes(w) for w in check_group(specs, CATALOGUE, POOLS)] == [
        [],
        [("storage.local_output", "output_dirs[0]")],
    ]


# -- catalogue and errors ----------------------------------------------------------------------


def test_catalogue_lookups_and_admin_changes() -> None:
    assert CATALOGUE.image("llm:1") == Image(name="llm:1", zones=("cn-b",), services=("training",))
    assert CATALOGUE.public_data_in("cn-a") == PublicData(zone="cn-a", path="/infini-data/")
    assert CATALOGUE.public_data_in("cn-b") is None
    moved = CATALOGUE.with_image(
        Image(name="llm:1", zones=("cn-a", "cn-b"), services=("training",))
    )
    assert check_spec(make_spec(image="llm:1"), moved, POOLS["pool-a"]) == []
    vol = Volume(file_system="fs2", volume="proj-b", zone="cn-a")
    assert len(CATALOGUE.with_volume(vol).volumes_named("fs2", "proj-b")) == 2
    assert CATALOGUE.with_volume(vol).with_volume(vol).volumes == CATALOGUE.with_volume(vol).volumes
    assert CATALOGUE.with_public_data(PublicData(zone="cn-b")).public_data_zones() == (
        "cn-a",
        "cn-b",
    )


def test_catalogue_refuses_duplicate_image_names() -> None:
    with pytest.raises(ValueError, match="unique"):
        Catalogue.from_dict({"images": [{"name": "a"}, {"name": "a"}]})


def test_errors_answer_as_dicts() -> None:
    with pytest.raises(SubmissionError) as info:
        check(make_spec(image="llm:1"))
    assert info.value.to_dict() == {
        "code": "image.wrong_zone",
        "field": "image",
        "message": "image llm:1 is in zone(s) cn-b, not in zone cn-a of pool pool-a",
        "hint": "import or migrate the image to zone cn-a",
    }
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("alerts", "said"),
    [
        (("task_failed",), "did you mean failed?"),
        (("failed", "hang:60"), "'hang:60'"),
        (("queued:-5",), "'queued:-5'"),
    ],
)
def test_an_alert_kind_runyard_never_sends_is_refused(alerts: tuple[str, ...], said: str) -> None:
    """A task's alert of a kind the notification service does not send would never come."""
    ok = {"webhook_url": "https://open.feishu.cn/x", "alerts": ["failed", "queued:1800"]}
    spec = make_spec(alerts=(ok, {"webhook_url": "https://open.feishu.cn/x", "alerts": alerts}))
    error = refusal(SpecError, lambda: check(spec), "alert.unknown_kind", "alerts[1].alerts")
    assert said in error.message and "queued:<seconds>" in error.hint
