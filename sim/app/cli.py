"""``dapple-sim``: check and simulate scenarios, print schedules.

Exit codes: 0 success, 1 run failure, 2 bad input; ``simulate --fail-on-oom``: 3 when the plan
runs out of memory (by default a plan that does not fit is a result, exit 0). A user's mistake prints one line on
stderr (plus, for a broken schedule, the rank × step grid) and never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from sim.app.check import describe, format_description
from sim.app.compare import (
    DEFAULT_SCHEDULES,
    MAX_STAGE_MICROBATCHES,
    check_work,
    format_rows,
    parse_schedules,
    plan_variants,
    run_variants,
)
from sim.app.published import DEFAULT_SUITE, format_results, read_suite, run_suite, suite_json
from sim.app.published import write_outputs as write_suite_outputs
from sim.app.report import format_summary, write_outputs
from sim.app.schedule_command import policy_arg, schedule_command
from sim.core import jsonio
from sim.core.command import (
    CommandParser,
    Stopwatch,
    add_scenario_options,
    add_verbosity_options,
    configure_output,
    parse_overrides,
    positive_int,
    progress,
    quiet,
    run_cli,
)
from sim.core.errors import DappleError
from sim.core.units import format_bytes
from sim.cost.capacity import estimate_run
from sim.engine.run import run_scenario
from sim.input.plan_file import read_plan_file
from sim.input.scenario import Scenario, load_scenario
from sim.models.vocab import vocab_padding
from sim.report.analysis.calibrate import calibrate, params_yaml, read_runs, score_runs
from sim.report.plots.style import pyplot
from sim.report.plots.timeline import schedule_comparison_figure
from sim.schedule.generators import DAPPLE_POLICIES, GENERATORS

__all__ = ["main"]

EPILOG = """examples:
  dapple-sim simulate scenarios/bert48_v100_2x8.yaml --out out/bert48
  dapple-sim simulate scenarios/bert48_v100_2x8.yaml --set plan.schedule=gpipe --json
  dapple-sim check scenarios/bert48_v100_2x8.yaml
  dapple-sim compare scenarios/bert48_v100_2x8.yaml --schedules gpipe,dapple,zb-v --out out/compare
  dapple-sim check scenarios/bert48_v100_2x8.yaml --set training.microbatch_size=32 --json
  dapple-sim published --out out/published
  dapple-sim schedule dapple --stages 4 --microbatches 8
  dapple-sim schedule interleaved --stages 2 --microbatches 4 --chunks 2 --lower
