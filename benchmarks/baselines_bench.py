"""Benchmark the baseline planners (PipeDream, even, dp) from 16 to 16,384 GPUs.

Prints, for each case, each baseline's search seconds (wall, this process), the same as a
ratio to a reference loop timed in this run (``REFERENCE_LOOP``: read the ratios, the
machine is shared), its spend in work (``planner.search.budget.Spend``) and its answer:

* the default BERT-48 on 16 V100 (``scenarios/bert48_v100_2x8.yaml``): goal, the three
  together <= 0.4 s;
* a Llama-3-70B-like model on 64 H100 (``scenarios/llama3_70b_h100_fsdp.yaml``, its plan
  ignored) and GPT-3 175B on 64 A100 (``scenarios/gpt3_175b_a100_tp8_pp8.yaml``, its plan
  ignored);
* GPT-3 175B on 1,024 A100 and Llama-3-405B on 16,384 H100 (``benchmarks/planner_bench.py``'s
  ``GPT3_1024`` and ``LLAMA_405B_16K``): goal, a few seconds each.

    python benchmarks/baselines_bench.py [--skip-large] [--only NAME]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from planner.planners.registry import get_planner
from planner.search.space import PlannerOptions
from sim.input.scenario import load_scenario, parse_scenario

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: planner_bench is a sibling
from planner_bench import GPT3_1024, LLAMA_405B_16K  # noqa: E402

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
BASELINES = ("pipedream", "even", "dp")
REFERENCE_LOOP = 2_000_000
"""Iterations of the reference loop (a float sum) whose seconds the ratios divide by."""


def reference_s() -> float:
    """Seconds of a fixed pure-Python loop, the unit of this run's ratios."""
    started = time.perf_counter()
    total = 0.0
    for k in range(REFERENCE_LOOP):
        total += k * 0.5
    return time.perf_counter() - started


def _spend(result) -> str:
    s = result.spend
    reached = f" reached {', '.join(s.reached)}" if s.reached else ""
    return (f"{s.candidates} cand, {s.partials:,} partials, {s.fast_replays} fast, "
            f"{s.engine_replays} engine{reached}")


def _answer(result) -> str:
    best = result.best
    if best is None:
        return result.note[:90]
    c = best.candidate
    return (f"{best.iteration_time_s:.4g} s, {c.num_stages} stages, replicas {sorted(set(c.replicas))}, "
            f"mb {c.microbatch_size}")


def run_case(case: str, scenario, unit_s: float) -> float:
    total = 0.0
    for name in BASELINES:
        started = time.perf_counter()
        result = get_planner(name)(scenario, PlannerOptions())
        seconds = time.perf_counter() - started
        total += seconds
        print(f"{case:<28} {name:<10} {seconds:>7.2f} s {seconds / unit_s:>7.1f}x  {_spend(result)}"
              f"  | {_answer(result)}", flush=True)
    print(f"{case:<28} {'together':<10} {total:>7.2f} s {total / unit_s:>7.1f}x", flush=True)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-large", action="store_true", help="skip the 1,024- and 16,384-GPU cases")
    parser.add_argument("--only", help="run only the cases whose name contains this")
    args = parser.parse_args()
    cases = [
        ("bert48-16-v100", lambda: load_scenario(SCENARIOS / "bert48_v100_2x8.yaml", ignore_plan=True)),
        ("llama70b-64-h100", lambda: load_scenario(SCENARIOS / "llama3_70b_h100_fsdp.yaml", ignore_plan=True)),
        ("gpt3-175b-64-a100", lambda: load_scenario(SCENARIOS / "gpt3_175b_a100_tp8_pp8.yaml", ignore_plan=True)),
    ]
    if not args.skip_large:
        cases += [("gpt3-175b-1024-a100", lambda: parse_scenario(GPT3_1024, ignore_plan=True)),
                  ("llama405b-16384-h100", lambda: parse_scenario(LLAMA_405B_16K, ignore_plan=True))]
    unit_s = reference_s()
    print(f"reference loop: {unit_s:.3f} s (ratios are seconds / this)")
    for case, make in cases:
        if args.only and args.only not in case:
            continue
        run_case(case, make(), unit_s)


if __name__ == "__main__":
    main()
