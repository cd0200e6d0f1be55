"""``dapple-run``: run a scenario's plan for real with torch.distributed, or profile its layers.

``dapple-run run SCENARIO --nproc N`` checks the scenario and that its plan uses exactly the
devices 0..N-1 (one process per device; the global device id is the torch rank), then starts
N workers through torchrun and prints what rank 0 measured. Under torchrun
(``torchrun --nproc-per-node N -m runtime run SCENARIO``) the same command is the worker.

Exit codes: 0 success, 1 run failure (a rank failed, or ``--check`` found a difference),
2 bad input (one line on stderr, never a traceback).

This module is the command line only: the options, their checks (``_prepare``, shared by
every subcommand) and the dispatch. Each subcommand lives in its own module:
``runtime.commands.run``, ``runtime.commands.profile``, ``runtime.commands.validate``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

from runtime.commands.profile import cmd_profile
from runtime.commands.run import cmd_run, report_failure
from runtime.commands.validate import cmd_validate
from sim.core.command import (
    CommandParser,
    add_scenario_options,
    add_verbosity_options,
    configure_output,
    parse_overrides,
    run_cli,
)
from sim.core.errors import DappleError
from sim.input.plan_file import read_plan_file

__all__ = ["COMMANDS", "main"]

_report_failure = report_failure  # the name tests and older callers import from here

EPILOG = """examples:
  dapple-run run scenarios/gpt_tiny_cpu.yaml --nproc 2 --check
  dapple-run run scenarios/gpt_tiny_cpu.yaml --nproc 2 --set plan.schedule=gpipe --steps 20 --json
  dapple-run run SCENARIO --nproc 8 --backend nccl --plan plan.json --out out/run
  torchrun --nproc-per-node 2 -m runtime run scenarios/gpt_tiny_cpu.yaml --check
  dapple-run profile scenarios/gpt_tiny_cpu.yaml --out out/gpt-tiny-profile
  dapple-run validate scenarios/gpt_tiny_cpu.yaml --nproc 2 --out out/gpt-tiny-validation
  dapple-run run scenarios/gpt_tiny_cpu.yaml --nproc 4 --check --set cluster.devices_per_node=4 \\
      --set plan.tensor_parallel=2 --set "plan.stages=[{layers: [0, 3], devices: [0, 1]}, {layers: [3, 6], devices: [2, 3]}]"

A run writes summary.json, trace.json (a Chrome/Perfetto trace of the median step, laid out
as dapple-sim simulate's: open both in https://ui.perfetto.dev) and events.csv (one row per
action and device, the simulator's columns, seconds from the step's start) into --out
(default: a new temporary folder). A profile writes profile.txt (the simulator's profile format), profile.json,
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
    parser.add_argument("scenario", metavar="SCENARIO", help="scenario YAML with a built-in model (preset: gpt, llama or mlp)")
    add_scenario_options(parser)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                        help="gloo: one CPU process per device (default); nccl: one GPU per process")
    parser.add_argument("--out", metavar="DIR", help="folder for the outputs")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--timeout", type=float, default=45.0, metavar="S",
                        help="seconds any rank waits for a message or collective before it gives up (default 45)")
    add_verbosity_options(parser, subcommand=True)


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="dapple-run",
        description="Execute a scenario's plan with PyTorch (the same schedule IR the simulator replays), "
        "check it against a single-process reference, and profile layers and links for the simulator.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_verbosity_options(parser)
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
    run.add_argument("--fail-at", metavar="RANK:ACTION[:exit|term|stop]",
                     help="testing: make RANK raise at ACTION of the first step (or exit, killing itself; term: "
                          "SIGTERM to itself; stop: SIGSTOP, freezing it), e.g. 1:1B2")
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
    profile.add_argument("--no-collectives", action="store_true",
                         help="skip timing the collectives (all-reduce, all-gather, reduce-scatter, broadcast, "
                         "point-to-point over 2 and 4 ranks, FSDP2's per-call cost) the measured cluster's "
                         "intra_node.collectives key prices them from")
    return parser


# --- the arguments every subcommand shares ----------------------------------------------


def _fail_at(text: str | None) -> tuple[int, str, str] | None:
    if text is None:
        return None
    match = re.fullmatch(r"(\d+):([0-9A-Z_]+)(?::(raise|exit|term|stop))?", text.strip())
    if match is None:
        raise DappleError(f"--fail-at {text!r}: write RANK:ACTION[:exit|term|stop], e.g. 1:1B2")
    return int(match[1]), match[2], match[3] or "raise"


def _prepare(args: argparse.Namespace) -> None:
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


COMMANDS = {"run": cmd_run, "profile": cmd_profile, "validate": cmd_validate}
"""Subcommand -> its implementation (``runtime.commands.run``, ``runtime.commands.profile``,
``runtime.commands.validate``); each takes the parsed, checked arguments."""


def _dispatch(args: argparse.Namespace) -> int:
    _prepare(args)
    return COMMANDS[args.command](args)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_output("dapple-run", args)
    rank = os.environ.get("RANK")
    if rank not in (None, "0"):
        # under torchrun only rank 0 speaks for a bad input that every rank sees alike
        try:
            return _dispatch(args)
        except DappleError:
            return 2
    return run_cli("dapple-run", lambda: _dispatch(args))


if __name__ == "__main__":
    sys.exit(main())
