"""``dapple-plan``: find the fastest plan that fits, compare it with the obvious ones, and
run what-if sweeps.

Runs DAPPLE's planner over the 4D space (``planner.planners.dapple``: tensor, context, pipeline and
data parallelism, sharding, recompute, schedule, placement) and the baselines (Megatron's
uniform grid, PipeDream's planner, even split with GPipe, pure data parallelism) on a
scenario's model, cluster and global batch, and prints one row per planner: the SimPy
engine's iteration time, samples/s, tokens/s and MFU (None for a measured profile), peak
memory per device, speed-up over pure data parallelism, and the plan in one short line
(``planner.search.describe``), wrapped at its separators within 120 columns; a planner whose
plan file equals an earlier one's says ``same plan as <planner>``. Under the table each
planner's spend in work (``planner.search.budget``; ``-v`` logs it too); then the winner, who
else found its plan, its margin over the next *different* plan, and its line. ``--json`` prints the
``planner.search.report.PlannerReport``: ``{"best": ..., "best_metrics": ..., "planners": {...},
"search_time_s": ...}``, every plan in the plan-file form that ``dapple-sim simulate --plan``
and ``dapple-run --plan`` read, its metrics beside it. ``--out DIR`` writes ``best_plan.json``
(the plan alone), ``best_plan_metrics.json`` (its planner, description and metrics), the
Gantt and memory plots of the best plan under GPipe's all-forwards-first order (LoopedBFS
for an interleaved plan) and under its own schedule, both stacked in ``schedules.png``, and the planners' bars in ``planners.png``.

``dapple-plan sweep SWEEP.yaml --out DIR [--dask local|ADDRESS] [--workers N]`` runs a
what-if study (``planner.sweeps.run``): every point of the sweep file, on a local process pool
or a Dask cluster, into ``DIR/results.csv`` and ``DIR/results.parquet``; a rerun skips the
points already there. Exit code 1 when some point failed (its ``error`` says why).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from planner.objective_command import add_objective_options, run_objective
from planner.planners.registry import DEFAULT_PLANNERS, PLANNERS, get_planner
from planner.search.context import SearchContext
from planner.search.describe import wrap_summary
from planner.search.layouts import layouts
from planner.search.report import PlannerReport, build_report, spend_text
from planner.search.space import PlannerOptions, to_scenario
from planner.sweeps.command import run_sweep_command, sweep_parser
from sim.core import jsonio
from sim.core.command import (
    CommandParser,
    Stopwatch,
    add_scenario_options,
    add_verbosity_options,
    configure_output,
    parse_overrides,
    progress,
    run_cli,
)
from sim.core.errors import DappleError
from sim.core.units import format_bytes, format_time
from sim.core.userfiles import open_output
from sim.engine.run import run_scenario
from sim.input.plan_file import schedule_text
from sim.input.scenario import load_scenario
from sim.models.vocab import vocab_padding
from sim.report.plots.style import format_duration, pyplot
from sim.report.plots.tables import planner_comparison_figure
from sim.report.plots.timeline import gantt_figure, memory_figure, schedule_comparison_figure

__all__ = ["main"]

USAGE = """dapple-plan [-h] [-v | -q] SCENARIO [--planner NAME]... [--json] [--out DIR] [--set KEY=VALUE]...
                   [--microbatch-size N]... [--expert-parallel N]... [--max-candidates N] [--max-partials N]
                   [--max-replays N] [--objective time|cost|energy [--deadline TIME] [--budget AMOUNT] [--max-gpus N]]
       dapple-plan sweep SWEEP.yaml [-h] --out DIR [--dask local|ADDRESS] [--workers N] [--json] [-v | -q]"""

EPILOG = """commands:
  SCENARIO              plan one scenario: every planner, one row each (this page)
  sweep SWEEP.yaml      a what-if study: every point of a sweep file into one table
                        (dapple-plan sweep --help)

examples:
  dapple-plan scenarios/bert48_v100_2x8.yaml --out out/plan
  dapple-plan scenarios/vgg19_v100_16x1.yaml --planner dapple --json > plan.json
  dapple-sim simulate scenarios/vgg19_v100_16x1.yaml --plan plan.json
  dapple-plan sweep sweeps/bert48_bandwidth.yaml --out out/bandwidth     (what-if study; see sweep --help)
  dapple-plan scenarios/llama3_70b_h100_fsdp.yaml --set training.tokens=15T --set cluster.nodes=64 \
      --objective cost --deadline 30d          (how many GPUs: plan 8 to 512 H100, cheapest within 30 days)
