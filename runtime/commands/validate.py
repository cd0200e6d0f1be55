"""``dapple-run validate``: profile, simulate, run and compare, predicted against measured.

One command closes the loop that ``profile``, ``dapple-sim simulate`` and ``run`` close by
hand: the plan runs for real on N local processes while they take turns profiling the
model's layers, the optimizer step and the per-action overhead (``runtime.validation.loop``);
the simulator replays the plan on those measurements; the report sets iteration time,
per-stage compute, per-action timing and per-device peak memory side by side with relative
errors (``sim.report.analysis.validation``). ``--rounds`` repeats it all on a machine whose speed
drifts and reports the median round. When the machine's speed drifted between the turns by more
than the error reported (``sim.core.validation_report.Drift``), one warning line on stderr says
so: that error is the machine's as much as the simulator's. Where the runtime realises the
plan otherwise than the simulator models it (``runtime.model.realisation``), one note line
each on stderr says how.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from runtime.commands.run import check_launch
from runtime.model.config import load_runnable
from runtime.model.realisation import realisation_notes
from runtime.validation.loop import combine_rounds, validate
from sim.core import jsonio
from sim.core.command import Stopwatch, progress
from sim.core.errors import DappleError
from sim.core.validation_report import ValidationReport
from sim.report.analysis.validation import drift_warning, format_report
from sim.report.plots.validation import validation_gantt_figure, validation_memory_figure

__all__ = ["cmd_validate", "write_report"]


def cmd_validate(args: argparse.Namespace) -> int:
    """``dapple-run validate``: the loop, one or ``--rounds`` times, and its report (its JSON
    made here, once: ``validation.json`` and ``--json`` print the same)."""
    args.check, args.no_memory, args.fail_at = False, False, None
    runnable = load_runnable(args.scenario, args.overrides, plan=args.plan_data)
    check_launch(runnable, args)
    out = Path(args.out) if args.out else Path("out") / f"{runnable.scenario.name}-validation"

    if args.rounds < 1:
        raise DappleError(f"--rounds: {args.rounds}; give 1 or more")

    if args.slices < 1:
        raise DappleError(f"--slices: {args.slices}; give 1 or more")
    # torch only once the checks before launch have passed: they stay torch-free (and fast)
    from torch.multiprocessing import ProcessRaisedException

    reports = []
    watch = Stopwatch()
    try:
        for round_ in range(args.rounds):
            folder = out if args.rounds == 1 else out / f"round{round_ + 1}"
            name = "validate" if args.rounds == 1 else f"round {round_ + 1}/{args.rounds}"
            with progress(name, total=args.warmup + args.steps, unit="step") as tick:
                reports.append(validate(runnable, nproc=args.nproc, backend=args.backend, steps=args.steps,
                                        out=folder, warmup=args.warmup, slices=args.slices, repeats=args.repeats,
                                        seed=args.seed, timeout=args.timeout, tick=_named(tick, name), watch=watch))
    except ProcessRaisedException as failed:
        print(f"dapple-run: error: the run failed: {_last_line(str(failed))}", file=sys.stderr)
        return 1
    report = reports[0] if args.rounds == 1 else combine_rounds(reports)
    document = report.to_json()
    with watch.phase("write the report and its charts"):
        paths = write_report(report, out, document=document)
    watch.report()
    if args.json:
        print(jsonio.dumps(document, indent=2, sort_keys=True))
    else:
        print(format_report(report))
        traces = report.traces or {}
        print("report: " + ", ".join(str(p) for p in paths))
        if traces:
            print(f"traces (open side by side in https://ui.perfetto.dev): {traces['predicted']}, {traces['measured']}")
    warning = drift_warning(report)
    if warning is not None:  # on stderr, so that --json's stdout stays one document
        print(f"dapple-run: warning: {warning}", file=sys.stderr)
    for note in realisation_notes(runnable.plan, num_microbatches=runnable.scenario.training.num_microbatches):
        print(f"dapple-run: note: {note}", file=sys.stderr)
    return 0


def write_report(report: ValidationReport, out: Path, *, document: dict[str, Any] | None = None) -> list[Path]:
    """``validation.json`` (``document``, default ``report.to_json()``) and the two charts
    (``validation_gantt.png``, ``validation_memory.png``) in ``out``; their paths."""
    # matplotlib only where charts are drawn
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "validation.json", out / "validation_gantt.png", out / "validation_memory.png"]
    document = report.to_json() if document is None else document
    paths[0].write_text(jsonio.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for path, figure in zip(paths[1:], (validation_gantt_figure, validation_memory_figure)):
        fig = figure(report)
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return paths


def _named(tick, name: str):
    """``tick`` with every description prefixed by ``name`` (the round, with ``--rounds``)."""
    if tick is None:
        return None
    return lambda n=1, desc=None: tick(n, desc=None if desc is None else f"{name}: {desc}")


def _last_line(text: str) -> str:
    """The last non-empty line of a failed rank's traceback: its exception."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "a rank failed"
