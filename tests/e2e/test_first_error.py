"""The first error of a failed task names its exception, not an earlier warning (R-42).

Two real scripts fail on the local runtime after torch's "Failed to initialize
NumPy" warning: one raises `RuntimeError: injected crash` in worker 1 of 2,
the other `KeyError: 'input_ids'`. Through the gateway, `runyard logs
--first-error` and the Feishu card (a tenant subscription, delivered to the
fake Feishu server, allowed as a self-hosted Feishu in notification.yaml)
both name the exception, with its worker and layer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from runyard.cli.main import app as cli_app
from runyard.messaging import KafkaSettings
from typer.testing import CliRunner

from tests.e2e import conftest as e2e
from tests.e2e.conftest import Platform, running_platform
from tests.feishu_fake import FeishuFake

pytestmark = [pytest.mark.slow, pytest.mark.integration]

#: torch's warning when NumPy is missing, as torch prints it.
NUMPY_WARNING = (
    "/usr/local/lib/python3.11/site-packages/torch/_subclasses/functional_tensor.py:276:"
    " UserWarning: Failed to initialize NumPy: No module named 'numpy' (Triggered internally"
    " at /pytorch/torch/csrc/utils/tensor_numpy.cpp:84.)"
)
#: Imports torch where it is installed (without NumPy it warns by itself); where the
#: warning would not come, prints torch's line, so the warning is always there first.
PREAMBLE = f"""
import os, sys
try:
    import torch
except ImportError:
    torch = None
if torch is None or "numpy" in sys.modules:
    print({NUMPY_WARNING!r}, file=sys.stderr, flush=True)
print("step 1 loss=2.30", flush=True)
"""
CRASH = """
def train_step(rank):
    if rank == 1:
        raise RuntimeError("injected crash")
    print("rank 0 done", flush=True)

train_step(int(os.environ.get("RANK", "0")))
"""
MISSING_KEY = """
def first_ids(batch):
    return batch["input_ids"]

first_ids({"labels": [1, 2, 3]})
"""


def command(script: str) -> str:
    return f"set -o pipefail\npython - <<'EOF'\n{PREAMBLE}{script}\nEOF"


@pytest.fixture
async def platform_and_feishu(
    dsn: str, kafka: KafkaSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Platform, FeishuFake]]:
    feishu = FeishuFake(bots={"team": None})
    await feishu.start()
    copy = e2e.copy_config

    def with_feishu(target: Path, **kw: Any) -> Path:
        """The platform's config, the fake Feishu allowed as the operators would."""
        folder = copy(target, **kw)
        (folder / "notification.yaml").write_text(
            f"webhook_origins: ['http://127.0.0.1:{feishu.port}']\n"
        )
        return folder

    monkeypatch.setattr(e2e, "copy_config", with_feishu)
    try:
        async with running_platform(dsn, kafka, tmp_path, notification_poll_s=0.1) as platform:
            yield platform, feishu
    finally:
        await feishu.stop()


async def first_error(platform: Platform, task_id: str, within: float = 30.0) -> dict[str, Any]:
    """The first error, once the workers' last lines are stored (the exception line)."""
    deadline = time.monotonic() + within
    while True:
        answer = await platform.http.get(f"/v1/tasks/{task_id}/first-error")
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        if found["found"] and found["exception"]:
            return found
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.2)


async def first_error_cli(platform: Platform, task_id: str) -> str:
    env = {
        "RUNYARD_URL": str(platform.http.base_url),
        "RUNYARD_TOKEN": platform.token,
        "COLUMNS": "250",
    }
    args = ["logs", task_id, "--first-error"]
    shown = await asyncio.to_thread(CliRunner().invoke, cli_app, args, env=env)
    assert shown.exit_code == 0, shown.output
    return shown.stdout


async def card_of(feishu: FeishuFake, task_id: str, within: float = 60.0) -> str:
    deadline = time.monotonic() + within
    while True:
        cards = [r.text for r in feishu.accepted("team") if task_id in r.text]
        if cards:
            return cards[0]
        assert time.monotonic() < deadline, "no card for the failed task"
        await asyncio.sleep(0.2)


@pytest.mark.processes
async def test_the_first_error_names_the_exception_not_the_numpy_warning(
    platform_and_feishu: tuple[Platform, FeishuFake],
) -> None:
    platform, feishu = platform_and_feishu
    subscribed = await platform.http.post(
        "/v1/alert-subscriptions",
        json={"webhook_url": feishu.url("team"), "alerts": ["failed"]},
    )
    assert subscribed.status_code == 201, subscribed.text
    crash = await platform.submit(
        name="crash",
        image="pytorch:2.3-cuda12",
        framework="pytorch_ddp",
        worker_count=2,
        command=command(CRASH),
    )
    missing = await platform.submit(
        name="missing-key", image="pytorch:2.3-cuda12", command=command(MISSING_KEY)
    )
    cases = [
        (crash["task_id"], 1, "RuntimeError: injected crash"),
        (missing["task_id"], 0, "KeyError: 'input_ids'"),
    ]
    for task_id, _, _ in cases:
        await platform.wait_status(task_id, "failed", within=90)

    for task_id, worker, exception in cases:
        warned = await platform.http.get(
            f"/v1/tasks/{task_id}/logs", params={"phrase": "Failed to initialize NumPy"}
        )
        assert warned.json()["lines"], "the warning came first, as in the report"

        found = await first_error(platform, task_id)
        assert found["exception"]["line"] == exception
        assert found["exception"]["worker"] == worker
        assert found["line"]["line"] == "Traceback (most recent call last):"
        assert (found["layer"], found["rule"]) == ("training_code", "training.exception")
        assert "UserWarning" not in found["line"]["line"]

        shown = await first_error_cli(platform, task_id)
        assert f"exception (worker {worker}, attempt 1): {exception}" in shown, shown
        assert "training_code" in shown and "missing_package" not in shown

        card = await card_of(feishu, task_id)
        assert exception in card, card
        assert "training_code" in card
        assert "Failed to initialize NumPy" not in card and "missing_package" not in card
