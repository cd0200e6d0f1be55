"""``dapple-run run``: train a few steps of the plan on N processes and say what happened.

The launching process checks the scenario and that the plan uses exactly the devices
0..N-1 (one process per device: the global device id is the torch rank), starts N workers
through torchrun (``runtime.execution.launch``), and prints rank 0's summary: median iteration time,
per-device peak memory, the trace, and with ``--check`` the comparison of the first step's
loss and gradients with the unsplit model. Under torchrun the same command is the worker
(``runtime.execution.worker``).

A run that fails is one line: the first rank that died or raised and at which action, and
where the others stopped (``report_failure``), read from the failure and status files the
ranks leave in ``--out`` and from torchrun's log.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import logging
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from runtime.execution.launch import launch, worker_env
from runtime.execution.status import read_failures, read_frozen, read_status
from runtime.execution.worker import run_worker
from runtime.model.config import RunnableScenario, check_world, load_runnable
from sim.core import jsonio
from sim.core.command import Stopwatch, progress
from sim.core.errors import DappleError
from sim.core.parallelism import Recompute
from sim.core.units import format_bytes, format_time
from sim.report.analysis.calibrate import COLUMNS

__all__ = ["check_launch", "cmd_run", "follow_steps", "print_run", "report_failure"]

log = logging.getLogger(__name__)


def cmd_run(args: argparse.Namespace) -> int:
    """``dapple-run run``: launch the workers (or, under torchrun, be one) and report rank 0's summary."""
    if worker_env() is not None:
        return run_worker(args, lambda summary: print_run(summary, args.json))
    watch = Stopwatch()
    runnable = load_runnable(args.scenario, args.overrides, plan=args.plan_data)
    check_launch(runnable, args)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix=f"dapple-run-{runnable.scenario.name}-"))
    with watch.phase(f"run {args.warmup} + {args.steps} steps on {args.nproc} processes"):
        summary = _launch_run(args, out)
    watch.report()
    if summary is None:
        return report_failure(out, args.failure_code)
    print_run(summary, args.json)
    if args.csv:
        _append_csv(args.csv, runnable, summary)
    if args.check and not summary["check_passed"]:
        print(f"dapple-run: check failed: max_abs_grad_diff {summary['max_abs_grad_diff']:.3g} "
              f"(worst {summary['worst_grad']}), step 0's loss {summary['loss']:.7g} vs the unsplit model's "
              f"{summary['reference_loss']:.7g}",
              file=sys.stderr)
        return 1
    return 0


def _append_csv(path: str, runnable: RunnableScenario, summary: dict[str, Any]) -> None:
    """Append this run as one row of ``sim.report.analysis.calibrate``'s measured-run CSV (header if new)."""
    if runnable.model.preset != "gpt":
        raise DappleError(f"--csv: the calibration CSV describes GPT models; this scenario's model is "
                          f"{runnable.model.preset!r}")
    if runnable.plan.group_size > 1 or runnable.plan.sharding.value != "none":
        raise DappleError("--csv: the calibration CSV describes data x pipeline plans; this plan has tensor, "
                          "context or sharded data parallelism")
    replicas = {runnable.plan.num_replicas(s) for s in range(runnable.plan.num_stages)}
    if len(replicas) != 1 or runnable.plan.schedule == "interleaved":
        raise DappleError("--csv: the calibration CSV needs one replica count for every stage and one stage per "
                          "device set (dp x pp); this plan has " + ("interleaved chunks" if len(replicas) == 1
                                                                    else f"replica counts {sorted(replicas)}"))
    dp = replicas.pop()
    training, values = runnable.scenario.training, runnable.model.values
    row = {"hidden": values["hidden"], "heads": values["heads"], "layers": values["layers"],
           "seq_len": values["seq_len"], "vocab": values["vocab"], "microbatch_size": training.microbatch_size // dp,
           "global_batch_size": training.global_batch_size, "tp": 1, "dp": dp, "pp": runnable.plan.num_stages,
           "recompute": int(runnable.plan.recompute is Recompute.FULL), "iteration_time_s": summary["median_iteration_time_s"]}
    target = Path(path)
    new = not target.exists() or target.stat().st_size == 0
    try:
        with open(target, "a", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(COLUMNS))
            if new:
                writer.writeheader()
            writer.writerow(row)
    except OSError as exc:
        raise DappleError(f"--csv {path}: cannot write ({exc.strerror})") from None


