"""The env check program (R-30) run as a real process, as the runtime runs it in a worker."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from runyard.faulttolerance.bootcheck import (
    FINISHED,
    ITEMS,
    ItemResult,
    MountToCheck,
    check_gpu,
    check_rdma,
    check_storage,
    mounts_from,
    parse_line,
)
from runyard.stack.ports import free_port as _free_port

MODULE = "runyard.faulttolerance.bootcheck"


def bootcheck(
    *args: str,
    env: dict[str, str] | None = None,
    wrap: list[str] | None = None,
    cwd: Path | None = None,
) -> tuple[int, list[str]]:
    command = [sys.executable, "-m", MODULE, *args]
    if wrap:
        command = [*wrap, " ".join(f"'{c}'" for c in command)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)
    return out.returncode, out.stdout.splitlines()


def items(lines: list[str]) -> list[ItemResult]:
    return [r for r in (parse_line(ln) for ln in lines) if r is not None]


def base_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(extra)
    return env


def test_every_item_is_reported_then_finished(tmp_path: Path) -> None:
    volume = tmp_path / "vol"
    volume.mkdir()
    rc, lines = bootcheck("--worker", "1", "--mount", str(volume), "--io-mb", "2", env=base_env())
    assert rc == 0, lines
    assert lines[-1] == FINISHED
    reported = items(lines)
    assert {r.item for r in reported} == set(ITEMS)
    assert all(r.worker == 1 for r in reported)
    by_item = {r.item: r for r in reported}
    assert by_item["rdma"].result == "not_applicable"
    storage = by_item["storage_io"]
    assert storage.result == "pass" and storage.metrics["write_mb_s"] > 0
    assert storage.metrics["read_mb_s"] > 0 and str(volume) in storage.detail
    assert list(volume.iterdir()) == [], "the check leaves nothing behind"
    assert by_item["communication"].result == "not_applicable"
    assert "not set" in by_item["communication"].detail
    assert by_item["runtime"].result == "pass"
    assert f"Python {sys.version.split()[0]}" in by_item["runtime"].detail
    if shutil.which("nvidia-smi") is None:
        assert by_item["gpu"].result == "not_applicable"  # never a fake pass


def _read_only_wrapper(path: Path) -> list[str] | None:
    """How to run a command that sees `path` read-only, or None."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        return ["bash", "-c"]
    if shutil.which("unshare") is None:
        return None
    probe = subprocess.run(
        ["unshare", "-m", "bash", "-c", f"mount --bind -o ro '{path}' '{path}'"],
        capture_output=True,
    )
    if probe.returncode != 0:
        return None
    return [
        "unshare",
        "-m",
        "bash",
        "-c",
        f"mount --bind -o ro '{path}' '{path}' && exec \"$0\" \"$@\"",
    ]


def test_a_read_only_volume_fails_storage_io_with_the_reason(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    rw = tmp_path / "rw"
    rw.mkdir()
    wrap = _read_only_wrapper(ro)
    if wrap is None:
        pytest.skip("cannot make a read-only directory here")
    command = [sys.executable, "-m", MODULE, "--mount", str(rw), "--mount", str(ro), "--io-mb", "1"]
    if wrap[:2] == ["bash", "-c"]:
        out = subprocess.run(command, capture_output=True, text=True, timeout=120, env=base_env())
    else:
        out = subprocess.run(
            [*wrap, *command], capture_output=True, text=True, timeout=120, env=base_env()
        )
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stderr  # a storage failure is a warning, not blocking
    storage = [r for r in items(lines) if r.item == "storage_io"]
    assert [r.result for r in storage] == ["pass", "fail"]
    assert storage[1].detail.startswith(f"{ro}: cannot write: ")
    assert "Read-only file system" in storage[1].detail or "Permission denied" in storage[1].detail
    assert not storage[1].blocking
    assert lines[-1] == FINISHED


def test_a_missing_mount_fails() -> None:
    (result,) = check_storage(0, [MountToCheck("/no/such/volume")], 1)
    assert result.result == "fail" and "not mounted" in result.detail


def test_mounts_come_from_arguments_and_runtime_variables() -> None:
    env = {"RUNYARD_MOUNT_0": "/mnt/data=/host/v/data", "RUNYARD_MOUNT_1": "/mnt/ro=/host/v/ro"}
    assert mounts_from(["/mnt/ro:ro"], env) == [
        MountToCheck("/mnt/ro", read_only=True),
        MountToCheck("/mnt/data"),
    ]


def test_local_runtime_mount_fallback_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mnt" / "ckpt").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    (result,) = check_storage(0, [MountToCheck("/mnt/ckpt")], 1)
    assert result.result == "pass", result.detail


def test_gpu_verdicts_from_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(out: str, rc: int = 0):  # type: ignore[no-untyped-def]
        return lambda *a, **k: subprocess.CompletedProcess(
            a,
            rc,
            out,
            "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error"
            if rc
            else "",
        )

    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    ok = check_gpu(0, run=fake_run("0, NVIDIA H200, 143771, 0\n1, NVIDIA H200, 143771, 0\n"))
    assert ok.result == "pass" and ok.metrics["gpus"] == 2
    dropped = check_gpu(0, run=fake_run("0, NVIDIA H200, 143771, 0\n"))
    assert (
        dropped.result == "fail"
        and dropped.blocking
        and "1 GPU(s) answer, 2 expected" in dropped.detail
    )
    lost = check_gpu(0, run=fake_run("", rc=15))
    assert lost.result == "fail" and lost.blocking and "Unknown Error" in lost.detail
    ecc = check_gpu(0, run=fake_run("0, NVIDIA H200, 143771, 0\n1, NVIDIA H200, 143771, 3\n"))
    assert ecc.result == "fail" and "ECC" in ecc.detail


def test_rdma_requested_without_tools_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    result = check_rdma(0, requested=True)
    assert result.result == "fail" and not result.blocking and "ibv_devinfo" in result.detail


def test_parse_line_ignores_other_output() -> None:
    assert parse_line("loss 1.23") is None
    assert parse_line('{"runyard_bootcheck": 1, "item": "bogus"}') is None
    line = ItemResult(2, "gpu", "fail", "lost", blocking=True).to_line()
    assert parse_line("2026-11-30T02:00:00 " + line) == ItemResult(2, "gpu", "fail", "lost", True)
    assert json.loads(line)["runyard_bootcheck"] == 1


@pytest.mark.slow
def test_all_reduce_really_runs_between_two_workers(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    port = str(_free_port())
    procs = []
    for rank in (0, 1):
        env = base_env(WORLD_SIZE="2", RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", MODULE, "--worker", str(rank), "--io-mb", "1"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=tmp_path,
            )
        )
    outputs = [p.communicate(timeout=120) for p in procs]
    for (out, err), proc in zip(outputs, procs, strict=True):
        assert proc.returncode == 0, err
        comm = next(r for r in items(out.splitlines()) if r.item == "communication")
        assert comm.result == "pass", comm.detail
        assert comm.metrics["backend"] == "gloo" and comm.metrics["world_size"] == 2
        assert comm.metrics["algbw_gb_s"] > 0
        assert "all-reduce of 4 MB over 2 worker(s)" in comm.detail
