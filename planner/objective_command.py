"""``dapple-plan SCENARIO --objective time | cost | energy``: choose the cluster size and its plan.

The scenario gives the model, the run length (``training.tokens`` or ``steps``), the server
kind and the largest size (or ``--max-gpus``); ``planner.search.capacity`` plans each size of
the ladder and picks one. Printed: one row per size (GPUs, the best plan in one line, days
without and with failures, GPU-hours, cost, MWh, goodput), then one line naming the choice
and why. ``--json`` prints ``CapacityChoice.to_json()``; ``--out DIR`` writes the chosen size's
``best_plan.json`` and ``best_plan_metrics.json`` (run it with ``--set cluster.nodes=N``) and
``capacity.json``. Exit code 2 when no size meets the deadline and budget (the reason on stdout).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from planner.search.capacity import CapacityChoice, SizeRow, amount, choose, plan_sizes, size_ladder
from planner.search.describe import wrap_summary
from planner.search.evaluation import evaluation_row
from planner.search.space import PlannerOptions
from sim.core import jsonio
from sim.core.command import progress
from sim.core.errors import DappleError
from sim.core.units import parse_count, parse_time
from sim.input.scenario import Scenario

__all__ = ["INFEASIBLE", "add_objective_options", "run_objective"]

INFEASIBLE = 2
"""Exit code when no size meets ``--deadline`` and ``--budget`` (as for a user's mistake)."""

WIDTH = 120
"""Columns of the table; a plan's line wraps within them."""


def add_objective_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "capacity (choose the cluster size too; needs training.tokens or training.steps; docs/capacity.md)")
    group.add_argument("--objective", choices=("time", "cost", "energy"),
                       help="plan every size of a ladder of whole servers up to the scenario's cluster and pick: "
                       "time = fewest expected days within --budget; cost = cheapest (GPU-hours without a price) "
                       "within --deadline; energy = least energy within --deadline")
    group.add_argument("--deadline", metavar="TIME", help="most expected wall time, with failures (30d, 720h)")
    group.add_argument("--budget", metavar="AMOUNT", help="most cost, in cluster.price_per_gpu_hour's currency "
                       "(1.5M, 250k)")
    group.add_argument("--max-gpus", type=int, metavar="N", help="the largest size to try (default: the cluster's)")


def run_objective(args: argparse.Namespace, scenario: Scenario, options: PlannerOptions, names: list[str]) -> int:
    deadline = None if args.deadline is None else parse_time(args.deadline)
    budget = None if args.budget is None else parse_count(args.budget)
    sizes = size_ladder(scenario, args.max_gpus)
    with progress("cluster sizes", total=len(sizes), unit="size") as tick:
        rows = plan_sizes(scenario, sizes, names, options, tick)
    choice = choose(rows, args.objective, deadline_s=deadline, budget=budget)
    data = choice.to_json()
    if args.out and choice.chosen is not None:
        _write(choice, Path(args.out), data)
    print(jsonio.dumps(data, indent=2, sort_keys=True) if args.json else table(scenario, choice))
    return 0 if choice.chosen is not None else INFEASIBLE


def table(scenario: Scenario, choice: CapacityChoice) -> str:
    """The sizes' table and the closing line (the module docstring)."""
    head = (f"  {'GPUs':>7} {'days':>7} {'exp days':>8} {'GPU-hours':>9} {'cost':>7} {'MWh':>7} "
            f"{'goodput':>7}  ")
    lines = [f"{scenario.name}: cluster size for the {choice.objective} objective, "
             f"{scenario.training.steps:,} steps", head + "plan"]
    for row in choice.rows:
        lines += _row(row, len(head))
    mark = "" if choice.chosen is None else f" (rerun with --set cluster.nodes={choice.chosen.nodes})"
    return "\n".join(lines + [("chosen: " if choice.chosen else "") + choice.reason + mark])


def _row(row: SizeRow, indent: int) -> list[str]:
    if row.totals is None:
        return [f"  {row.devices:>7,} {'-':>7} {'-':>8} {'-':>9} {'-':>7} {'-':>7} {'-':>7}  no plan fits in memory"]
    run, free = row.estimate, row.estimate.failure_free
    expected = "-" if run.expected is None else f"{run.expected.days:.3g}"
    cost = "-" if row.totals.cost is None else amount(row.totals.cost)
    mwh = "-" if row.totals.energy_kwh is None else f"{row.totals.energy_kwh / 1e3:.4g}"
    good = "-" if run.goodput is None else f"{run.goodput.goodput:.1%}"
    cells = (f"  {row.devices:>7,} {free.days:>7.3g} {expected:>8} {amount(row.totals.gpu_hours):>9} {cost:>7} "
             f"{mwh:>7} {good:>7}  ")
    wrapped = wrap_summary(evaluation_row(row.best, cluster_devices=row.devices).metrics.summary, WIDTH - indent)
    return [cells + wrapped[0]] + [" " * indent + more for more in wrapped[1:]]


def _write(choice: CapacityChoice, out: Path, data: dict) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DappleError(f"--out {out}: cannot create the folder ({exc.strerror})") from None
    row = evaluation_row(choice.chosen.best, cluster_devices=choice.chosen.devices)
    jsonio.write_json(out / "best_plan.json", row.plan, what="plan file", indent=2, sort_keys=True)
    jsonio.write_json(out / "best_plan_metrics.json", {"planner": choice.chosen.planner, **row.metrics.to_json(),
                                                       "devices": choice.chosen.devices},
                      what="plan metrics file", indent=2, sort_keys=True)
    jsonio.write_json(out / "capacity.json", data, what="capacity file", indent=2, sort_keys=True)
