"""``dapple-run``: run a scenario's plan for real with torch.distributed, or profile its layers.

``dapple-run run SCENARIO --nproc N`` checks the scenario and that its plan uses exactly the
devices 0..N-1 (one process per device; the global device id is the torch rank), then starts
N workers through torchrun and prints what rank 0 measured. Under torchrun
(``torchrun --nproc-per-node N -m runtime run SCENARIO``) the same command is the worker.

Exit codes: 0 success, 1 run failure (a rank failed, or ``--check`` found a difference),
2 bad input (one line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sim.command import add_scenario_options, parse_overrides, run_cli
from sim.errors import DappleError
from sim.units import format_bytes, format_time

__all__ = ["main"]

EPILOG = """examples:
  dapple-run run scenarios/gpt_tiny_cpu.yaml --nproc 2 --check
  dapple-run run scenarios/gpt_tiny_cpu.yaml --nproc 2 --set plan.schedule=gpipe --steps 20 --json
  dapple-run run SCENARIO --nproc 8 --backend nccl --plan plan.json --out out/run
  torchrun --nproc-per-node 2 -m runtime run scenarios/gpt_tiny_cpu.yaml --check
  dapple-run profile scenarios/gpt_tiny_cpu.yaml --out out/gpt-tiny-profile
  dapple-run validate scenarios/gpt_tiny_cpu.yaml --nproc 2 --out out/gpt-tiny-validation

