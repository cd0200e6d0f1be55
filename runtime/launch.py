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
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

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
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        import torch

        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()
    dist.destroy_process_group()


def torchrun_command(nproc: int, module_args: Sequence[str]) -> list[str]:
    """torchrun on this machine, ``nproc`` workers, each running ``python -m runtime ARGS``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "runtime", *module_args]


def launch(nproc: int, module_args: Sequence[str], *, log_path: Path, timeout_s: float | None = None) -> int:
    """Run torchrun with workers' output going to ``log_path``; returns its exit code."""
    env = {**os.environ, LAUNCHED_ENV: "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with open(log_path, "w", encoding="utf-8") as log:
        try:
            done = subprocess.run(torchrun_command(nproc, module_args), stdout=log, stderr=subprocess.STDOUT,
                                  env=env, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return 124
    return done.returncode


def _spawned(rank: int, fn: Callable, args: tuple, nproc: int, init_file: str, backend: str, timeout_s: float,
             results: str) -> None:
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
