"""``dapple-plan``: find the fastest plan that fits, and compare it with the obvious ones.

Runs DAPPLE's planner and the baselines (PipeDream's planner, even split with GPipe, pure
data parallelism) on a scenario's model, cluster and global batch, and prints one row per
planner: its plan, the SimPy engine's iteration time, samples/s, peak memory per device and
speed-up over pure data parallelism. ``--json`` prints ``{"best": ..., "planners": {...},
"search_time_s": ...}`` with every plan in the plan-file form that ``dapple-sim simulate
--plan`` and ``dapple-run --plan`` read. ``--out DIR`` writes ``best_plan.json`` and the
Gantt and memory plots of the best plan under GPipe and under DAPPLE (an interleaved best
plan is plotted under its own schedule only: GPipe needs one chunk per device set).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from sim.cli import parse_overrides, run_cli
from sim.errors import DappleError

__all__ = ["main"]

EPILOG = """examples:
  dapple-plan scenarios/bert48_v100_2x8.yaml --out out/plan
  dapple-plan scenarios/vgg19_v100_16x1.yaml --planner dapple --json > plan.json
  dapple-sim simulate scenarios/vgg19_v100_16x1.yaml --plan plan.json
"""


def _parser() -> argparse.ArgumentParser:
    from planner.registry import DEFAULT_PLANNERS, PLANNERS

    parser = argparse.ArgumentParser(
        prog="dapple-plan",
        description="Search data x pipeline parallel plans (partition, replicas per stage, placement, "
        "micro-batching, schedule, recompute) for a scenario, and compare planners by the SimPy engine.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scenario", metavar="SCENARIO", help="scenario YAML file (its plan, if any, is ignored)")
    parser.add_argument(
        "--planner", action="append", choices=sorted(PLANNERS), metavar="NAME",
        help=f"planner to run (repeatable): {', '.join(sorted(PLANNERS))}; default: {', '.join(DEFAULT_PLANNERS)}",
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a dotted key of the scenario (repeatable)")
    parser.add_argument("--microbatch-size", type=int, action="append", metavar="N",
                        help="only try these micro-batch sizes (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--out", metavar="DIR", help="write best_plan.json and GPipe/DAPPLE plots of the best plan")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return run_cli("dapple-plan", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    from planner.registry import DEFAULT_PLANNERS, get_planner
    from planner.space import PlannerOptions
    from sim.scenario import load_scenario

    scenario = load_scenario(args.scenario, parse_overrides(args.overrides))
    options = PlannerOptions(microbatch_sizes=tuple(args.microbatch_size) if args.microbatch_size else None)
    names = args.planner or list(DEFAULT_PLANNERS)
    started = time.perf_counter()
    results = {}
    for name in names:
        with _progress(name) as tick:
            results[name] = get_planner(name)(scenario, options, progress=tick)
    report = _report(scenario, results, time.perf_counter() - started)
    if args.out:
        _write(scenario, report, results, Path(args.out))
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else _table(report))
    return 0 if report["best"] is not None else 1


class _progress:
    """A tqdm bar on stderr when it is a terminal; nothing otherwise."""

    def __init__(self, name: str) -> None:
        self.name, self.bar = name, None

    def __enter__(self):
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(desc=f"{self.name}: replays", unit="plan", leave=False)
            except ImportError:
                self.bar = None
        return (lambda: self.bar.update(1)) if self.bar is not None else None

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()


def _plan_entry(scenario, evaluation, dp_time: float | None) -> dict[str, Any]:
    from planner.space import to_scenario
    from sim.plan_json import plan_to_dict

    planned = to_scenario(scenario, evaluation.candidate)
    entry = plan_to_dict(planned.plan, planned.training)
    entry.update(
        description=evaluation.candidate.describe(),
        placement=evaluation.candidate.placement,
        iteration_time_s=evaluation.iteration_time_s,
        throughput_samples_per_s=evaluation.throughput_samples_per_s,
        peak_memory_bytes=evaluation.peak_memory_bytes,
        speedup_over_dp=(dp_time / evaluation.iteration_time_s) if dp_time else None,
    )
    return entry


def _report(scenario, results, elapsed: float) -> dict[str, Any]:
    dp = results.get("dp")
    dp_time = dp.best.iteration_time_s if dp is not None and dp.best is not None else None
    planners = {}
    for name, result in results.items():
        entry = _plan_entry(scenario, result.best, dp_time) if result.best else None
        planners[name] = {
            "plan": entry,
            "search_time_s": result.search_time_s,
            "candidates_scored": result.candidates_scored,
            "replays": len(result.evaluations),
            "rejected": sum(1 for e in result.evaluations if not e.ok),
            "note": result.note,
        }
    ranked = sorted((r.best.iteration_time_s, name) for name, r in results.items() if r.best)
    best = dict(planners[ranked[0][1]]["plan"], planner=ranked[0][1]) if ranked else None
    return {"scenario": scenario.name, "best": best, "planners": planners, "search_time_s": elapsed,
            "dp_fits": dp_time is not None}


def _table(report: dict[str, Any]) -> str:
    from sim.units import format_bytes, format_time

    lines = [f"{report['scenario']}: plans by the SimPy engine (search {report['search_time_s']:.1f} s)",
             f"  {'planner':<10} {'iteration':>10} {'samples/s':>10} {'peak mem':>10} {'vs dp':>7}  plan"]
    for name, info in report["planners"].items():
        plan = info["plan"]
        if plan is None:
            lines.append(f"  {name:<10} {'-':>10} {'-':>10} {'-':>10} {'-':>7}  {info['note']}")
            continue
        speedup = f"{plan['speedup_over_dp']:.2f}x" if plan["speedup_over_dp"] else "-"
        schedule = plan["schedule"] if isinstance(plan["schedule"], str) else json.dumps(plan["schedule"])
        lines.append(
            f"  {name:<10} {format_time(plan['iteration_time_s']):>10} {plan['throughput_samples_per_s']:>10.4g} "
            f"{format_bytes(plan['peak_memory_bytes']):>10} {speedup:>7}  {plan['description']}  "
            f"[{schedule}, micro-batch {plan['microbatch_size']} x {plan['num_microbatches']}, {plan['placement']}"
            f"{', recompute' if plan['recompute'] else ''}]"
        )
    if not report["dp_fits"] and "dp" in report["planners"]:
        lines.append("  (pure data parallelism does not fit in memory)")
    best = report["best"]
    lines.append(f"best: {best['planner']}: {best['description']}" if best else "no plan fits in memory")
    return "\n".join(lines)


def _write(scenario, report, results, out: Path) -> None:
    from dataclasses import replace

    from planner.space import to_scenario
    from sim.plots import gantt_figure, memory_figure
    from sim.report import run_scenario

    if report["best"] is None:
        raise DappleError("no plan fits in memory; nothing to write")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DappleError(f"--out {out}: cannot create the folder ({exc.strerror})") from None
    (out / "best_plan.json").write_text(json.dumps(report["best"], indent=2, sort_keys=True) + "\n")
    winner = results[report["best"]["planner"]].best.candidate
    import matplotlib.pyplot as plt

    variants = [("gpipe", "gpipe", ())] if winner.chunks == 1 else []
    if winner.schedule == "gpipe":
        variants.append(("dapple", "dapple", ()))
    else:
        variants.append(("dapple" if winner.schedule == "dapple" else winner.schedule, winner.schedule, winner.params))
    for label, schedule, params in variants:
        planned = to_scenario(scenario, replace(winner, schedule=schedule, params=params))
        result = run_scenario(planned)
        for kind, figure in (("gantt", gantt_figure), ("memory", memory_figure)):
            fig = figure(result, title=f"best plan under {label}: {result.iteration_time_s * 1e3:.1f} ms")
            fig.savefig(out / f"{kind}_{label}.png", dpi=110)
            plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