"""


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="dapple-sim",
        description="Predict how a pipelined data-parallel training plan runs on a GPU cluster.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_verbosity_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in (*_replay_commands(sub), *_study_commands(sub)):
        add_verbosity_options(command, subcommand=True)
    return parser


def _replay_commands(sub) -> tuple[argparse.ArgumentParser, ...]:
    """``check``, ``simulate`` and ``compare``: the commands that read a scenario and its plan."""
    check = sub.add_parser(
        "check",
        help="check a scenario file and describe it",
        description="Check SCENARIO strictly and describe it: layers, devices, stages, micro-batches and "
        "memory per device at rest. A malformed file is rejected with one line naming the key (exit 2).",
    )
    check.add_argument("scenario", metavar="SCENARIO", help="scenario YAML file")
    add_scenario_options(check, example="training.microbatch_size=4")
    check.add_argument("--json", action="store_true", help="print the description as JSON")

    simulate = sub.add_parser(
        "simulate",
        help="replay a scenario's plan and predict time and memory",
        description="Replay SCENARIO's plan on the modelled cluster (SimPy engine: devices, ports with "
        "contention, all-reduce, memory) and print the iteration time, throughput, bubbles and per-device "
        "peak memory. With --out, also write summary.json, trace.json (open in ui.perfetto.dev), "
        "events.csv, gantt.png and memory.png.",
    )
    simulate.add_argument("scenario", metavar="SCENARIO", help="scenario YAML file with a plan")
    add_scenario_options(simulate)
    simulate.add_argument("--json", action="store_true", help="print the summary as JSON")
    simulate.add_argument("--out", metavar="DIR", help="write summary, trace, events and plots into DIR")
    simulate.add_argument(
        "--engine", choices=("simpy", "fast"), default="simpy",
        help="simpy: discrete-event engine with link contention (default); fast: contention-free replay",
    )
    simulate.add_argument("--no-contention", action="store_true", help="SimPy engine without link contention")
    simulate.add_argument(
        "--no-symmetry", action="store_true",
        help="replay every device separately instead of one per class of identical devices (slower, same result)",
    )
    simulate.add_argument("--trace-all", action="store_true", help="trace every device even in large clusters")
    simulate.add_argument(
        "--fail-on-oom", action="store_true",
        help="exit 3 when the replay runs out of memory (by default a plan that does not fit is a result: exit 0)",
    )

    compare = sub.add_parser(
        "compare",
        help="replay a scenario's plan under several schedules, side by side",
        description="Replay SCENARIO's plan under each schedule in --schedules, its stages laid out the way each "
        "schedule expects (one per device set; two per device set looped for interleaved; a V for zb-v and "
        "dualpipe-v), and print one row per schedule: iteration time, bubble, peak memory of the largest device "
        "and OOM. A schedule that cannot run the plan gets a row saying why. With --out, also write "
        "schedules.png (stacked Gantt and memory charts) and compare.json. A comparison replays at most "
        f"{MAX_STAGE_MICROBATCHES:,} stage × micro-batch pairs in all (stages times micro-batches, summed over "
        "the schedules), checked before any replay: more is refused (exit 2) unless --max-stage-microbatches "
        "raises the limit.",
    )
    compare.add_argument("scenario", metavar="SCENARIO", help="scenario YAML file with a plan")

    compare.add_argument("--schedules", default=",".join(DEFAULT_SCHEDULES), metavar="A,B,...",
                         help=f"schedules to compare, separated by commas (default {','.join(DEFAULT_SCHEDULES)})")
    add_scenario_options(compare)
    compare.add_argument("--engine", choices=("simpy", "fast"), default="simpy",
                         help="simpy: discrete-event engine with link contention (default); fast: contention-free")
    compare.add_argument("--no-contention", action="store_true", help="SimPy engine without link contention")
    compare.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    compare.add_argument("--out", metavar="DIR", help="write schedules.png and compare.json into DIR")
    compare.add_argument("--max-stage-microbatches", type=positive_int, default=MAX_STAGE_MICROBATCHES, metavar="N",
                         help=f"replay at most N stage × micro-batch pairs in all (default {MAX_STAGE_MICROBATCHES:,})")
    return check, simulate, compare


def _study_commands(sub) -> tuple[argparse.ArgumentParser, ...]:
    """``calibrate``, ``published`` and ``schedule``: fitting, published runs, a schedule's IR."""
    calibrate = sub.add_parser(
        "calibrate",
        help="fit the kernel cost model to measured iteration times",
        description="Fit the device's cost-model parameters (efficiency, matmul_half_dim, kernel_overhead, "
        "kernel_issue, memory_efficiency, action_overhead), the intra-node link's collective_efficiency, the fused "
        "attention efficiencies of the kernels the runs use (attention_* for flash, sdpa_* for sdpa) and, from runs "
        "that give their peak memory, memory_reserved, each within its physical range (a parameter that ends at a "
        "bound, or that no run constrains, is named), to the runs in FIT.csv (columns hidden, heads, layers, "
        "seq_len, vocab, microbatch_size (per replica), global_batch_size, tp, dp, pp, recompute, iteration_time_s; "
        "optional attention, peak_memory_bytes), on BASE_SCENARIO's cluster, device, dtype, optimizer and model "
        "family; then predict TEST.csv's runs with them.",
    )
    calibrate.add_argument("scenario", metavar="BASE_SCENARIO", help="scenario whose cluster and device are fitted")
    calibrate.add_argument("--fit", required=True, metavar="FIT.csv", help="measured runs to fit on")
    calibrate.add_argument("--test", metavar="TEST.csv", help="measured runs to predict with the fitted parameters")
    calibrate.add_argument("--json", action="store_true", help="print params, fit and test errors as JSON")
    calibrate.add_argument("--out", metavar="PARAMS.yaml", help="write the fitted cluster.device snippet here")

    published = sub.add_parser(
        "published",
        help="predict published training runs with the shipped presets (nothing fitted)",
        description="Replay the published-runs suite (default scenarios/published/suite.yaml: Korthikanti et al. "
        "2022's Table 5 iteration times and Figure 1 memory) with the shipped presets and print predicted against "
        "published, the relative error of each row and each table's mean and worst. With --out, also write "
        "published.json and published.png.",
    )
    published.add_argument("--suite", metavar="SUITE.yaml", help="suite file (default: the shipped one)")
    published.add_argument("--json", action="store_true", help="print the rows and each table's errors as JSON")
    published.add_argument("--out", metavar="DIR", help="write published.json and published.png into DIR")

    schedule = sub.add_parser(
        "schedule",
        help="print a schedule's IR, one line per rank",
        description="Print the named schedule in torch.distributed.pipelining's action text, one line per rank "
        "in rank order: the format a plan's schedule_file uses.",
    )

    schedule.add_argument("name", metavar="NAME", help=f"schedule: {', '.join(sorted(GENERATORS))}")
    schedule.add_argument("--stages", type=int, required=True, metavar="S", help="pipeline ranks (devices in a pipeline)")
    schedule.add_argument("--microbatches", type=int, required=True, metavar="M", help="micro-batches per iteration")
    schedule.add_argument("--chunks", type=int, metavar="V",
                          help="model chunks per rank (interleaved, interleaved-zb, looped-bfs; zb-v and dualpipe-v: 2)")
    schedule.add_argument("--policy", type=policy_arg, metavar="P",
                          help=f"warm-up policy K_i (dapple/1f1b only): {', '.join(DAPPLE_POLICIES[:2])}, or one per "
                          "stage separated by commas (what 'auto' decides from costs)")
    schedule.add_argument("--lower", action="store_true", help="add SEND/RECV and REDUCE_GRAD actions")
    layout = schedule.add_mutually_exclusive_group()
    layout.add_argument("--grid", action="store_true", help="print a rank x step grid instead of lines")
    layout.add_argument("--csv", action="store_true",
                        help="print torch's pipeline-order CSV (what _PipelineScheduleRuntime._load_csv reads; "
                        "with --lower, its compute_comms format)")
    return calibrate, published, schedule


