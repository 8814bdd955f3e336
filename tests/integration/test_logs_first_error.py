"""First error (R-42) on a table of realistic failure logs, through the real
store: the earliest error line across workers, its context, its layer and rule."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from runyard.logs import LogRecord, LogStore, classify, is_error

pytestmark = pytest.mark.integration

T0 = (datetime.now(UTC) - timedelta(hours=1)).replace(microsecond=0)

BOOT = [
    (0, "+ cd /workspace"),
    (0, "NCCL INFO Bootstrap : Using eth0:10.0.0.12<0>"),
    (0, "Using CUDA device 0 (NVIDIA H100 80GB HBM3); cuda available: True"),
    (1, "NCCL INFO NET/Plugin: No plugin found (libnccl-net.so), using internal implementation"),
    (0, "epoch 0 step 10 loss=4.12 errors=0"),
]

# name: (lines as (worker, text) after BOOT, index of the first error in those lines,
#        expected layer, expected rule)
CASES: dict[str, tuple[list[tuple[int, str]], int, str, str]] = {
    "python traceback in the collator": (
        [
            (1, "epoch 0 step 20 loss=3.98"),
            (1, "Traceback (most recent call last):"),
            (1, '  File "/workspace/train.py", line 88, in <module>'),
            (1, "    for batch in loader:"),
            (1, '  File "/workspace/data.py", line 41, in collate_fn'),
            (1, "    return torch.stack([x['input_ids'] for x in items])"),
            (1, "KeyError: 'input_ids'"),
            (0, "Traceback (most recent call last):"),
        ],
        1,
        "training_code",
        "training.data",
    ),
    "CUDA OOM": (
        [
            (0, "[rank0]: Traceback (most recent call last):"),
            (0, '[rank0]:   File "/workspace/train.py", line 120, in <module>'),
            (0, "[rank0]:     loss.backward()"),
            (
                0,
                "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
                " GPU 0 has a total capacity of 79.10 GiB of which 1.20 GiB is free.",
            ),
            (1, "[rank1]: Traceback (most recent call last):"),
        ],
        0,
        "training_code",
        "training.cuda_oom",
    ),
    "NCCL timeout": (
        [
            (1, "epoch 3 step 4000 loss=1.02"),
            (
                1,
                "[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective"
                " operation timeout: WorkNCCL(SeqNum=24123, OpType=ALLREDUCE, NumelIn=1,"
                " NumelOut=1, Timeout(ms)=600000) ran for 600049 milliseconds before timing out.",
            ),
            (0, "[rank0]:[E ProcessGroupNCCL.cpp:1182] [Rank 0] NCCL watchdog thread terminated"),
            (1, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"),
        ],
        1,
        "platform",
        "platform.nccl",
    ),
    "ModuleNotFoundError": (
        [
            (0, "Traceback (most recent call last):"),
            (0, '  File "/workspace/train.py", line 3, in <module>'),
            (0, "    import flash_attn"),
            (0, "ModuleNotFoundError: No module named 'flash_attn'"),
        ],
        0,
        "image",
        "image.missing_package",
    ),
    "no such file for the script": (
        [
            (
                1,
                "/usr/bin/python3: can't open file '/workspace/trian.py':"
                " [Errno 2] No such file or directory",
            ),
            (0, "/usr/bin/python3: can't open file '/workspace/trian.py': [Errno 2] No such file"),
        ],
        0,
        "launch_command",
        "launch.script_missing",
    ),
    "permission denied on the output dir": (
        [
            (0, "epoch 0 done, saving"),
            (0, "Traceback (most recent call last):"),
            (0, '  File "/workspace/train.py", line 201, in save_checkpoint'),
            (0, "    torch.save(model.state_dict(), f'{args.output}/ckpt-{step}.pt')"),
            (0, "PermissionError: [Errno 13] Permission denied: '/output/run1/ckpt-500.pt'"),
        ],
        1,
        "launch_command",
        "launch.permission",
    ),
    "conda activate failure": (
        [
            (0, "+ conda activate llm-train"),
            (
                0,
                "EnvironmentNameNotFound: Could not find conda environment: llm-train",
            ),
            (0, "You can list all discoverable environments with `conda info --envs`."),
        ],
        1,
        "image",
        "image.conda",
    ),
    "missing CUDA library": (
        [
            (
                0,
                "ImportError: libcudnn.so.9: cannot open shared object file:"
                " No such file or directory",
            ),
        ],
        0,
        "image",
        "image.cuda_library",
    ),
    "host out of memory": (
        [
            (1, "epoch 0 step 5 loss=5.0"),
            (1, "Killed"),
        ],
        1,
        "platform",
        "platform.resources",
    ),
    "working directory": (
        [(0, "bash: line 1: cd: /workspace/proj: No such file or directory")],
        0,
        "launch_command",
        "launch.working_directory",
    ),
}


@pytest.fixture
async def store(dsn: str) -> AsyncIterator[LogStore]:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    store = LogStore(pool)
    await store.migrate()
    yield store
    await pool.close()


def test_boot_lines_are_not_errors() -> None:
    assert not [text for _, text in BOOT if is_error(text)]


@pytest.mark.parametrize("name", list(CASES))
async def test_first_error_is_found_and_classified(store: LogStore, name: str) -> None:
    lines, first, layer, rule = CASES[name]
    task_id = f"task-{abs(hash(name)) % 10**8}"
    everything = BOOT + lines
    await store.ingest(
        [
            LogRecord(T0 + timedelta(milliseconds=100 * i), task_id, 1, 1, w, "stderr", text)
            for i, (w, text) in enumerate(everything)
        ]
    )
    found = await store.first_error(task_id)
    assert found is not None
    worker, text = lines[first]
    assert (found.line.worker, found.line.line) == (worker, text)
    assert (found.classification.layer, found.classification.rule) == (layer, rule), (
        found.classification
    )
    # context: lines of the same worker only, before and after
    assert all(ln.worker == worker for ln in found.before + found.after)
    expected_before = [t for w, t in everything[: len(BOOT) + first] if w == worker][-5:]
    assert [ln.line for ln in found.before] == expected_before


async def test_no_error_no_answer(store: LogStore) -> None:
    await store.ingest(
        [
            LogRecord(T0 + timedelta(seconds=i), "calm", 1, 1, w, "stdout", text)
            for i, (w, text) in enumerate(BOOT)
        ]
    )
    assert await store.first_error("calm") is None
    assert await store.first_error("never-ran") is None


async def test_latest_run_by_default_and_a_given_run(store: LogStore) -> None:
    await store.ingest(
        [
            LogRecord(T0, "r", 1, 1, 0, "stderr", "ModuleNotFoundError: No module named 'x'"),
            LogRecord(T0 + timedelta(minutes=5), "r", 2, 1, 0, "stderr", "Killed"),
        ]
    )
    latest = await store.first_error("r")
    assert latest is not None and latest.classification.rule == "platform.resources"
    earlier = await store.first_error("r", run=1)
    assert earlier is not None and earlier.classification.layer == "image"


def test_unknown_errors_say_so() -> None:
    assert classify(["something odd failed"]).layer == "unknown"
