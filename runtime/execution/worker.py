"""What one torchrun worker does for ``dapple-run run`` and ``dapple-run profile``.

A worker loads the scenario itself (every rank reads the same file), checks that the plan
fits the world it was started in, initialises ``torch.distributed`` and runs. Rank 0 writes
``summary.json``, ``trace.json`` and ``events.csv`` into the output folder and, when a user started torchrun
directly, prints the result. A failure is written to ``failure-rank{r}.txt`` (one line that
names the rank and the action) before the process exits with code 1, so the launcher can
report it after torchrun has stopped the others.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.execution.launch import LAUNCHED_ENV, init_distributed, leave_process_group, worker_env
from runtime.execution.status import StatusBoard, write_failure
from runtime.measure.trace import measured_trace, write_events
from runtime.model.config import check_world, load_runnable
from sim.core import jsonio
from sim.core.errors import DappleError

__all__ = ["default_out", "profile_worker", "run_worker", "write_run_outputs"]


def default_out(name: str) -> Path:
    """A folder every rank of one torchrun job agrees on (torchrun gives them one run id)."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", str(os.getppid()))
    return Path(tempfile.gettempdir()) / f"dapple-run-{name}-{run_id}"


def write_run_outputs(summary: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write ``trace.json`` (a Chrome/Perfetto trace of the median step, laid out as the
    simulator's), ``events.csv`` (its event rows) and ``summary.json``; return the summary
    with their paths."""
    out.mkdir(parents=True, exist_ok=True)
    events = summary.pop("events")
    trace = out / "trace.json"
    metadata = {"scenario": summary.get("name"), "step": summary.get("events_step"), "backend": summary.get("backend")}
    trace.write_text(jsonio.dumps(measured_trace(events, metadata=metadata), separators=(",", ":")) + "\n",
                     encoding="utf-8")
    write_events(events, out / "events.csv")
    summary["trace"], summary["events_csv"] = str(trace), str(out / "events.csv")
    (out / "summary.json").write_text(jsonio.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return summary


def _as_worker(args: argparse.Namespace, body: Callable[[int, Any], None]) -> int:
    """Check, initialise, run ``body(rank, device)``; turn any failure into a file and exit 1."""
    rank = worker_env()[0]
    out = Path(args.out) if args.out else default_out(Path(args.scenario).stem)
    try:
        device = init_distributed(args.backend, args.timeout)
    except Exception as exc:  # noqa: BLE001 — reported as this rank's failure
        message = f"rank {rank} could not join the process group: {type(exc).__name__}: {exc}"
        write_failure(out, rank, message)
        print(f"dapple-run: {message}", file=sys.stderr)
        return 1
    try:
        body(rank, device)
    except Exception as exc:  # noqa: BLE001
        message = str(exc) if str(exc).startswith(f"rank {rank} ") else f"rank {rank} failed: {type(exc).__name__}: {exc}"
        write_failure(out, rank, message)
        print(f"dapple-run: {message}", file=sys.stderr)

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # do not wait in destroy_process_group for peers that will never come
    leave_process_group()
    return 0


def run_worker(args: argparse.Namespace, print_summary: Callable[[dict], None]) -> int:
    """``dapple-run run`` under torchrun."""
    # torch only where this runs: the command line and its checks before launch stay torch-free
    from runtime.execution.executor import ExecOptions
    from runtime.execution.session import SessionOptions, run_session

    world = worker_env()[1]
    runnable = load_runnable(args.scenario, args.overrides, plan=args.plan_data)
    check_world(runnable.plan, world)
    if args.backend == "nccl":
        _check_gpus(world)
    out = Path(args.out) if args.out else default_out(Path(args.scenario).stem)
    options = SessionOptions(
        steps=args.steps, warmup_steps=args.warmup, check=args.check,
        execution=ExecOptions(seed=args.seed, track_memory=not args.no_memory, timeout_s=args.timeout,
                              fail_at=args.fail_at),
    )

    def body(rank: int, device) -> None:
        status = StatusBoard(out, rank)
        summary = run_session(runnable, options, device, status=status)
        status.close()
        if summary is not None:
            summary = write_run_outputs(summary, out)
            if not os.environ.get(LAUNCHED_ENV):
                print_summary(summary)

    return _as_worker(args, body)


def profile_worker(args: argparse.Namespace, finish: Callable[[dict], None]) -> int:
    """``dapple-run profile`` under torchrun: every rank measures links, rank 0 the layers."""
    # torch only where this runs: the command line and its checks before launch stay torch-free
    from runtime.measure.bandwidth import measure_links

    world = worker_env()[1]
    if world < 2:
        raise DappleError("measuring links needs 2 processes; launch torchrun with --nproc-per-node 2")
    if args.backend == "nccl":
        _check_gpus(world)

    def body(rank: int, device) -> None:
        links = measure_links(device, repeats=args.repeats)
        if rank == 0:
            finish({"links": links, "device": device})

    return _as_worker(args, body)


def _check_gpus(world: int) -> None:
    # torch only where this runs: the command line and its checks before launch stay torch-free
    import torch

    if torch.cuda.device_count() < int(os.environ.get("LOCAL_WORLD_SIZE", world)):
        raise DappleError(
            f"--backend nccl needs one GPU per process; this machine has {torch.cuda.device_count()}; use --backend gloo"
        )