def _launch_run(args: argparse.Namespace, out: Path) -> dict[str, Any] | None:
    """Run the plan through torchrun into ``out``; rank 0's summary, or None when it failed
    (``args.failure_code`` then holds torchrun's exit code)."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in list(out.glob("failure-rank*.txt")) + list(out.glob("status-rank*")) + [out / "summary.json"]:
        stale.unlink(missing_ok=True)
    with progress(f"starting {args.nproc} processes (torchrun)", total=args.warmup + args.steps, unit="step") as tick:
        with follow_steps(out, args.nproc, tick):
            code = launch(args.nproc, _worker_args(args, out), log_path=out / "torchrun.log")
    if code != 0:
        args.failure_code = code
        return None
    return json.loads((out / "summary.json").read_text(encoding="utf-8"))


@contextlib.contextmanager
def follow_steps(out: Path, nproc: int, tick, every_s: float = 0.25):
    """While the block runs, move ``tick`` (a progress bar's) to the step every rank has
    reached, read from the status files the ranks keep in ``out`` (``runtime.execution.status``); the
    first time every rank has one, the processes have started."""
    if tick is None:
        yield
        return

    stop, started = threading.Event(), time.perf_counter()

    def follow() -> None:
        shown, said = 0, ""
        while not stop.wait(every_s):
            status = read_status(out)
            # "step K ACTION": step K under way; between steps a rank may say what it does
            # instead of an action ("step 5 profiling": step 5 not begun)
            steps = [int(text.split()[1]) + (0 if text.endswith(" profiling") else 1)
                     for text in status.values() if text.startswith("step ")]
            if len(steps) < nproc:
                continue
            if not said:
                log.info("%d processes started in %.1f s", nproc, time.perf_counter() - started)
            doing = "profiling" if any(text.endswith(" profiling") for text in status.values()) else "training"
            reached = min(steps)
            if reached > shown or doing != said:
                tick(max(0, reached - shown), desc=doing)
                shown, said = max(shown, reached), doing

    thread = threading.Thread(target=follow, name="dapple-run-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def check_launch(runnable: RunnableScenario, args: argparse.Namespace) -> None:
    """Reject, before any process starts, a launch that does not fit the plan (``run`` and ``validate``)."""
    if args.nproc is None:
        raise DappleError(f"--nproc: missing; the plan uses {len(runnable.plan.devices)} devices, give --nproc "
                          f"{len(runnable.plan.devices)}")
    check_world(runnable.plan, args.nproc)
    if args.backend == "nccl":
        _check_gpus(args.nproc)


def _worker_args(args: argparse.Namespace, out: Path) -> list[str]:
    words = ["run", str(args.scenario), "--backend", args.backend, "--steps", str(args.steps), "--warmup",
             str(args.warmup), "--seed", str(args.seed), "--timeout", str(args.timeout), "--out", str(out)]
    for key, value in args.overrides.items():
        words += ["--set", f"{key}={value}"]
    if args.plan:
        words += ["--plan", str(args.plan)]
    if args.check:
        words.append("--check")
    if args.no_memory:
        words.append("--no-memory")
    if args.fail_at:
        words += ["--fail-at", ":".join(map(str, args.fail_at))]
    return words


def _check_gpus(nproc: int) -> None:
    # torch only where this runs: the command line and its checks before launch stay torch-free
    import torch

    if torch.cuda.device_count() < nproc:
        raise DappleError(f"--backend nccl needs {nproc} GPUs (one per process); this machine has "
                          f"{torch.cuda.device_count()}; use --backend gloo")


def report_failure(out: Path, code: int) -> int:
    """One line: which rank failed first and at which action, and where the others stopped.

    A rank that raised left a failure file; a rank that died (killed, crashed) left none, and
    torchrun's log gives its exit code. A death comes first: the others' errors are then
    only their lost connection to it. Among raised failures the earliest is the cause. A rank
    ended by SIGTERM is usually one torchrun stopped after another failed, so it is a cause
    only when torchrun observed it failing first (its "Root Cause"), when every raised failure is
    a lost connection (the others only lost it), or when nothing else failed.
    """
    failures, status = read_failures(out), read_status(out)
    frozen = read_frozen(out)
    if frozen:  # the others timed out waiting for it: it is the cause, whatever they raised
        cause = frozen[0]
        where = f" at {status[cause]}" if cause in status else ""
        others = [f"rank {rank} at {text}" for rank, text in sorted(status.items()) if rank != cause]
        stopped = f"; stopped: {', '.join(others)}" if others else ""
        print(f"dapple-run: error: rank {cause} stopped responding{where} (its process was frozen; killed)"
              f"{stopped}; log: {out / 'torchrun.log'}", file=sys.stderr)
        return 1
    log = out / "torchrun.log"
    exits = _failed_ranks(log)
    dead = sorted(rank for rank in exits if rank not in failures)
    crashed = [rank for rank in dead if exits[rank] != str(-signal.SIGTERM)]
    root = _root_cause(log)
    lost = failures and all(any(sign in message for sign in _LOST_PEER) for _, message in failures.values())
    terminated = [rank for rank in dead if rank not in crashed]
    # stopped from outside: the others only lost it (unless another rank crashed on its own:
    # with more than two ranks torchrun then SIGTERMs the bystanders, which are not the cause)
    if terminated and not crashed and (root in terminated or lost):
        crashed = [root if root in terminated else terminated[0], *crashed]
    dead = crashed or ([] if failures else dead)
    if dead:
        cause = dead[0]
        where = f" at {status[cause]}" if cause in status else ""
        message = f"rank {cause} died{where} (exit code {exits[cause]})"
    elif failures:
        cause = min(failures, key=lambda rank: failures[rank][0])
        message = failures[cause][1]
    else:
        cause, message = None, f"torchrun exited with code {code}"
    others = [f"rank {rank} at {text}" for rank, text in sorted(status.items()) if rank != cause]
    stopped = f"; stopped: {', '.join(others)}" if others else ""
    print(f"dapple-run: error: {message}{stopped}; log: {log}", file=sys.stderr)
    return 1


_LOST_PEER = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Connection refused")
"""What gloo says when the rank at the other end of a connection is gone."""


def _root_cause(log: Path) -> int | None:
    """The rank torchrun observed failing first (its "Root Cause" section), if it says."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    match = re.search(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)", text, flags=re.S)
    return int(match[1]) if match else None