def _cmd_check(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario, parse_overrides(args.overrides), plan=_plan(args.plan))
    description = describe(scenario)
    print(jsonio.dumps(description.to_json(), indent=2, sort_keys=True) if args.json
          else format_description(description))
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    watch = Stopwatch()
    with progress("reading the scenario", total=3 if args.out else 2, unit="phase") as tick:
        with watch.phase("read the scenario"):
            scenario = load_scenario(args.scenario, parse_overrides(args.overrides), plan=_plan(args.plan))
        _tick(tick, f"replaying on the {args.engine} engine")
        with watch.phase(f"replay ({args.engine})"):
            result = run_scenario(
                scenario, engine=args.engine, contention=not args.no_contention, symmetric=not args.no_symmetry
            )
            summary = result.summarize()
            run = estimate_run(scenario, summary)  # the whole run, when training.tokens or steps is set
            summary = summary if run is None else replace(summary, run=run)
        if args.out:
            _tick(tick, f"writing {args.out}")
            with watch.phase("load pandas and matplotlib"):  # most of a small run's writing: said apart
                import pandas  # noqa: F401 - events.csv

                pyplot()
            with watch.phase("write summary, trace, events and plots"):
                write_outputs(result, args.out, trace_all=args.trace_all, summary=summary)
        _tick(tick, "done")
    watch.report()
    print(jsonio.dumps(summary.to_json(), indent=2, sort_keys=True) if args.json
          else format_summary(summary, result, notes=_vocab_notes(scenario)))
    if args.fail_on_oom and summary.oom:  # a script's check: the results above, then a distinct exit code
        print(f"dapple-sim: out of memory on device {summary.oom_detail.device} (--fail-on-oom): exit 3",
              file=sys.stderr)
        return 3
    return 0


def _vocab_notes(scenario: Scenario) -> tuple[str, ...]:
    """The plan's padded vocabulary when padding adds rows at its tensor degree (``sim.models.vocab``)."""
    padding = vocab_padding(scenario.model, scenario.plan.tensor_parallel)
    if padding is None or padding.padded_at_tensor == padding.vocab:
        return ()
    return (f"vocabulary {padding.vocab:,} padded to {padding.padded_at_tensor:,} at tensor parallel "
            f"{padding.tensor_parallel} (sim.models.vocab; Megatron-LM --make-vocab-size-divisible-by "
            f"{padding.divisible_by})",)


