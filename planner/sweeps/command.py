"""``dapple-plan sweep``: a what-if study from the command line (``planner.sweeps.run`` runs it).

Its parser, its run (read the sweep file, run every point on a process pool or Dask, draw the
plots) and the table it prints; ``planner.cli`` dispatches to it.
"""

from __future__ import annotations

import argparse
from typing import Any

from planner.sweeps.run import load_sweep, run_sweep, write_plots
from sim.core import jsonio
from sim.core.command import CommandParser, Stopwatch, add_verbosity_options
from sim.core.units import format_bytes, format_time

__all__ = ["run_sweep_command", "sweep_parser"]

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



def sweep_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
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
    add_verbosity_options(parser)
    return parser


def run_sweep_command(args: argparse.Namespace) -> int:
    watch = Stopwatch()
    with watch.phase("read the sweep file"):
        sweep = load_sweep(args.sweep)
    with watch.phase(f"run {len(sweep.points)} points"):
        result = run_sweep(sweep, args.out, workers=args.workers, dask=args.dask,
                           progress=False if args.quiet else None)
    with watch.phase("draw the plots"):
        files = list(result.files) + write_plots(sweep, result.table, args.out)
    watch.report()
    table = result.table
    failed = int(table["error"].notna().sum())
    counts = {
        "sweep": sweep.name, "points": len(sweep.points), "run": result.points_run,
        "skipped": result.points_skipped, "failed": failed, "oom": int(table["oom"].fillna(False).astype(bool).sum()),
        "wall_s": result.wall_s, "files": [str(f) for f in files],
    }
    if args.json:
        print(jsonio.dumps(counts, indent=2, sort_keys=True))
    else:
        print(_sweep_table(sweep, table, counts))
    return 1 if failed else 0


_CELL = 32
"""Widest value of an axis column in the printed sweep table."""


def _sweep_table(sweep, table, counts: dict[str, Any], limit: int = 40) -> str:
    def show(value, fmt) -> str:
        return "-" if value is None or value != value else fmt(value)

    lines = [f"{counts['sweep']}: {counts['points']} points ({counts['run']} run, {counts['skipped']} already done) "
             f"in {counts['wall_s']:.1f} s; {counts['oom']} out of memory, {counts['failed']} failed"]
    shown = table.head(limit).astype(object).where(table.head(limit).notna(), None)
    columns = list(sweep.axis_keys)
    cut = {c: any(len(str(v)) > _CELL for v in shown[c]) for c in columns}

    def cell(value) -> str:  # a whole mapping (a model, a plan) is cut; results.csv has it all
        text = str(value)
        return text if len(text) <= _CELL else text[:_CELL - 1] + "…"

    widths = {c: max([len(c)] + [len(cell(v)) for v in shown[c]]) for c in columns}
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
            "  " + "  ".join(f"{cell(row[c]):<{widths[c]}}" for c in columns)
            + f"  {show(row['iteration_time_s'], format_time):>10}"
            f" {show(row['throughput_samples_per_s'], '{:.4g}'.format):>10}"
            f" {show(row['peak_memory_bytes'], format_bytes):>10}  {outcome}"
        )
    if len(table) > limit:
        lines.append(f"  ... {len(table) - limit} more rows")
    if any(cut.values()):
        long = ", ".join(c for c in columns if cut[c])
        lines.append(f"  (long values of {long} are cut; results.csv has them whole)")
    lines.append("wrote " + ", ".join(counts["files"]))
    return "\n".join(lines)
