"""The env check program (Bootcheck, SPEC R-30), run inside one worker's environment.

    python -m runyard.faulttolerance.bootcheck --worker 0 [--rdma] \\
        [--mount /mnt/data] [--mount /mnt/ro:ro] [--io-mb 8] [--comm-timeout 60]

The runtime starts it in every worker at once, after the workers are ready
and before the launch command, with the worker's own image, variables,
working directory and volumes, so it sees what the training code will see.
It never reads training data: storage I/O writes, syncs, reads and removes a
file of its own.

Output: one JSON line per item, then the line `Bootcheck Finished`::

    {"runyard_bootcheck": 1, "worker": 0, "item": "gpu", "result": "not_applicable",
     "detail": "no NVIDIA driver on this node (nvidia-smi and NVML not found)",
     "blocking": false, "metrics": {}}
    ...
    Bootcheck Finished

Items and results (`pass`, `warn`, `fail`, `not_applicable`; never a pass
for something that was not checked):

- `gpu`: NVML (pynvml) or `nvidia-smi`: every visible GPU answers, no
  uncorrected ECC errors. A GPU that does not answer, or fewer GPUs than
  CUDA_VISIBLE_DEVICES names, is a *blocking* failure (a hardware fault,
  R-31). Without a driver: `not_applicable`.
- `rdma`: with `--rdma`, `ibv_devinfo` must list a device with an active
  port; otherwise `fail` (a warning: the launch command still runs).
  Without `--rdma`: `not_applicable`.
- `storage_io`: for each `--mount` (and the `RUNYARD_MOUNT_<N>` volumes the
  runtime exports; the working directory when none), write `--io-mb` MB,
  fsync, read back, compare, remove; throughput in MB/s. A path that cannot be
  written fails with the OS's reason. `:ro` mounts are only listed and read.
- `communication`: with torch importable and WORLD_SIZE, RANK, MASTER_ADDR
  and MASTER_PORT set (RUNYARD_BOOTCHECK_PORT overrides the port): a real
  all-reduce across the workers (NCCL with CUDA, else gloo), its result
  checked, with algorithm and bus bandwidth. Otherwise `not_applicable`, with
  the reason.
- `runtime`: Python, PyTorch, CUDA, cuDNN and NCCL versions as this
  environment sees them.

Exit status: 0, or 3 when a blocking item failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

MARKER = "runyard_bootcheck"
FINISHED = "Bootcheck Finished"
ITEMS = ("gpu", "rdma", "storage_io", "communication", "runtime")


@dataclass(frozen=True)
class ItemResult:
    """One item's outcome on one worker, as printed (and parsed back by `parse_line`)."""

    worker: int
    item: str
    result: str
    detail: str
    blocking: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)

    def to_line(self) -> str:
        return json.dumps(
            {
                MARKER: 1,
                "worker": self.worker,
                "item": self.item,
                "result": self.result,
                "detail": self.detail,
                "blocking": self.blocking,
                "metrics": self.metrics,
            }
        )


def parse_line(line: str) -> ItemResult | None:
    """The item a Bootcheck output line reports, or None for any other line."""
    if MARKER not in line:
        return None
    try:
        raw = json.loads(line[line.find("{") :])
    except ValueError:
        return None
    if not isinstance(raw, dict) or raw.get(MARKER) != 1 or raw.get("item") not in ITEMS:
        return None
    return ItemResult(
        worker=int(raw.get("worker", 0)),
        item=str(raw["item"]),
        result=str(raw.get("result", "fail")),
        detail=str(raw.get("detail", "")),
        blocking=bool(raw.get("blocking", False)),
        metrics=dict(raw.get("metrics") or {}),
    )


def is_finished_line(line: str) -> bool:
    return line.strip() == FINISHED


# --- gpu ----------------------------------------------------------------------