A run writes summary.json and trace.json (one row per action and device, the simulator's
event-row format, seconds from the step's start) into --out (default: a new temporary
folder). A profile writes profile.txt (the simulator's profile format), profile.json,
cluster.yaml (measured links and device) and scenario.yaml (the scenario on the measured
profile and cluster, ready for dapple-sim simulate).
"""


def _run_options(parser: argparse.ArgumentParser, *, steps: int, warmup: int) -> None:
    """What a real run of the plan takes: processes, steps and the seed (``run`` and ``validate``)."""
    parser.add_argument("--nproc", type=int, metavar="N", help="processes to start: the plan's devices 0..N-1")
    parser.add_argument("--steps", type=int, default=steps, metavar="K", help=f"measured steps (default {steps})")
    parser.add_argument("--warmup", type=int, default=warmup, metavar="W",
                        help=f"warm-up steps left out of the times (default {warmup})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the synthetic data")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", metavar="SCENARIO", help="scenario YAML with a built-in model (preset: gpt or mlp)")
    add_scenario_options(parser)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                        help="gloo: one CPU process per device (default); nccl: one GPU per process")
    parser.add_argument("--out", metavar="DIR", help="folder for the outputs")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--timeout", type=float, default=45.0, metavar="S",
                        help="seconds any rank waits for a message or collective before it gives up (default 45)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dapple-run",
        description="Execute a scenario's plan with PyTorch (the same schedule IR the simulator replays), "
        "check it against a single-process reference, and profile layers and links for the simulator.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = sub.add_parser(
        "run", help="train a few steps of the plan on N processes",
        description="Start one process per device of the plan (torchrun), run warm-up and measured steps, and "
        "print the median iteration time, per-device peak memory and the trace path. Exit codes: 0 success, "
        "1 a rank failed (the message names it and its action) or --check found a difference, 2 bad input.",
    )
    _common(run)
    _run_options(run, steps=5, warmup=1)
    run.add_argument("--csv", metavar="FILE",
                     help="append the run to a measured-run CSV (dapple-sim calibrate's format; gpt models)")
    run.add_argument("--check", action="store_true",
                     help="compare the first step's loss and gradients with the unsplit model in one process")
    run.add_argument("--no-memory", action="store_true", help="do not count saved activations (counted in the first step only; "
                     "without them no CPU peak memory is reported)")
    run.add_argument("--fail-at", metavar="RANK:ACTION[:exit]",
                     help="testing: make RANK raise (or exit, killing itself) at ACTION of the first step, e.g. 1:1B2")
    validate = sub.add_parser(
        "validate", help="profile, simulate, run and compare: predicted against measured",
        description="Measure the links on this machine, run the plan for real on N local processes while they "
        "take turns profiling the model's layers, the optimizer step and the per-action overhead, simulate the "
        "plan on those measurements, and report iteration time, per-stage compute, per-action timing and "
        "per-device peak memory, predicted and measured, with relative errors. "
        "--out gets validation.json, validation_gantt.png (predicted over measured) and validation_memory.png.",
    )
    _common(validate)
    _run_options(validate, steps=20, warmup=2)
    validate.add_argument("--repeats", type=int, default=20,
                          help="timed runs per layer in the profile, over all its turns (default 20)")
    validate.add_argument("--slices", type=int, default=5, metavar="S",
                          help="profile and run take S turns in the same processes: the steps are run in S "
                          "slices and all ranks profile before each (default 5; at most --steps). The profile "
                          "then sees the machine as the run does, even where its speed drifts")
    validate.add_argument("--rounds", type=int, default=1, metavar="R",
                          help="repeat profile, simulation and run R times and report the round with the median "
                          "iteration-time error, with every round's numbers (default 1; use 3-5 on a machine "
                          "whose speed drifts, such as a virtual or shared host)")
    profile = sub.add_parser(
        "profile", help="measure every layer and the links; write a profile and a cluster",
        description="Time every layer's forward and backward (warm-up, then the median of repeats) and measure "
        "its output, saved-activation and parameter bytes on this device, then measure point-to-point and "
        "all-reduce latency and bandwidth between 2 processes on the backend.",
    )
    _common(profile)
    profile.add_argument("--batch-size", type=int, metavar="N", help="samples per profiled batch (default: the micro-batch size)")
    profile.add_argument("--warmup", type=int, default=3, help="untimed runs per layer (default 3)")
    profile.add_argument("--repeats", type=int, default=10, help="timed runs per layer and message size (default 10)")
    profile.add_argument("--no-links", action="store_true", help="skip the link measurement")
    return parser


# --- run ------------------------------------------------------------------------------------


def _fail_at(text: str | None) -> tuple[int, str, str] | None:
    if text is None:
        return None
    match = re.fullmatch(r"(\d+):([0-9A-Z_]+)(?::(raise|exit))?", text.strip())
    if match is None:
        raise DappleError(f"--fail-at {text!r}: write RANK:ACTION[:exit], e.g. 1:1B2")
    return int(match[1]), match[2], match[3] or "raise"


def _prepare(args: argparse.Namespace) -> None:
    from sim.input.plan_file import read_plan_file

    args.overrides = parse_overrides(args.overrides)
    args.plan_data = None if args.plan is None else read_plan_file(args.plan)
    for key in ("steps", "warmup", "nproc", "batch_size", "repeats"):
        value = getattr(args, key, None)
        if value is not None and (value < (1 if key not in ("warmup",) else 0)):
            raise DappleError(f"--{key.replace('_', '-')} {value}: must be a positive integer")
    if args.timeout <= 0:
        raise DappleError(f"--timeout {args.timeout}: must be a positive number of seconds")
    if hasattr(args, "fail_at"):
        args.fail_at = _fail_at(args.fail_at)


def _cmd_run(args: argparse.Namespace) -> int:
    from runtime.config import check_world, load_runnable
    from runtime.launch import worker_env

    _prepare(args)
    if worker_env() is not None:
        from runtime.worker import run_worker

        return run_worker(args, lambda summary: _print_run(summary, args.json))
    runnable = load_runnable(args.scenario, args.overrides, plan=args.plan_data)
    if args.nproc is None:
        raise DappleError(f"--nproc: missing; the plan uses {len(runnable.plan.devices)} devices, give --nproc "
                          f"{len(runnable.plan.devices)}")
    check_world(runnable.plan, args.nproc)
    if args.backend == "nccl":
        _check_gpus(args.nproc)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix=f"dapple-run-{runnable.scenario.name}-"))
    summary = _launch_run(args, out)
    if summary is None:
        return _report_failure(out, args.failure_code)
    _print_run(summary, args.json)
    if args.csv:
        _append_csv(args.csv, runnable, summary)
    if args.check and not summary["check_passed"]:
        print(f"dapple-run: check failed: max_abs_grad_diff {summary['max_abs_grad_diff']:.3g} "
              f"(worst {summary['worst_grad']}), loss {summary['loss']:.7g} vs {summary['reference_loss']:.7g}",
              file=sys.stderr)
        return 1
    return 0


def _append_csv(path: str, runnable, summary: dict[str, Any]) -> None:
    """Append this run as one row of ``sim.analysis.calibrate``'s measured-run CSV (header if new)."""
    import csv

    from sim.analysis.calibrate import COLUMNS

    if runnable.model.preset != "gpt":
        raise DappleError(f"--csv: the calibration CSV describes GPT models; this scenario's model is "
                          f"{runnable.model.preset!r}")
    replicas = {stage.num_replicas for stage in runnable.plan.stages}
    if len(replicas) != 1 or runnable.plan.schedule == "interleaved":
        raise DappleError("--csv: the calibration CSV needs one replica count for every stage and one stage per "
                          "device set (dp x pp); this plan has " + ("interleaved chunks" if len(replicas) == 1
                                                                    else f"replica counts {sorted(replicas)}"))
    dp = replicas.pop()
    training, values = runnable.scenario.training, runnable.model.values
    row = {"hidden": values["hidden"], "heads": values["heads"], "layers": values["layers"],
           "seq_len": values["seq_len"], "vocab": values["vocab"], "microbatch_size": training.microbatch_size // dp,
           "global_batch_size": training.global_batch_size, "tp": 1, "dp": dp, "pp": runnable.plan.num_stages,
           "recompute": int(runnable.plan.recompute), "iteration_time_s": summary["median_iteration_time_s"]}
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
    from runtime.launch import launch

    out.mkdir(parents=True, exist_ok=True)
    for stale in list(out.glob("failure-rank*.txt")) + list(out.glob("status-rank*")) + [out / "summary.json"]:
        stale.unlink(missing_ok=True)
    code = launch(args.nproc, _worker_args(args, out), log_path=out / "torchrun.log")
    if code != 0:
        args.failure_code = code
        return None
    return json.loads((out / "summary.json").read_text(encoding="utf-8"))


def _cmd_validate(args: argparse.Namespace) -> int:
    from torch.multiprocessing import ProcessRaisedException

    from runtime.config import check_world, load_runnable
    from runtime.validate_loop import combine_rounds, validate, write_report
    from sim.analysis.validation import format_report

    args.check, args.no_memory, args.fail_at = False, False, None
    _prepare(args)
    runnable = load_runnable(args.scenario, args.overrides, plan=args.plan_data)
    if args.nproc is None:
        raise DappleError(f"--nproc: missing; the plan uses {len(runnable.plan.devices)} devices, give --nproc "
                          f"{len(runnable.plan.devices)}")
    check_world(runnable.plan, args.nproc)
    if args.backend == "nccl":
        _check_gpus(args.nproc)
    out = Path(args.out) if args.out else Path("out") / f"{runnable.scenario.name}-validation"

    if args.rounds < 1:
        raise DappleError(f"--rounds: {args.rounds}; give 1 or more")

    if args.slices < 1:
        raise DappleError(f"--slices: {args.slices}; give 1 or more")
    reports = []
    try:
        for round_ in range(args.rounds):
            folder = out if args.rounds == 1 else out / f"round{round_ + 1}"
            if args.rounds > 1:
                print(f"round {round_ + 1}/{args.rounds}: profile and run, simulate", file=sys.stderr, flush=True)
            reports.append(validate(runnable, nproc=args.nproc, backend=args.backend, steps=args.steps, out=folder,
                                    warmup=args.warmup, slices=args.slices, repeats=args.repeats, seed=args.seed,
                                    timeout=args.timeout))
    except ProcessRaisedException as failed:
        print(f"dapple-run: error: the run failed: {_last_line(str(failed))}", file=sys.stderr)
        return 1
    report = reports[0] if args.rounds == 1 else combine_rounds(reports)
    paths = write_report(report, out)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(format_report(report))
        print("report: " + ", ".join(str(p) for p in paths))
    return 0


def _last_line(text: str) -> str:
    """The last non-empty line of a failed rank's traceback: its exception."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "a rank failed"


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
    import torch

    if torch.cuda.device_count() < nproc:
        raise DappleError(f"--backend nccl needs {nproc} GPUs (one per process); this machine has "
                          f"{torch.cuda.device_count()}; use --backend gloo")


def _report_failure(out: Path, code: int) -> int:
    """One line: which rank failed first and at which action, and where the others stopped.

    A rank that raised left a failure file; a rank that died (killed, crashed) left none, and
    torchrun's log gives its exit code. A death comes first: the others' errors are then
    only their lost connection to it. Among raised failures the earliest is the cause. A rank
    ended by SIGTERM is one torchrun stopped after another failed, so it is a cause only when
    nothing else failed.
    """
    from runtime.status import read_failures, read_status

    failures, status = read_failures(out), read_status(out)
    log = out / "torchrun.log"
    exits = _failed_ranks(log)
    dead = sorted(rank for rank in exits if rank not in failures)
    crashed = [rank for rank in dead if exits[rank] != str(-signal.SIGTERM)]
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


def _failed_ranks(log: Path) -> dict[int, str]:
    """Rank -> exit code of every failed worker in torchrun's failure report."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    pairs = re.findall(r"rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)", text)
    return {int(rank): exit_code for rank, exit_code in pairs}


def _bytes(value: float | None) -> str:
    return "-" if value is None else format_bytes(value)


def _print_run(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, indent=2, sort_keys=True))
        return
    times = summary["iteration_times_s"]
    print(f"{summary['name']}: {summary['schedule']}, {summary['num_stages']} stages, "
          f"{summary['num_microbatches']} micro-batches, {summary['world_size']} ranks "
          f"({summary['backend']}, {summary['device_type']})")
    print(f"iteration {format_time(summary['median_iteration_time_s'])} (median of {len(times)} steps; "
          f"min {format_time(min(times))}, max {format_time(max(times))})   "
          f"throughput {summary['throughput_samples_per_s']:.1f} samples/s   loss {summary['losses'][-1]:.5g}")
    print(f"  {'device':>6}  {'stages':<10} {'peak memory':>12} {'peak activations':>17}")
    for d in summary["devices"]:
        stages = ",".join(map(str, d["stages"]))
        print(f"  {d['device']:>6}  {stages:<10} {_bytes(d['peak_memory_bytes']):>12} "
              f"{_bytes(d['peak_activation_bytes']):>17}")
    if "max_abs_grad_diff" in summary:
        verdict = "passed" if summary["check_passed"] else "FAILED"
        print(f"check: loss {summary['loss']:.7g} vs reference {summary['reference_loss']:.7g}, "
              f"max_abs_grad_diff {summary['max_abs_grad_diff']:.3g} (max relative "
              f"{summary['max_rel_grad_diff']:.3g}): {verdict}")
    print(f"trace: {summary['trace']}")


