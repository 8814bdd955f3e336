"""`command.path_not_on_worker`: files the launch command reads from where workers cannot see."""

from __future__ import annotations

from typing import Any

import pytest
from runyard.contracts.spec import TaskSpec, VolumeMount
from runyard.submission.launch_paths import launch_path_warnings

from tests.unit.test_submission_rules import check, codes, make_spec

CODE = VolumeMount(file_system="fs1", volume="proj-a", mount_path="/mnt/code")


def spec(command: str, **changes: Any) -> TaskSpec:
    fields = {"name": "t", "pool": "pool-a", "worker_spec": "1gpu", "image": "pytorch:2.3"}
    return TaskSpec(**{**fields, "command": command, "mounts": (CODE,), **changes})


def flagged(command: str, **changes: Any) -> list[str]:
    """The paths the warnings name, in order."""
    return [w.message.split("`")[1] for w in launch_path_warnings(spec(command, **changes))]


@pytest.mark.parametrize(
    ("command", "paths"),
    [
        ("python /tmp/train.py", ["/tmp/train.py"]),
        ("bash /home/me/run.sh", ["/home/me/run.sh"]),
        ("/root/run.sh --lr 1", ["/root/run.sh"]),
        ("set -e; source /home/me/env.sh; python train.py", ["/home/me/env.sh"]),
        ("cd /home/me/proj && python train.py", ["/home/me/proj"]),
        ("python3.11 -u /var/tmp/t.py", ["/var/tmp/t.py"]),
        (
            "torchrun --nproc_per_node 8 /tmp/train.py --deepspeed=/home/me/ds.json",
            ["/tmp/train.py", "/home/me/ds.json"],
        ),
        ("python -m torch.distributed.run /tmp/t.py", ["/tmp/t.py"]),
        ("python train.py --config /Users/me/c.yaml", ["/Users/me/c.yaml"]),
        ("python /mnt/other/x.py", ["/mnt/other/x.py"]),
        ("cat /tmp/in.json > /tmp/out.json", ["/tmp/in.json"]),
        ("cp /home/a/x.py /tmp/b.py && python /tmp/b.py", ["/home/a/x.py"]),
        ("python /tmp/t.py; python /tmp/t.py", ["/tmp/t.py"]),
    ],
)
def test_paths_of_the_submitting_machine_are_flagged(command: str, paths: list[str]) -> None:
    assert flagged(command) == paths


@pytest.mark.parametrize(
    "command",
    [
        "python train.py",
        "python /mnt/code/train.py",
        "cd /mnt/code/llm && bash run.sh",
        "python /infini-data/scripts/eval.py",
        "python /usr/lib/python3/x.py /etc/app.json < /dev/null",
        "/opt/conda/bin/python train.py",
        "/bin/bash -c 'python /tmp/inline.py'",
        "cd /tmp && python train.py",
        "python train.py > /tmp/log.txt 2>&1",
        "python train.py --output_dir /tmp/out.json --log_dir=/tmp/l.yaml",
        "echo /tmp/x.py",
        "mkdir -p /tmp/w && cd /tmp/w && python /tmp/w/t.py",
        "git clone https://git.example/r /tmp/code && python /tmp/code/train.py",
        "wget -O /tmp/t.py https://x.example/t.py && python /tmp/t.py",
        "echo 'print(1)' >/tmp/a.py && python /tmp/a.py",
        "ls /proc/self/fd && cat /sys/class/net/eth0/mtu",
    ],
)
def test_image_volume_system_and_made_paths_are_not_flagged(command: str) -> None:
    assert flagged(command) == []


def test_a_read_only_mount_counts_as_visible() -> None:
    mount = VolumeMount(file_system="fs1", volume="d", mount_path="/home/shared", read_only=True)
    assert launch_path_warnings(spec("python /home/shared/t.py", mounts=(mount,))) == []


def test_the_warning_says_why_and_where_to_put_the_code() -> None:
    (warning,) = launch_path_warnings(spec("python /tmp/train.py"))
    assert (warning.code, warning.field) == ("command.path_not_on_worker", "command")
    assert "/tmp" in warning.message and "image" in warning.message
    assert "/mnt/code" in warning.message  # the task's own mount as the example


def test_the_submission_rules_return_it_after_the_other_command_warnings() -> None:
    checked = check(make_spec(command="python /tmp/train.py | tee /mnt/public/log"))
    assert codes(checked) == [
        ("command.pipe_without_pipefail", "command"),
        ("command.path_not_on_worker", "command"),
    ]