"""

def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="dapple-plan",
        usage=USAGE,
        description="Search 4D parallel plans (tensor and context degree, partition, replicas per stage, "
        "placement, micro-batching, schedule, sharding, recompute) for a scenario, and compare planners by the "
        "SimPy engine. The scenario's plan and micro-batch size are ignored: the planners choose them.",
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
    parser.add_argument("--expert-parallel", type=int, action="append", metavar="N",
                        help="only try these expert-parallel degrees on a model with experts (repeatable); "
                             "default: every divisor of the expert count inside a server")
    budget = parser.add_argument_group("work budgets (counts of work, never seconds: the same answer on any machine)")
    for flag, field, what in _BUDGETS:
        budget.add_argument(flag, type=int, metavar="N", dest=field,
                            help=f"{what} (default {getattr(PlannerOptions(), field):,})")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--out", metavar="DIR", help="write best_plan.json, best_plan_metrics.json and GPipe/DAPPLE plots of the best plan")
    add_objective_options(parser)
    add_verbosity_options(parser)
    return parser


_BUDGETS = (("--max-candidates", "max_candidates", "complete candidates a planner scores with the closed forms"),
            ("--max-partials", "max_partials", "partial plans a planner's dynamic programme extends"),
            ("--max-replays", "fast_max", "candidates a planner replays on the fast path"))
"""(flag, PlannerOptions field, help) of the budgets a user may raise or lower."""

_VERBOSITY = ("-v", "--verbose", "-q", "--quiet")

METRICS_FILE = "best_plan_metrics.json"
"""Beside ``best_plan.json`` (the plan alone): the best plan's planner, description and metrics."""

DPI = 100
"""Resolution of the written plots: 12-inch-wide charts, 1200 pixels across."""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # ``dapple-plan [-v|-q] sweep ...``: the verbosity flags may come before the word
    lead = next((i for i, word in enumerate(argv) if word not in _VERBOSITY), len(argv))
    if argv[lead:lead + 1] == ["sweep"]:
        sweep_args = sweep_parser().parse_args(argv[:lead] + argv[lead + 1:])
        configure_output("dapple-plan", sweep_args)
        return run_cli("dapple-plan", lambda: run_sweep_command(sweep_args))
    args = _parser().parse_args(argv)
    configure_output("dapple-plan", args)
    return run_cli("dapple-plan", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario, parse_overrides(args.overrides), ignore_plan=True)
    bad = [size for size in args.microbatch_size or () if size < 1]
    if bad:
        raise DappleError(f"--microbatch-size {bad[0]}: give a positive number of samples per micro-batch")
    budgets = {field: getattr(args, field) for _, field, _ in _BUDGETS if getattr(args, field) is not None}
    for flag, field, _ in _BUDGETS:
        if budgets.get(field, 1) < 1:
            raise DappleError(f"{flag} {budgets[field]}: give a positive count")
    options = PlannerOptions(microbatch_sizes=tuple(args.microbatch_size) if args.microbatch_size else None,
                             expert_parallel=tuple(args.expert_parallel) if args.expert_parallel else None, **budgets)
    layouts(scenario, options)  # an expert-parallel degree the model or cluster cannot take: refused before any search
    names = args.planner or list(DEFAULT_PLANNERS)
    if args.objective is not None:
        return run_objective(args, scenario, options, names)
    if args.deadline or args.budget or args.max_gpus:
        raise DappleError("--deadline, --budget and --max-gpus go with --objective time|cost|energy")
    watch = Stopwatch()
    started = time.perf_counter()
    results = {}
    context = SearchContext(scenario)  # the planners share tables and replays; DAPPLE's runs the baselines
    try:
        for name in names:
            with watch.phase(f"plan with {name}"), progress(f"{name}: replays", unit="plan") as tick:
                results[name] = context.run(name, get_planner(name), options, progress=tick)
    finally:
        context.close()
    report = build_report(scenario.name, results, time.perf_counter() - started,
                          scenario_plan_ignored=scenario.ignored_plan, cluster_devices=scenario.cluster.num_devices)
    data = report.to_json()  # the edge: JSON made once, printed, written and drawn
    best = results[report.best_planner].best.candidate if report.best is not None else None
    padding = vocab_padding(scenario.model, best.tensor_parallel) if best is not None else None
    data["vocab_padding"] = padding.to_json() if padding is not None and padding.is_padded else None
    if args.out:
        _write(scenario, report, data, results, Path(args.out), watch)
    watch.report()
    padded = f"\nthe best plan's {padding.text()}" if padding is not None and padding.is_padded else ""
    print(jsonio.dumps(data, indent=2, sort_keys=True) if args.json else _table(report) + padded)
    return 0 if report.best is not None else 1