def check_gpu(
    worker: int, run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
) -> ItemResult:
    expected = _visible_devices()
    nvml = _check_nvml(worker, expected)
    if nvml is not None:
        return nvml
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ItemResult(
            worker,
            "gpu",
            "not_applicable",
            "no NVIDIA driver on this node (nvidia-smi and NVML not found)",
        )
    query = "index,name,memory.total,ecc.errors.uncorrected.volatile.total"
    try:
        out = run(
            [smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ItemResult(worker, "gpu", "fail", f"nvidia-smi did not answer: {exc}", blocking=True)
    if out.returncode != 0:
        reason = (out.stderr or out.stdout).strip().splitlines()
        detail = f"nvidia-smi failed: {reason[0] if reason else out.returncode}"
        return ItemResult(worker, "gpu", "fail", detail, blocking=True)
    rows = [r.split(", ") for r in out.stdout.strip().splitlines() if r.strip()]
    return _gpu_verdict(worker, rows, expected)


def _visible_devices() -> int | None:
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None or raw.strip() in ("", "NoDevFiles"):
        return None
    return len([d for d in raw.split(",") if d.strip()])


def _gpu_verdict(worker: int, rows: list[list[str]], expected: int | None) -> ItemResult:
    names = [r[1] if len(r) > 1 else "?" for r in rows]
    metrics: dict[str, Any] = {"gpus": len(rows), "names": names}
    bad_ecc = [r[0] for r in rows if len(r) > 3 and r[3].strip().isdigit() and int(r[3]) > 0]
    if expected is not None and len(rows) < expected:
        detail = f"{len(rows)} GPU(s) answer, {expected} expected (CUDA_VISIBLE_DEVICES)"
        return ItemResult(worker, "gpu", "fail", detail, blocking=True, metrics=metrics)
    if not rows:
        return ItemResult(worker, "gpu", "fail", "the driver lists no GPU", blocking=True)
    if bad_ecc:
        detail = f"uncorrected ECC errors on GPU {', '.join(bad_ecc)}"
        return ItemResult(worker, "gpu", "fail", detail, blocking=True, metrics=metrics)
    return ItemResult(
        worker, "gpu", "pass", f"{len(rows)} GPU(s): {', '.join(names)}", metrics=metrics
    )


def _check_nvml(worker: int, expected: int | None) -> ItemResult | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None  # no driver: let nvidia-smi (or its absence) speak
    try:
        rows = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            rows.append([str(i), name, "", "0"])
    except Exception as exc:
        return ItemResult(worker, "gpu", "fail", f"NVML: {exc}", blocking=True)
    finally:
        pynvml.nvmlShutdown()
    return _gpu_verdict(worker, rows, expected)


# --- rdma ---------------------------------------------------------------------


def check_rdma(worker: int, requested: bool) -> ItemResult:
    if not requested:
        return ItemResult(worker, "rdma", "not_applicable", "the task does not use RDMA")
    tool = shutil.which("ibv_devinfo")
    if tool is None:
        return ItemResult(worker, "rdma", "fail", "RDMA requested but ibv_devinfo is not installed")
    try:
        out = subprocess.run([tool], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ItemResult(worker, "rdma", "fail", f"ibv_devinfo did not answer: {exc}")
    devices = [ln.split(":", 1)[1].strip() for ln in out.stdout.splitlines() if "hca_id:" in ln]
    active = out.stdout.count("PORT_ACTIVE")
    if out.returncode != 0 or not devices:
        reason = (out.stderr or out.stdout).strip() or f"exit {out.returncode}"
        return ItemResult(worker, "rdma", "fail", f"no RDMA device: {reason}")
    metrics = {"devices": devices, "active_ports": active}
    if active == 0:
        return ItemResult(
            worker, "rdma", "fail", f"no active port on {', '.join(devices)}", metrics=metrics
        )
    detail = f"{len(devices)} device(s), {active} active port(s): {', '.join(devices)}"
    return ItemResult(worker, "rdma", "pass", detail, metrics=metrics)


# --- storage I/O --------------------------------------------------------------


@dataclass(frozen=True)
class MountToCheck:
    path: str
    read_only: bool = False


def mounts_from(args: Sequence[str], env: dict[str, str]) -> list[MountToCheck]:
    """`--mount PATH[:ro]` values, then the runtime's RUNYARD_MOUNT_<N>=<mount>=<host> ones."""
    found: dict[str, MountToCheck] = {}
    for raw in args:
        path, _, flag = raw.partition(":")
        found[path] = MountToCheck(path, flag == "ro")
    for name in sorted(k for k in env if k.startswith("RUNYARD_MOUNT_")):
        mount_path = env[name].split("=", 1)[0]
        found.setdefault(mount_path, MountToCheck(mount_path))
    return list(found.values())


def _resolve(path: str) -> Path:
    """The mount as this worker sees it; the local runtime's fallback is `./<mount path>`."""
    direct = Path(path)
    if direct.exists():
        return direct
    relative = Path.cwd() / path.lstrip("/")
    return relative if relative.exists() else direct


def check_storage(worker: int, mounts: list[MountToCheck], size_mb: int) -> list[ItemResult]:
    if not mounts:
        mounts = [MountToCheck(str(Path.cwd()))]
    return [_check_one_mount(worker, m, size_mb) for m in mounts]


def _check_one_mount(worker: int, mount: MountToCheck, size_mb: int) -> ItemResult:
    where = _resolve(mount.path)
    if not where.is_dir():
        return ItemResult(
            worker, "storage_io", "fail", f"{mount.path}: not mounted (no such directory)"
        )
    if mount.read_only:
        try:
            entries = len(os.listdir(where))
        except OSError as exc:
            return ItemResult(
                worker, "storage_io", "fail", f"{mount.path}: cannot list: {exc.strerror or exc}"
            )
        detail = f"{mount.path}: read-only volume readable ({entries} entries)"
        return ItemResult(worker, "storage_io", "pass", detail, metrics={"path": mount.path})
    return _write_read(worker, mount.path, where, size_mb)


def _write_read(worker: int, label: str, where: Path, size_mb: int) -> ItemResult:
    block = os.urandom(1 << 20)
    target = where / f".runyard-bootcheck-{os.getpid()}-{worker}"
    try:
        start = time.perf_counter()
        with open(target, "wb") as f:
            for _ in range(size_mb):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        wrote = time.perf_counter() - start
        start = time.perf_counter()
        good = True
        with open(target, "rb") as f:
            for _ in range(size_mb):
                good &= f.read(1 << 20) == block
        read = time.perf_counter() - start
    except OSError as exc:
        reason = exc.strerror or str(exc)
        return ItemResult(
            worker,
            "storage_io",
            "fail",
            f"{label}: cannot write: {reason}",
            metrics={"path": label},
        )
    finally:
        with contextlib.suppress(OSError):
            target.unlink()
    if not good:
        return ItemResult(
            worker, "storage_io", "fail", f"{label}: data read back differs from data written"
        )
    metrics = {
        "path": label,
        "size_mb": size_mb,
        "write_mb_s": round(size_mb / max(wrote, 1e-9), 1),
        "read_mb_s": round(size_mb / max(read, 1e-9), 1),
    }
    detail = (
        f"{label}: wrote {size_mb} MB at {metrics['write_mb_s']} MB/s (fsync), "
        f"read at {metrics['read_mb_s']} MB/s"
    )
    return ItemResult(worker, "storage_io", "pass", detail, metrics=metrics)


# --- communication ---------------------------------------------------------------


def check_communication(worker: int, timeout_s: float, size_mb: int = 4) -> ItemResult:
    needed = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")
    missing = [n for n in needed if not os.environ.get(n)]
    if missing:
        detail = f"not a distributed task here ({', '.join(missing)} not set)"
        return ItemResult(worker, "communication", "not_applicable", detail)
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return ItemResult(
            worker, "communication", "not_applicable", "PyTorch is not installed in the image"
        )
    try:
        return _all_reduce(worker, torch, dist, timeout_s, size_mb)
    except Exception as exc:
        return ItemResult(
            worker, "communication", "fail", f"all-reduce failed: {type(exc).__name__}: {exc}"
        )


def _all_reduce(worker: int, torch: Any, dist: Any, timeout_s: float, size_mb: int) -> ItemResult:
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    port = os.environ.get("RUNYARD_BOOTCHECK_PORT") or os.environ["MASTER_PORT"]
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(
        backend,
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{port}",
        world_size=world,
        rank=rank,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        numel = size_mb * (1 << 20) // 4
        tensor = torch.ones(numel, dtype=torch.float32, device=device)
        dist.all_reduce(tensor)  # warm-up, and the connection set-up
        rounds = 5
        dist.barrier()
        start = time.perf_counter()
        for _ in range(rounds):
            tensor.fill_(1.0)
            dist.all_reduce(tensor)
        if cuda:
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / rounds
        value = float(tensor[0].item())
    finally:
        dist.destroy_process_group()
    if value != float(world):
        detail = f"all-reduce over {world} worker(s) gave {value}, expected {world}"
        return ItemResult(worker, "communication", "fail", detail)
    algbw = size_mb / 1024 / max(seconds, 1e-9)
    busbw = algbw * 2 * (world - 1) / world if world > 1 else algbw
    metrics = {
        "backend": backend,
        "world_size": world,
        "size_mb": size_mb,
        "time_ms": round(seconds * 1000, 3),
        "algbw_gb_s": round(algbw, 3),
        "busbw_gb_s": round(busbw, 3),
    }
    detail = (
        f"{backend} all-reduce of {size_mb} MB over {world} worker(s): "
        f"{metrics['time_ms']} ms, {metrics['algbw_gb_s']} GB/s (bus {metrics['busbw_gb_s']} GB/s)"
    )
    return ItemResult(worker, "communication", "pass", detail, metrics=metrics)


# --- runtime --------------------------------------------------------------------


def check_runtime(worker: int) -> ItemResult:
    metrics: dict[str, Any] = {"python": platform.python_version()}
    try:
        import torch
    except ImportError:
        metrics["torch"] = None
        detail = f"Python {metrics['python']}; PyTorch not installed"
        return ItemResult(worker, "runtime", "pass", detail, metrics=metrics)
    metrics["torch"] = torch.__version__
    metrics["cuda"] = torch.version.cuda
    metrics["cuda_available"] = bool(torch.cuda.is_available())
    metrics["cudnn"] = _quietly(torch.backends.cudnn.version)
    metrics["nccl"] = _quietly(lambda: ".".join(str(x) for x in torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
    detail = (
        f"Python {metrics['python']}; PyTorch {metrics['torch']}; "
        f"CUDA {metrics['cuda'] or 'none (CPU build)'}; cuDNN {metrics['cudnn'] or 'none'}; "
        f"NCCL {metrics['nccl'] or 'none'}"
    )
    return ItemResult(worker, "runtime", "pass", detail, metrics=metrics)


def _quietly(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception:
        return None


# --- main --------------------------------------------------------------------------


def run_checks(args: argparse.Namespace) -> Iterator[ItemResult]:
    """Every item, in order, each as soon as it is known (the output streams)."""
    worker = args.worker
    yield check_gpu(worker)
    yield check_rdma(worker, args.rdma)
    yield from check_storage(worker, mounts_from(args.mount, dict(os.environ)), args.io_mb)
    yield check_communication(worker, args.comm_timeout)
    yield check_runtime(worker)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m runyard.faulttolerance.bootcheck")
    default_worker = int(os.environ.get("RUNYARD_WORKER_INDEX", os.environ.get("RANK", "0")))
    parser.add_argument("--worker", type=int, default=default_worker)
    parser.add_argument("--rdma", action="store_true", help="the task uses RDMA")
    parser.add_argument("--mount", action="append", default=[], help="PATH or PATH:ro")
    parser.add_argument("--io-mb", type=int, default=8)
    parser.add_argument("--comm-timeout", type=float, default=60.0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    blocking = False
    for result in run_checks(args):
        print(result.to_line(), flush=True)
        blocking |= result.result == "fail" and result.blocking
    print(FINISHED, flush=True)
    return 3 if blocking else 0


if __name__ == "__main__":
    sys.exit(main())