# --- profile --------------------------------------------------------------------------------


def _cmd_profile(args: argparse.Namespace) -> int:
    from runtime.config import load_runnable
    from runtime.launch import worker_env

    _prepare(args)
    runnable = load_runnable(args.scenario, args.overrides, plan=args.plan_data)
    out = Path(args.out) if args.out else Path("out") / f"{runnable.scenario.name}-profile"
    from runtime import profile_run

    if worker_env() is not None:
        from runtime.worker import profile_worker

        return profile_worker(args, lambda measured: _print_profile(
            profile_run.finish(runnable, args, out, measured["device"], measured["links"]), args.json))
    result = profile_run.profile_here(runnable, args, out)
    _print_profile(result, args.json)
    return 0


def _print_profile(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return
    print(f"{'layer':<12} {'forward':>10} {'backward':>10} {'output':>10} {'saved':>10} {'params':>10}   "
          f"(batch of {result['batch_size']} on {result['device']['name']})")
    for layer in result["layers"]:
        print(f"{layer['name']:<12} {format_time(layer['fwd_s']):>10} {format_time(layer['bwd_s']):>10} "
              f"{format_bytes(layer['output_bytes']):>10} {format_bytes(layer['stash_bytes']):>10} "
              f"{format_bytes(layer['param_bytes']):>10}")
    links = result.get("links")
    if links:
        print(f"point-to-point ({links['backend']}): latency {format_time(links['p2p_latency_s'])}, bandwidth "
              f"{links['p2p_bandwidth_bytes_per_s'] / 1e9:.3g}GB/s; all-reduce latency "
              f"{format_time(links['allreduce_latency_s'])}")
    for key in ("profile", "profile_json", "cluster", "scenario"):
        if result.get(key):
            print(f"{key.replace('_', ' ')}: {result[key]}")


COMMANDS = {"run": _cmd_run, "profile": _cmd_profile, "validate": _cmd_validate}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    rank = os.environ.get("RANK")
    if rank not in (None, "0"):
        # under torchrun only rank 0 speaks for a bad input that every rank sees alike
        try:
            return COMMANDS[args.command](args)
        except DappleError:
            return 2
    return run_cli("dapple-run", lambda: COMMANDS[args.command](args))


if __name__ == "__main__":
    sys.exit(main())