WIDTH = 120
"""Columns the planners' table keeps within: a plan's short line wraps before a ``·``, ``×`` or
parenthesis (``planner.search.describe.wrap_summary``) rather than run past it."""

SMALL_MARGIN = 1.10
"""Below this ratio of iteration times the closing line says the margin in percent (``1.8%
faster``), from it as a ratio (``1.39x faster``)."""


def _table(report: PlannerReport) -> str:
    ignored = "; the scenario's own plan is ignored" if report.scenario_plan_ignored else ""
    width = max([7] + [len(e.planner) for e in report.planners])
    head = (f"  {'planner':<{width}} {'iteration':>9} {'samples/s':>9} {'tokens/s':>8} {'MFU':>5} {'peak mem':>9} "
            f"{'vs dp':>6}  ")
    indent = len(head)
    lines = [f"{report.scenario}: plans by the SimPy engine (search {report.search_time_s:.1f} s{ignored})",
             head + "plan"]
    for entry in report.planners:
        name, row = entry.planner, entry.row
        if row is None:
            lines.append(f"  {name:<{width}} {'-':>9} {'-':>9} {'-':>8} {'-':>5} {'-':>9} {'-':>6}  {entry.note}")
            continue
        metrics = row.metrics
        speedup = f"{metrics.speedup_over_dp:.2f}x" if metrics.speedup_over_dp else "-"
        mfu = "-" if metrics.mfu is None else f"{metrics.mfu:.0%}"
        cells = (f"  {name:<{width}} {format_time(metrics.iteration_time_s):>9} "
                 f"{_rate(metrics.throughput_samples_per_s):>9} {_rate(metrics.tokens_per_s):>8} {mfu:>5} "
                 f"{format_bytes(metrics.peak_memory_bytes):>9} {speedup:>6}  ")
        plan = f"same plan as {entry.same_plan_as}" if entry.same_plan_as else metrics.summary
        wrapped = wrap_summary(plan, WIDTH - indent)
        lines += [cells + wrapped[0]] + [" " * indent + more for more in wrapped[1:]]
        if entry.note:  # a plan on a subset of the devices, against the best on all of them
            lines += [" " * indent + more for more in wrap_summary(entry.note, WIDTH - indent)]
    if not report.dp_fits and any(e.planner == "dp" for e in report.planners):
        lines.append("  (pure data parallelism does not fit in memory)")
    for k, entry in enumerate(e for e in report.planners if e.spend):
        lead = f"{'spend:' if k == 0 else '':<7}{entry.planner:<{width}} "
        wrapped = wrap_summary(spend_text(entry.spend), WIDTH - len(lead))
        lines += [lead + wrapped[0]] + [" " * len(lead) + more for more in wrapped[1:]]
    lines += _closing(report)
    return "\n".join(lines)


def _closing(report: PlannerReport) -> list[str]:
    """``best: dapple (also found by megatron); 1.39x faster than even, the next different
    plan``, and the best plan's short line under it; never a margin over the same plan."""
    best = report.best
    if best is None:
        return ["no plan fits in memory"]
    same = [e.planner for e in report.planners if e.row is not None and e.planner != report.best_planner
            and e.row.plan == best.plan]
    others = sorted((e.row.metrics.iteration_time_s, e.planner) for e in report.planners
                    if e.row is not None and e.row.plan != best.plan)
    line = f"best: {report.best_planner}" + (f" (also found by {', '.join(same)})" if same else "")
    if others:
        line += f"; {_margin(others[0][0], best.metrics.iteration_time_s)} {others[0][1]}, the next different plan"
    return [line] + ["  " + text for text in wrap_summary(best.metrics.summary, WIDTH - 2)]


def _margin(other_s: float, best_s: float) -> str:
    """How much faster ``best_s`` is than ``other_s``: ``1.39x faster than``, ``1.8% faster than``
    (below ``SMALL_MARGIN``), ``as fast as``."""
    ratio = other_s / best_s if best_s > 0 else float("inf")
    if ratio >= SMALL_MARGIN:
        return f"{ratio:.2f}x faster than"
    percent = (ratio - 1.0) * 100.0
    if percent <= 0.0:
        return "as fast as"
    return f"{percent:.1f}% faster than" if percent >= 0.1 else f"{percent:.2g}% faster than"