def _failed_ranks(log: Path) -> dict[int, str]:
    """Rank -> exit code of every failed worker in torchrun's failure report."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    pairs = re.findall(r"rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)", text)
    return {int(rank): exit_code for rank, exit_code in pairs}


def _bytes(value: float | None) -> str:
    return "-" if value is None else format_bytes(value)


def print_run(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(jsonio.dumps(summary, indent=2, sort_keys=True))
        return
    times = summary["iteration_times_s"]
    print(f"{summary['name']}: {summary['schedule']}, {summary['num_stages']} stages, "
          f"{summary['num_microbatches']} micro-batches, {summary['world_size']} ranks "
          f"({summary['backend']}, {summary['device_type']})")
    print(f"iteration {format_time(summary['median_iteration_time_s'])} (median of {len(times)} steps; "
          f"min {format_time(min(times))}, max {format_time(max(times))})   "
          f"throughput {summary['throughput_samples_per_s']:.1f} samples/s")
    losses = summary["losses"]
    print(f"loss: step 0 {losses[0]:.7g}, last step ({len(losses) - 1}) {losses[-1]:.7g} "
          f"({summary['warmup_steps']} warm-up + {len(times)} measured steps of training; each step draws fresh "
          f"random samples, so the loss measures the step and need not fall)")
    degrees = summary.get("parallelism")
    if degrees:
        print(f"parallelism: tensor {degrees['tensor']}{' (sequence parallel)' if degrees['sequence_parallel'] else ''}, "
              f"context {degrees['context']}, pipeline {degrees['pipeline']}, data {degrees['data']}, "
              f"{'expert ' + str(degrees['expert']) + ', ' if degrees.get('expert', 1) > 1 else ''}"
              f"sharding {degrees['sharding']}")
    vocabulary = summary.get("vocabulary") or {}
    if vocabulary.get("text"):  # the padded table the run built, as dapple-sim check prints it
        print(vocabulary["text"])
    print(f"  {'device':>6}  {'stages':<10} {'peak memory':>12} {'parameters':>11} {'gradients':>10} "
          f"{'optimizer':>10} {'activations':>12}")
    for d in summary["devices"]:
        stages = ",".join(map(str, d["stages"]))
        kinds = d.get("memory_breakdown_bytes") or {}
        print(f"  {d['device']:>6}  {stages:<10} {_bytes(d['peak_memory_bytes']):>12} "
              f"{_bytes(kinds.get('parameters')):>11} {_bytes(kinds.get('gradients')):>10} "
              f"{_bytes(kinds.get('optimizer')):>10} {_bytes(d['peak_activation_bytes']):>12}")
    if "max_abs_grad_diff" in summary:
        verdict = "passed" if summary["check_passed"] else "FAILED"
        print(f"check: step 0's loss {summary['loss']:.7g} vs the unsplit model's {summary['reference_loss']:.7g}, "
              f"max_abs_grad_diff {summary['max_abs_grad_diff']:.3g} (max relative "
              f"{summary['max_rel_grad_diff']:.3g}, tolerance {summary.get('grad_rtol', 1e-5):.3g}): {verdict}")
    step = summary.get("events_step_time_s")
    print(f"trace: {summary['trace']} (the median step, step {summary.get('events_step', '?')}"
          + (f", {format_time(step)}" if step else "") + "; open in https://ui.perfetto.dev)")
    if summary.get("events_csv"):
        print(f"events: {summary['events_csv']}")
