"""Starting processes: torchrun for runs, a local spawn for tests and benchmarks.

``dapple-run run`` starts one process per device through torchrun
(``python -m torch.distributed.run --standalone --nproc-per-node N -m runtime run ...``),
exactly what a user would type for a multi-node job, and reads back what rank 0 wrote.
Under torchrun (``RANK``/``WORLD_SIZE`` in the environment) the same command is a worker.

``spawn(fn, nproc, *args)`` runs ``fn(*args)`` on ``nproc`` fresh local processes with an
initialised process group (a ``file://`` rendezvous, so parallel test runs never race for a
port) and returns each rank's result; tests, the benchmark and the profiler's bandwidth
measurement use it. Every CPU rank runs with one thread, so ranks do not fight over cores.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from runtime.execution.status import write_frozen

__all__ = [
    "LAUNCHED_ENV",
    "init_distributed",
    "launch",
    "leave_process_group",
    "spawn",
    "torchrun_command",
    "worker_env",
]

LAUNCHED_ENV = "DAPPLE_RUN_LAUNCHED"
"""Set by ``dapple-run`` for its torchrun workers: rank 0 writes results instead of printing."""


def worker_env() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when this process was started by torchrun, else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))


def init_distributed(
    backend: str, timeout_s: float, *, rank: int | None = None, world_size: int | None = None,
    init_method: str | None = None,
):
    """Initialise ``torch.distributed`` and return this rank's device.

    gloo runs on the CPU with one thread per rank; nccl uses GPU ``LOCAL_RANK``.
    """
    # torch only where this runs: the command line and its checks before launch stay torch-free
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank or 0))
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    dist.init_process_group(
        backend, init_method=init_method, rank=rank if rank is not None else -1,
        world_size=world_size if world_size is not None else -1, timeout=timedelta(seconds=timeout_s),
    )
    return device


def leave_process_group() -> None:
    """Leave ``torch.distributed`` after a successful run: a barrier first, so that no rank
    tears its connections down while a peer still talks over them (gloo aborts a process
    whose peer closes a connection under it), then ``destroy_process_group``."""
    # torch only where this runs: the command line and its checks before launch stay torch-free
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        # torch only where this runs: the command line and its checks before launch stay torch-free
        import torch

        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()
    dist.destroy_process_group()


def torchrun_command(nproc: int, module_args: Sequence[str]) -> list[str]:
    """torchrun on this machine, ``nproc`` workers, each running ``python -m runtime ARGS``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "runtime", *module_args]


FROZEN_GRACE_S = 3.0
"""Seconds after a rank reports a failure before the launcher kills ranks that are frozen
(stopped: SIGSTOP, a debugger), which torchrun's SIGTERM cannot end."""


def launch(nproc: int, module_args: Sequence[str], *, log_path: Path, timeout_s: float | None = None) -> int:
    """Run torchrun with workers' output going to ``log_path``; returns its exit code.

    The workers' status folder is ``log_path``'s: once a rank has written a failure there,
    a rank whose process is stopped is killed after ``FROZEN_GRACE_S`` (and recorded as frozen,
    ``runtime.execution.status.write_frozen``), so every rank is gone soon after the others' timeouts.
    """
    env = {**os.environ, LAUNCHED_ENV: "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    folder = Path(log_path).parent
    with open(log_path, "w", encoding="utf-8") as log:
        child = subprocess.Popen(torchrun_command(nproc, module_args), stdout=log, stderr=subprocess.STDOUT, env=env)
        started, failed_at = time.monotonic(), None
        while child.poll() is None:
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                child.kill()
                child.wait()
                return 124
            if failed_at is None and any(folder.glob("failure-rank*.txt")):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > FROZEN_GRACE_S:
                _kill_frozen(folder)
            time.sleep(0.2)
    return child.returncode


def _kill_frozen(folder: Path) -> None:
    """SIGKILL every worker whose process is stopped (state ``T`` in /proc) and record its rank."""
    for pid_file in folder.glob("pid-rank*"):
        rank = int(pid_file.name.removeprefix("pid-rank"))
        try:
            pid = int(pid_file.read_text(encoding="utf-8"))
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            continue  # gone already, or no /proc here
        if state in ("T", "t"):
            write_frozen(folder, rank)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _spawned(rank: int, fn: Callable, args: tuple, nproc: int, init_file: str, backend: str, timeout_s: float,
             results: str) -> None:
    # torch only where this runs: the command line and its checks before launch stay torch-free
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank))
    device = init_distributed(backend, timeout_s, rank=rank, world_size=nproc, init_method=f"file://{init_file}")
    try:
        result = fn(device, *args)
        with open(Path(results) / f"rank{rank}.pkl", "wb") as out:
            pickle.dump(result, out)
    except BaseException:
        dist.destroy_process_group()
        raise
    leave_process_group()


def spawn(
    fn: Callable[..., Any], nproc: int, *args: Any, backend: str = "gloo", timeout_s: float = 60.0,
    start_method: str | None = None,
) -> list[Any]:
    """Run ``fn(device, *args)`` on ``nproc`` new processes; return their results in rank order.

    ``fn`` must be importable by name (a module-level function). An exception in any rank
    stops the others and is raised here (``torch.multiprocessing.ProcessRaisedException``).
    By default gloo ranks are forked: they inherit this process's imported torch instead of
    importing it again (seconds per rank on a small machine); each sets one thread, so
    OpenMP's pool in this process is never used by them. GPU ranks start fresh ("spawn").
    """
    # torch only where this runs: the command line and its checks before launch stay torch-free
    import torch
    import torch.multiprocessing as mp

    if start_method is None:
        forkable = backend == "gloo" and sys.platform == "linux" and not torch.cuda.is_initialized()
        start_method = "fork" if forkable else "spawn"

    with tempfile.TemporaryDirectory(prefix="dapple-spawn-") as folder:
        init_file = str(Path(folder) / "rendezvous")
        mp.start_processes(_spawned, args=(fn, args, nproc, init_file, backend, timeout_s, folder), nprocs=nproc,
                           start_method=start_method)
        results = []
        for rank in range(nproc):
            with open(Path(folder) / f"rank{rank}.pkl", "rb") as handle:
                results.append(pickle.load(handle))
    return results