def _rate(value: float | None) -> str:
    """A per-second count in at most 6 characters: ``87.91``, ``5,707``, ``87.9k``, ``1.68M``; ``-`` when unknown."""
    if value is None:
        return "-"
    if value < 1e4:
        return f"{value:.4g}" if value < 1e3 else f"{value:,.0f}"
    return f"{value / 1e3:.3g}k" if value < 999.5e3 else f"{value / 1e6:.3g}M"  # never 1e+03k


def _write(scenario, report: PlannerReport, data: dict[str, Any], results, out: Path,
           watch: Stopwatch | None = None) -> None:
    """Write the best plan (``best_plan.json``, the plan alone), its metrics beside it
    (``best_plan_metrics.json``) and the plots into ``out``; ``data`` is ``report.to_json()``."""
    if report.best is None:
        raise DappleError("no plan fits in memory; nothing to write")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DappleError(f"--out {out}: cannot create the folder ({exc.strerror})") from None
    jsonio.write_json(out / "best_plan.json", data["best"], what="plan file", indent=2, sort_keys=True)
    jsonio.write_json(out / METRICS_FILE, data["best_metrics"], what="plan metrics file", indent=2, sort_keys=True)
    winner = results[report.best_planner].best.candidate
    watch = watch or Stopwatch()
    with watch.phase("load matplotlib"):
        plt = pyplot()

    # GPipe's all-forwards-first order beside the winner's own; over looped chunks that order is
    # torch's ScheduleLoopedBFS (Lamy-Poirier 2022, "Breadth-First Pipeline Parallelism")
    variants = [("gpipe", "gpipe", ())] if winner.chunks == 1 else [("looped-bfs", "looped-bfs", ())]
    if winner.schedule == "gpipe":
        variants.append(("dapple", "dapple", ()))
    elif winner.schedule == "looped-bfs":  # the all-forwards-first order itself: beside it, interleaved 1F1B
        variants.append(("interleaved", "interleaved", ()))
    else:
        variants.append(("dapple" if winner.schedule == "dapple" else winner.schedule, winner.schedule, winner.params))
    names = {label: schedule_text({"name": schedule, **dict(params)} if params else schedule)
             for label, schedule, params in variants}
    replays = {}
    files = [f"{kind}_{label}.png" for label, *_ in variants for kind in ("gantt", "memory")]
    with progress("writing plots", total=len(variants) + len(files) + 2, unit="step") as tick:
        step = tick or (lambda n=1, desc=None: None)
        for label, schedule, params in variants:
            step(0, desc=f"replaying the best plan under {label}")
            with watch.phase(f"replay the best plan under {label}", into="replay the best plan's schedules"):
                planned = to_scenario(scenario, replace(winner, schedule=schedule, params=params))
                result = replays[label] = run_scenario(planned)
            step(1)
            s = result.summarize()
            for kind, figure in (("gantt", gantt_figure), ("memory", memory_figure)):
                step(0, desc=f"drawing {kind}_{label}.png")
                with watch.phase(f"draw {kind}_{label}.png", into="draw the plots"):
                    title = (f"best plan under {names[label]}: {format_duration(result.iteration_time_s)} per iteration, "
                             f"bubble {s.bubble_fraction:.1%}, {s.num_microbatches} micro-batches")
                    _save(figure(result, title=title), out / f"{kind}_{label}.png", plt)
                step(1)
        for name, draw in (("schedules.png", lambda: schedule_comparison_figure(
                               {names[label]: result for label, result in replays.items()},
                               title=f"{scenario.name}: best plan ({report.best.metrics.description})")),
                           ("planners.png", lambda: planner_comparison_figure(data))):
            step(0, desc=f"drawing {name}")
            with watch.phase(f"draw {name}", into="draw the plots"):
                _save(draw(), out / name, plt)
            step(1)


def _save(fig, path: Path, plt) -> None:
    """Save a figure through ``sim.core.userfiles.open_output`` (a folder, device or FIFO there is one line)."""
    try:
        with open_output(path, "plot", binary=True) as handle:
            fig.savefig(handle, dpi=DPI, format="png")
    finally:
        plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
