"""First error (R-42) on a table of realistic failure logs, through the real
store: the failing worker's final traceback (or else the earliest error line
that is not a warning), its context, the exception it names, its layer and rule."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx
import pytest
from runyard.logs import LogStore, classify, is_error, is_warning

from tests.integration.test_gateway_routing import SERVICE_TOKEN, log_service
from tests.log_records import log_record

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
    "a worker past its spec's memory": (
        [
            (0, "epoch 0 step 5 loss=5.0"),
            (
                0,
                "runyard: out of memory: the kernel ended 1 process(es) of this worker at its"
                " limit of 120 GiB (its spec's memory); choose a spec with more memory, or"
                " have the worker use less",
            ),
        ],
        1,
        "training_code",
        "training.host_memory",
    ),
    "a Slurm step past its memory": (
        [
            (1, "epoch 0 step 5 loss=5.0"),
            (
                1,
                "slurmstepd: error: Detected 1 oom_kill event in StepId=41.1. Some of the"
                " step tasks have been OOM Killed.",
            ),
        ],
        1,
        "training_code",
        "training.host_memory",
    ),
    "working directory": (
        [(0, "bash: line 1: cd: /workspace/proj: No such file or directory")],
        0,
        "launch_command",
        "launch.working_directory",
    ),
}


#: torch's warning when NumPy is missing, printed at import, long before any failure.
NUMPY_WARNING = (
    "/usr/local/lib/python3.11/site-packages/torch/_subclasses/functional_tensor.py:276:"
    " UserWarning: Failed to initialize NumPy: No module named 'numpy' (Triggered internally"
    " at /pytorch/torch/csrc/utils/tensor_numpy.cpp:84.)"
)
NUMPY_SOURCE = '  cpu = _conversion_method_template(device=torch.device("cpu"))'
GLOO_PEER = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534]"
    " Connection closed by peer [10.0.0.13]:38211"
)

CASES |= {
    "a warning, then the crash": (
        [
            (0, NUMPY_WARNING),
            (0, NUMPY_SOURCE),
            (1, NUMPY_WARNING),
            (1, NUMPY_SOURCE),
            (0, "step 1 loss=2.30"),
            (0, "Traceback (most recent call last):"),
            (0, '  File "/workspace/train.py", line 9, in <module>'),
            (0, '    raise RuntimeError("injected crash")'),
            (0, "RuntimeError: injected crash"),
        ],
        5,
        "training_code",
        "training.exception",
    ),
    "a warning, then a KeyError in a DDP rank": (
        [
            (0, NUMPY_WARNING),
            (0, NUMPY_SOURCE),
            (0, "[rank0]: Traceback (most recent call last):"),
            (0, '[rank0]:   File "/workspace/train.py", line 21, in <module>'),
            (0, '[rank0]:     ids = batch["input_ids"]'),
            (0, "[rank0]:           ~~~~~^^^^^^^^^^^^^"),
            (0, "[rank0]: KeyError: 'input_ids'"),
        ],
        2,
        "training_code",
        "training.exception",
    ),
    "the crashing rank, not the peer that lost it (printed first)": (
        [
            (0, "[rank0]: Traceback (most recent call last):"),
            (0, '[rank0]:   File "/workspace/train.py", line 30, in <module>'),
            (0, "[rank0]:     dist.all_reduce(grad)"),
            (0, "[rank0]: " + GLOO_PEER),
            (1, "[rank1]: Traceback (most recent call last):"),
            (1, '[rank1]:   File "/workspace/train.py", line 21, in <module>'),
            (1, "[rank1]: KeyError: 'input_ids'"),
        ],
        4,
        "training_code",
        "training.exception",
    ),
    "torchrun's ChildFailedError below the real traceback": (
        [
            (0, "[rank1]: Traceback (most recent call last):"),
            (0, '[rank1]:   File "/workspace/train.py", line 57, in <module>'),
            (0, "[rank1]:     out = step(batch)"),
            (0, '[rank1]:   File "/workspace/train.py", line 40, in step'),
            (0, '[rank1]:     raise RuntimeError("injected crash")'),
            (0, "[rank1]: RuntimeError: injected crash"),
            (0, "[rank0]: Traceback (most recent call last):"),
            (0, '[rank0]:   File "/workspace/train.py", line 58, in <module>'),
            (0, "[rank0]: " + GLOO_PEER),
            (
                0,
                "W1201 03:04:05.123000 140 torch/distributed/elastic/multiprocessing/api.py:897]"
                " Sending process 141 closing signal SIGTERM",
            ),
            (
                0,
                "E1201 03:04:05.456000 140 torch/distributed/elastic/multiprocessing/api.py:869]"
                " failed (exitcode: 1) local_rank: 1 (pid: 142) of binary: /usr/bin/python3",
            ),
            (0, "Traceback (most recent call last):"),
            (0, '  File "/usr/local/bin/torchrun", line 8, in <module>'),
            (0, "    sys.exit(main())"),
            (0, "    raise ChildFailedError("),
            (0, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "),
            (0, "============================================================"),
            (0, "train.py FAILED"),
        ],
        0,
        "training_code",
        "training.exception",
    ),
    "accelerate's CalledProcessError below the real traceback": (
        [
            (0, "Traceback (most recent call last):"),
            (0, '  File "/workspace/train.py", line 12, in <module>'),
            (0, "    ds = load_from_disk('/mnt/data/wiki')"),
            (
                0,
                "FileNotFoundError: [Errno 2] No such file or directory:"
                " '/mnt/data/wiki/dataset_info.json'",
            ),
            (0, "Traceback (most recent call last):"),
            (0, '  File "/usr/local/bin/accelerate", line 8, in <module>'),
            (
                0,
                "subprocess.CalledProcessError: Command '['/usr/bin/python3', 'train.py']'"
                " returned non-zero exit status 1.",
            ),
        ],
        0,
        "training_code",
        "training.data",
    ),
    "a chained exception: the last one ended the worker": (
        [
            (0, "Traceback (most recent call last):"),
            (0, '  File "/workspace/data.py", line 30, in read'),
            (0, "    return self.rows[i]['input_ids']"),
            (0, "KeyError: 'input_ids'"),
            (0, ""),
            (0, "The above exception was the direct cause of the following exception:"),
            (0, ""),
            (0, "Traceback (most recent call last):"),
            (0, '  File "/workspace/train.py", line 88, in <module>'),
            (0, "    batch = next(it)"),
            (0, "RuntimeError: bad sample 17"),
        ],
        7,
        "training_code",
        "training.exception",
    ),
    "a handled traceback, then the fatal one": (
        [
            (0, "ERROR:root:sample 3 unreadable, skipped"),
            (0, "Traceback (most recent call last):"),
            (0, '  File "/workspace/io.py", line 12, in read'),
            (0, "OSError: image file is truncated"),
            (0, "epoch 0 step 30 loss=3.1"),
            (0, "Traceback (most recent call last):"),
            (0, '  File "/workspace/train.py", line 99, in <module>'),
            (0, "ValueError: Expected input batch_size (16) to match target batch_size (8)."),
        ],
        5,
        "training_code",
        "training.exception",
    ),
    "NCCL error in a rank's traceback": (
        [
            (1, "NCCL WARN NET/Socket : peer 10.0.0.13<53211> shut down while reading data"),
            (1, "[rank1]: Traceback (most recent call last):"),
            (1, '[rank1]:   File "/workspace/train.py", line 131, in <module>'),
            (1, "[rank1]:     dist.all_reduce(grad)"),
            (
                1,
                "[rank1]: torch.distributed.DistBackendError: NCCL error in:"
                " ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system"
                " error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5",
            ),
        ],
        1,
        "platform",
        "platform.nccl",
    ),
    "a warning, then CUDA OOM": (
        [
            (0, NUMPY_WARNING),
            (0, "[rank0]: Traceback (most recent call last):"),
            (0, "[rank0]:     logits = model(**batch)"),
            (0, "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB."),
        ],
        1,
        "training_code",
        "training.cuda_oom",
    ),
    "a warning, then permission denied on the script": (
        [
            (0, NUMPY_WARNING),
            (0, "bash: line 1: /workspace/run.sh: Permission denied"),
        ],
        1,
        "launch_command",
        "launch.permission",
    ),
    "a warning, then the host killed the worker": (
        [(0, NUMPY_WARNING), (0, NUMPY_SOURCE), (0, "step 3 loss=2.0"), (0, "Killed")],
        3,
        "platform",
        "platform.resources",
    ),
    "only the launcher's traceback: its exit line first": (
        [
            (
                0,
                "E1201 03:04:05.456000 140 torch/distributed/elastic/multiprocessing/api.py:869]"
                " failed (exitcode: -11) local_rank: 0 (pid: 77) of binary: /usr/bin/python3",
            ),
            (0, "Traceback (most recent call last):"),
            (0, '  File "/usr/local/bin/torchrun", line 8, in <module>'),
            (0, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "),
        ],
        0,
        "launch_command",
        "launch.exit_code",
    ),
    "only a warning: the warning it is": (
        [(0, NUMPY_WARNING), (0, NUMPY_SOURCE), (0, "epoch 0 step 10 loss=4.0")],
        0,
        "image",
        "image.missing_package",
    ),
}

#: The line naming the exception, for the cases whose first error is a traceback.
EXCEPTION_OF = {
    "python traceback in the collator": "KeyError: 'input_ids'",
    "CUDA OOM": CASES["CUDA OOM"][0][3][1],
    "ModuleNotFoundError": "ModuleNotFoundError: No module named 'flash_attn'",
    "permission denied on the output dir": (
        "PermissionError: [Errno 13] Permission denied: '/output/run1/ckpt-500.pt'"
    ),
    "a warning, then the crash": "RuntimeError: injected crash",
    "a warning, then a KeyError in a DDP rank": "[rank0]: KeyError: 'input_ids'",
    "the crashing rank, not the peer that lost it (printed first)": (
        "[rank1]: KeyError: 'input_ids'"
    ),
    "torchrun's ChildFailedError below the real traceback": "[rank1]: RuntimeError: injected crash",
    "accelerate's CalledProcessError below the real traceback": CASES[
        "accelerate's CalledProcessError below the real traceback"
    ][0][3][1],
    "a chained exception: the last one ended the worker": "RuntimeError: bad sample 17",
    "a handled traceback, then the fatal one": (
        "ValueError: Expected input batch_size (16) to match target batch_size (8)."
    ),
    "NCCL error in a rank's traceback": CASES["NCCL error in a rank's traceback"][0][4][1],
    "a warning, then CUDA OOM": CASES["a warning, then CUDA OOM"][0][3][1],
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


def test_warnings_are_told_from_errors() -> None:
    warnings = [
        NUMPY_WARNING,
        "[W socket.cpp:663] [c10d] The client socket has failed to connect to [localhost]:29500",
        "[rank0]:[W1201 03:04:05.000] Warning: failed to destroy the process group",
        "W1201 03:04:05.123000 140 api.py:897] Sending process 141 closing signal SIGTERM",
        "FutureWarning: `torch.cuda.amp.autocast(args...)` is deprecated",
    ]
    errors = [
        "RuntimeError: injected crash",
        "[rank0]: KeyError: 'input_ids'",
        "bash: line 1: /workspace/run.sh: Permission denied",
        "E1201 03:04:05.456000 140 api.py:869] failed (exitcode: 1) local_rank: 1",
        "Killed",
    ]
    assert [w for w in warnings if not is_warning(w)] == []
    assert [e for e in errors if is_warning(e)] == []


@pytest.mark.parametrize("name", list(CASES))
async def test_first_error_is_found_and_classified(store: LogStore, name: str) -> None:
    lines, first, layer, rule = CASES[name]
    task_id = f"task-{abs(hash(name)) % 10**8}"
    everything = BOOT + lines
    await store.ingest(
        [
            log_record(
                T0 + timedelta(milliseconds=100 * i), task_id, text, worker=w, stream="stderr"
            )
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
    exception = found.exception.line if found.exception else None
    assert exception == EXCEPTION_OF.get(name), found.exception
    # context: lines of the same worker only, before and after
    assert all(ln.worker == worker for ln in found.before + found.after)
    expected_before = [t for w, t in everything[: len(BOOT) + first] if w == worker][-5:]
    assert [ln.line for ln in found.before] == expected_before


async def test_no_error_no_answer(store: LogStore) -> None:
    await store.ingest(
        [
            log_record(T0 + timedelta(seconds=i), "calm", text, worker=w)
            for i, (w, text) in enumerate(BOOT)
        ]
    )
    assert await store.first_error("calm") is None
    assert await store.first_error("never-ran") is None


async def test_latest_run_by_default_and_a_given_run(store: LogStore) -> None:
    await store.ingest(
        [
            log_record(T0, "r", "ModuleNotFoundError: No module named 'x'", stream="stderr"),
            log_record(T0 + timedelta(minutes=5), "r", "Killed", run=2, stream="stderr"),
        ]
    )
    latest = await store.first_error("r")
    assert latest is not None and latest.classification.rule == "platform.resources"
    earlier = await store.first_error("r", run=1)
    assert earlier is not None and earlier.classification.layer == "image"


def test_unknown_errors_say_so() -> None:
    assert classify(["something odd failed"]).layer == "unknown"


# --- the internal route the notification service asks ----------------------------------


async def test_the_internal_route_answers_the_service_credential_only(
    dsn: str, tmp_path: Path
) -> None:
    async with log_service(dsn, tmp_path, {}) as logs:
        lines = ["epoch 1", "Traceback (most recent call last):", '  File "t.py"', "KeyError: 'x'"]
        await logs.store.ingest(
            [
                log_record(T0 + timedelta(seconds=i), "t-1", text, run=2, stream="stderr")
                for i, text in enumerate(lines)
            ]
        )
        route = f"{logs.url}/internal/v1/tasks/t-1/runs/2/first-error"
        async with httpx.AsyncClient() as http:
            for headers in ({}, {"x-runyard-service-token": "guess"}, {"authorization": "x"}):
                refused = await http.get(route, headers=headers)
                assert refused.status_code == 401, refused.text
                assert refused.json()["code"] == "auth.service_credential"
            answer = await http.get(route, headers={"x-runyard-service-token": SERVICE_TOKEN})
            assert answer.status_code == 200, answer.text
            found = answer.json()
            assert (found["task_id"], found["found"]) == ("t-1", True)
            assert found["exception"]["line"] == "KeyError: 'x'"
            other_run = route.replace("/runs/2/", "/runs/3/")
            none = await http.get(other_run, headers={"x-runyard-service-token": SERVICE_TOKEN})
            assert none.json() == {"task_id": "t-1", "found": False}
            document = (await http.get(f"{logs.url}/openapi.json")).json()
            assert not [p for p in document["paths"] if p.startswith("/internal")]


async def test_a_traceback_is_read_on_its_own_stream(store: LogStore) -> None:
    """A program's stdout, block-buffered in a pipe, is read between the lines of its
    traceback on stderr: the exception and the block are the traceback's own lines."""
    stderr = [
        "Traceback (most recent call last):",
        '  File "/workspace/train.py", line 3, in <module>',
        "ValueError: boom",
    ]
    stdout = [f"step {i} loss=0.{i}" for i in range(1, 4)]
    interleaved = [
        ("stderr", stderr[0]),
        ("stdout", stdout[0]),
        ("stdout", stdout[1]),
        ("stderr", stderr[1]),
        ("stdout", stdout[2]),
        ("stderr", stderr[2]),
    ]
    await store.ingest(
        [
            log_record(T0 + timedelta(milliseconds=10 * i), "mixed", text, stream=stream)
            for i, (stream, text) in enumerate(interleaved)
        ]
    )
    found = await store.first_error("mixed")
    assert found is not None
    assert found.line.line == stderr[0]
    assert found.exception is not None and found.exception.line == "ValueError: boom"
    assert [ln.line for ln in found.after] == stderr[1:]
    assert found.classification.rule == "training.exception", found.classification
