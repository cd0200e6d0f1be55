"""``dapple-plan``: find the fastest plan that fits, compare it with the obvious ones, and
run what-if sweeps.

Runs DAPPLE's planner and the baselines (PipeDream's planner, even split with GPipe, pure
data parallelism) on a scenario's model, cluster and global batch, and prints one row per
planner: its plan, the SimPy engine's iteration time, samples/s, peak memory per device and
speed-up over pure data parallelism. ``--json`` prints ``{"best": ..., "planners": {...},
"search_time_s": ...}`` with every plan in the plan-file form that ``dapple-sim simulate
--plan`` and ``dapple-run --plan`` read. ``--out DIR`` writes ``best_plan.json``, the
Gantt and memory plots of the best plan under GPipe and under DAPPLE (an interleaved best
plan is plotted under its own schedule only: GPipe needs one chunk per device set), both
stacked in ``schedules.png``, and the planners' bars in ``planners.png``.

``dapple-plan sweep SWEEP.yaml --out DIR [--dask local|ADDRESS] [--workers N]`` runs a
what-if study (``planner.sweep``): every point of the sweep file, on a local process pool
or a Dask cluster, into ``DIR/results.csv`` and ``DIR/results.parquet``; a rerun skips the
points already there. Exit code 1 when some point failed (its ``error`` says why).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from sim.command import add_scenario_options, parse_overrides, run_cli
from sim.errors import DappleError

__all__ = ["main"]

EPILOG = """examples:
  dapple-plan scenarios/bert48_v100_2x8.yaml --out out/plan
  dapple-plan scenarios/vgg19_v100_16x1.yaml --planner dapple --json > plan.json
  dapple-sim simulate scenarios/vgg19_v100_16x1.yaml --plan plan.json
  dapple-plan sweep sweeps/bert48_bandwidth.yaml --out out/bandwidth     (what-if study; see sweep --help)
"""

SWEEP_EPILOG = """examples:
  dapple-plan sweep sweeps/bert48_bandwidth.yaml --out out/bandwidth
  dapple-plan sweep sweeps/bert48_bandwidth.yaml --out out/bandwidth --dask local --workers 2
  dapple-plan sweep sweeps/bert48_bandwidth.yaml --out out/bandwidth --dask tcp://scheduler:8786

a sweep file:
  base: ../scenarios/bert48_v100_2x8.yaml   # relative to the sweep file
  mode: simulate                            # or plan (planner: dapple, options: {...})
  axes:                                     # dotted scenario keys; the product is swept
    cluster.inter_node.bandwidth: [10Gb/s, 25Gb/s, 100Gb/s]
    plan.schedule: [gpipe, dapple]
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
    add_scenario_options(parser, example="training.global_batch_size=256", plan=False)
    parser.add_argument("--microbatch-size", type=int, action="append", metavar="N",
                        help="only try these micro-batch sizes (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--out", metavar="DIR", help="write best_plan.json and GPipe/DAPPLE plots of the best plan")
    return parser


def _sweep_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dapple-plan sweep",
        description="Run a what-if study: simulate or plan every point of SWEEP.yaml (a base scenario and the "
        "keys to vary) and save one row per point in DIR/results.csv and DIR/results.parquet. Points already "
        "in DIR are skipped; a point that fails records its error and the sweep goes on.",
        epilog=SWEEP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("sweep", metavar="SWEEP.yaml", help="sweep file")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder of the results table (and plots)")
    parser.add_argument("--dask", metavar="local|ADDRESS",
                        help="run on Dask: 'local' starts a LocalCluster, or give a scheduler address tcp://host:port")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="worker processes (default min(CPUs, 4); 1 runs in this process)")
    parser.add_argument("--json", action="store_true", help="print counts and files as JSON instead of the table")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sweep"]:
        sweep_args = _sweep_parser().parse_args(argv[1:])
        return run_cli("dapple-plan", lambda: _run_sweep(sweep_args))
    args = _parser().parse_args(argv)
    return run_cli("dapple-plan", lambda: _run(args))


