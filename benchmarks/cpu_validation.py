"""How well the simulator predicts real CPU runs: ``dapple-run validate`` repeated (issue: validation loop).

Runs ``dapple-run validate SCENARIO --nproc 2 --backend gloo`` for GPipe and DAPPLE, taking
turns for ``--rounds`` rounds (so that a slow moment of the machine does not fall on one
schedule), and prints each round's iteration-time and peak-memory errors and their medians.
A 2-vCPU virtual machine's speed drifts by 10-20% from one minute to the next, and each
round profiles and runs a few seconds apart, so a single round's time error is mostly that
drift; the median over rounds is the number to read.

With ``--record`` it writes the round with the median time error of each schedule to
``notebooks/data/validation_cpu.json`` (the recording the validation notebook reads).

    python benchmarks/cpu_validation.py [--scenario scenarios/gpt_tiny_cpu.yaml] [--rounds 5]
        [--steps 20] [--slices 5] [--keep DIR] [--record]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT / "notebooks" / "data" / "validation_cpu.json"
SCHEDULES = ("gpipe", "dapple")


def validate_once(scenario: str, schedule: str, steps: int, slices: int, keep: Path | None) -> dict:
    """One ``dapple-run validate`` in a fresh process; its JSON report (its outputs kept in
    ``keep`` when given)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = keep if keep is not None else Path(scratch)
        command = [sys.executable, "-m", "runtime", "validate", scenario, "--nproc", "2", "--backend", "gloo",
                   "--steps", str(steps), "--slices", str(slices), "--set", f"plan.schedule={schedule}", "--out", str(out), "--json"]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"dapple-run validate failed ({schedule}): {done.stderr.strip().splitlines()[-1:]}")
        return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="scenarios/gpt_tiny_cpu.yaml")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--slices", type=int, default=5, help="turns of profile and run in each validate (default 5)")
    parser.add_argument("--keep", metavar="DIR", type=Path,
                        help="keep every round's validate outputs in DIR/SCHEDULE-roundK (default: discard them)")
    parser.add_argument("--record", action="store_true", help=f"write the median rounds to {RECORDING.relative_to(ROOT)}")
    args = parser.parse_args()
    reports: dict[str, list[dict]] = {name: [] for name in SCHEDULES}
    print(f"{'round':>5} {'schedule':>8} {'predicted ms':>13} {'measured ms':>12} {'time error':>11} "
          f"{'peak memory error':>18}")
    for round_ in range(args.rounds):
        for schedule in SCHEDULES:
            keep = None if args.keep is None else args.keep / f"{schedule}-round{round_ + 1}"
            report = validate_once(args.scenario, schedule, args.steps, args.slices, keep)
            reports[schedule].append(report)
            print(f"{round_ + 1:>5} {schedule:>8} {report['predicted']['iteration_time_s'] * 1e3:>13.2f} "
                  f"{report['measured']['iteration_time_s'] * 1e3:>12.2f} "
                  f"{report['error']['iteration_time_frac']:>+11.1%} {report['error']['peak_memory_frac']:>+18.2%}",
                  flush=True)
    chosen = []
    for schedule, runs in reports.items():
        errors = [r["error"]["iteration_time_frac"] for r in runs]
        memory = [abs(d["peak_memory_frac"]) for r in runs for d in r["error"]["devices"]]
        print(f"{schedule}: median iteration-time error {statistics.median(errors):+.1%} "
              f"(range {min(errors):+.1%} .. {max(errors):+.1%}), median |error| "
              f"{statistics.median(abs(e) for e in errors):.1%}; worst per-device peak-memory error {max(memory):.2%}")
        chosen.append(sorted(runs, key=lambda r: r["error"]["iteration_time_frac"])[len(runs) // 2])
    if args.record:
        RECORDING.write_text(json.dumps({
            "recorded": f"{datetime.date.today().isoformat()}, benchmarks/cpu_validation.py --rounds {args.rounds} "
                        f"--steps {args.steps} --slices {args.slices}: dapple-run validate {args.scenario} --nproc 2 (gpipe and dapple), "
                        "the round with the median iteration-time error of each, 2 gloo processes on a 2-vCPU machine",
            "runs": chosen,
        }, indent=1, sort_keys=True) + "\n")
        print(f"wrote {RECORDING.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