def _cmd_compare(args: argparse.Namespace) -> int:
    schedules = parse_schedules(args.schedules)
    watch = Stopwatch()
    with watch.phase("read the scenario"):
        scenario = load_scenario(args.scenario, parse_overrides(args.overrides), plan=_plan(args.plan))
        variants = plan_variants(scenario, schedules)
        check_work(variants, scenario.training.num_microbatches, limit=args.max_stage_microbatches)
    with watch.phase(f"replay {len(variants)} schedules ({args.engine})"), progress(f"replaying {len(variants)} schedules"):
        rows, results = run_variants(scenario, variants, engine=args.engine, contention=not args.no_contention)
    if args.out:
        out = Path(args.out)
        with watch.phase("write compare.json and schedules.png"):
            try:
                out.mkdir(parents=True, exist_ok=True)
                (out / "compare.json").write_text(jsonio.dumps(rows, indent=2, sort_keys=True) + "\n")
            except OSError as exc:
                raise DappleError(f"--out {out}: cannot write ({exc.strerror})") from None
            if results:
                plt = pyplot()
                fig = schedule_comparison_figure(results, title=f"{scenario.name}: one plan, {len(results)} schedules")
                fig.savefig(out / "schedules.png", dpi=100)
                plt.close(fig)
    watch.report()
    print(jsonio.dumps(rows, indent=2, sort_keys=True) if args.json else format_rows(rows, title=scenario.name))
    return 0


def _tick(tick, desc: str) -> None:
    if tick is not None:
        tick(1, desc=desc)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    watch = Stopwatch()
    base = load_scenario(args.scenario)
    fit_runs = read_runs(args.fit)
    test_runs = read_runs(args.test) if args.test else None
    with watch.phase(f"fit {len(fit_runs)} runs"), progress(f"fitting {len(fit_runs)} runs"):
        result = calibrate(base, fit_runs, source=args.fit)
    if test_runs is not None:
        with watch.phase(f"predict {len(test_runs)} runs"), progress(f"predicting {len(test_runs)} runs"):
            result = replace(result, test=score_runs(base, test_runs, result.params, source=args.test))
    watch.report()
    snippet = params_yaml(result.params, runs=len(fit_runs), mape=result.fit.mape)
    if args.out:
        try:
            Path(args.out).write_text(snippet, encoding="utf-8")
        except OSError as exc:
            raise DappleError(f"--out {args.out}: cannot write ({exc.strerror})") from None
    for note in result.notes if not quiet() else ():
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        print(jsonio.dumps(result.to_json(), indent=2, sort_keys=True))
        return 0
    print(snippet, end="")
    for name, part in (("fit", result.fit), ("test", result.test)):
        if part is not None:
            tau = "-" if part.kendall_tau is None else f"{part.kendall_tau:.3f}"
            print(f"{name}: {len(part.runs)} runs, MAPE {part.mape:.1%}, Kendall tau {tau}")
            for scored in part.runs:
                run = scored.run
                print(f"  h{run.hidden} L{run.layers} s{run.seq_len} mb{run.microbatch_size} "
                      f"dp{run.dp} pp{run.pp}{' rc' if run.recompute else ''}: "
                      f"measured {run.iteration_time_s * 1e3:.2f} ms, predicted {scored.predicted_s * 1e3:.2f} ms "
                      f"({scored.error_frac:+.1%})" + _calibrated_peak(scored))
    return 0


def _calibrated_peak(scored) -> str:
    """A calibrated run's peak memory, measured and predicted, where the run gives it."""
    if scored.predicted_peak_memory_bytes is None:
        return ""
    return (f", peak memory measured {format_bytes(scored.run.peak_memory_bytes)}, "
            f"predicted {format_bytes(scored.predicted_peak_memory_bytes)}")


def _cmd_published(args: argparse.Namespace) -> int:
    watch = Stopwatch()
    with watch.phase("read the suite"):
        rows = read_suite(args.suite or DEFAULT_SUITE)
    with watch.phase(f"replay {len(rows)} published rows"), progress(f"replaying {len(rows)} published rows"):
        results = run_suite(rows)
    if args.out:
        with watch.phase("write published.json and published.png"):
            write_suite_outputs(results, args.out)
    watch.report()
    print(jsonio.dumps(suite_json(results), indent=2, sort_keys=True) if args.json else format_results(results))
    return 0


def _plan(path: str | None):
    return None if path is None else read_plan_file(path)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "check": _cmd_check,
    "simulate": _cmd_simulate,
    "compare": _cmd_compare,
    "calibrate": _cmd_calibrate,
    "published": _cmd_published,
    "schedule": schedule_command,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_output("dapple-sim", args)
    return run_cli("dapple-sim", lambda: COMMANDS[args.command](args))


if __name__ == "__main__":
    sys.exit(main())