def _run_sweep(args: argparse.Namespace) -> int:
    from planner.sweep import load_sweep, run_sweep, write_plots

    sweep = load_sweep(args.sweep)
    result = run_sweep(sweep, args.out, workers=args.workers, dask=args.dask)
    files = list(result.files) + write_plots(sweep, result.table, args.out)
    table = result.table
    failed = int(table["error"].notna().sum())
    counts = {
        "sweep": sweep.name, "points": len(sweep.points), "run": result.points_run,
        "skipped": result.points_skipped, "failed": failed, "oom": int(table["oom"].fillna(False).astype(bool).sum()),
        "wall_s": result.wall_s, "files": [str(f) for f in files],
    }
    if args.json:
        print(json.dumps(counts, indent=2, sort_keys=True))
    else:
        print(_sweep_table(sweep, table, counts))
    return 1 if failed else 0


def _sweep_table(sweep, table, counts: dict[str, Any], limit: int = 40) -> str:
    from sim.units import format_bytes, format_time

    def show(value, fmt) -> str:
        return "-" if value is None or value != value else fmt(value)

    lines = [f"{counts['sweep']}: {counts['points']} points ({counts['run']} run, {counts['skipped']} already done) "
             f"in {counts['wall_s']:.1f} s; {counts['oom']} out of memory, {counts['failed']} failed"]
    shown = table.head(limit).astype(object).where(table.head(limit).notna(), None)
    columns = list(sweep.axis_keys)
    widths = {c: max([len(c)] + [len(str(v)) for v in shown[c]]) for c in columns}
    lines.append("  " + "  ".join(f"{c:<{widths[c]}}" for c in columns)
                 + f"  {'iteration':>10} {'samples/s':>10} {'peak mem':>10}  result")
    for _, row in shown.iterrows():
        if row["error"] is not None:
            outcome = f"error: {row['error'][:100]}"
        else:
            outcome = "OUT OF MEMORY" if row["oom"] else "ok"
            if sweep.mode == "plan":
                outcome += f"  {row['plan_description'] or row['planner_note'] or ''}"
        lines.append(
            "  " + "  ".join(f"{str(row[c]):<{widths[c]}}" for c in columns)
            + f"  {show(row['iteration_time_s'], format_time):>10}"
            f" {show(row['throughput_samples_per_s'], '{:.4g}'.format):>10}"
            f" {show(row['peak_memory_bytes'], format_bytes):>10}  {outcome}"
        )
    if len(table) > limit:
        lines.append(f"  ... {len(table) - limit} more rows")
    lines.append("wrote " + ", ".join(counts["files"]))
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    from planner.registry import DEFAULT_PLANNERS, get_planner
    from planner.space import PlannerOptions
    from sim.input.scenario import load_scenario

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


def _report(scenario, results, elapsed: float) -> dict[str, Any]:
    from planner.evaluation import count_rejections, evaluation_row

    dp = results.get("dp")
    dp_time = dp.best.iteration_time_s if dp is not None and dp.best is not None else None
    planners = {}
    for name, result in results.items():
        entry = None
        if result.best is not None:
            entry = evaluation_row(result.best)
            entry["speedup_over_dp"] = dp_time / result.best.iteration_time_s if dp_time else None
        planners[name] = {
            "plan": entry,
            "search_time_s": result.search_time_s,
            "candidates_scored": result.candidates_scored,
            "replays": len(result.evaluations),
            "rejected": sum(1 for e in result.evaluations if not e.ok),
            "rejected_by_kind": count_rejections(result.evaluations),
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
    from sim.plots.tables import planner_comparison_figure
    from sim.plots.timeline import gantt_figure, memory_figure, schedule_comparison_figure
    from sim.engine.run import run_scenario

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
    replays = {}
    for label, schedule, params in variants:
        planned = to_scenario(scenario, replace(winner, schedule=schedule, params=params))
        result = replays[label] = run_scenario(planned)
        for kind, figure in (("gantt", gantt_figure), ("memory", memory_figure)):
            fig = figure(result, title=f"best plan under {label}: {result.iteration_time_s * 1e3:.1f} ms")
            fig.savefig(out / f"{kind}_{label}.png", dpi=110)
            plt.close(fig)
    for name, fig in (("schedules.png", schedule_comparison_figure(replays, title=f"{scenario.name}: best plan "
                                                                   f"({report['best']['description']})")),
                      ("planners.png", planner_comparison_figure(report))):
        fig.savefig(out / name, dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
