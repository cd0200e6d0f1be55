"""Benchmark the planners on DAPPLE's V100 profiles and on a 1,024-GPU GPT.

For each scenario in scenarios/paper/ (5 models x 2 clusters) it runs DAPPLE's planner and
the baselines (PipeDream's planner, even split with GPipe, pure data parallelism) and prints
the engine's iteration time, peak memory and speed-up over pure data parallelism of each
planner's best plan, with each planner's search time. Then it plans a 96-layer GPT on 128
servers x 8 V100 and prints DAPPLE's search time.

    python benchmarks/planner_bench.py [--skip-large] [--only NAME]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from planner.registry import DEFAULT_PLANNERS, get_planner
from planner.space import PlannerOptions
from sim.input.scenario import load_scenario, parse_scenario
from sim.units import format_bytes

PAPER = Path(__file__).resolve().parent.parent / "scenarios" / "paper"

LARGE = """
name: gpt96-v100-128x8
cluster: {preset: v100-nvlink-8, nodes: 128}
model: {preset: gpt, layers: 96, hidden: 2048, heads: 16, seq_len: 1024, vocab: 50257, dtype: fp16}
training: {global_batch_size: 2048, microbatch_size: 2048}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-large", action="store_true")
    parser.add_argument("--only", help="scenario name substring")
    args = parser.parse_args()
    options = PlannerOptions()
    print(f"{'scenario':<22} {'planner':<10} {'search s':>8} {'iteration':>10} {'peak mem':>9} {'vs dp':>6}  plan")
    slower = []
    for path in sorted(PAPER.glob("*.yaml")):
        if args.only and args.only not in path.stem:
            continue
        scenario = load_scenario(path)
        results = {name: get_planner(name)(scenario, options) for name in DEFAULT_PLANNERS}
        dp = results["dp"].best
        for name, result in results.items():
            best = result.best
            if best is None:
                print(f"{scenario.name:<22} {name:<10} {result.search_time_s:>8.2f} {'-':>10} {'-':>9} {'-':>6}  {result.note}")
                continue
            speedup = f"{dp.iteration_time_s / best.iteration_time_s:.2f}x" if dp else "-"
            c = best.candidate
            print(f"{scenario.name:<22} {name:<10} {result.search_time_s:>8.2f} {best.iteration_time_s * 1e3:>8.1f}ms "
                  f"{format_bytes(best.peak_memory_bytes):>9} {speedup:>6}  {c.describe()} "
                  f"[{c.schedule}{dict(c.params) or ''}, mb {c.microbatch_size}, {c.placement}{', recompute' if c.recompute else ''}]")
        mine = results["dapple"].best
        for name, result in results.items():
            if result.best and (mine is None or result.best.iteration_time_s < mine.iteration_time_s * (1 - 1e-9)):
                slower.append((scenario.name, name))
    print("DAPPLE slower than a baseline in:", slower or "none")
    if not args.skip_large:
        scenario = parse_scenario(LARGE, source="gpt96-1024")
        started = time.perf_counter()
        result = get_planner("dapple")(scenario, options)
        elapsed = time.perf_counter() - started
        best = result.best
        print(f"gpt96 on 1024 V100: DAPPLE planned in {elapsed:.1f} s: {best.candidate.describe() if best else result.note} "
              f"{best.iteration_time_s if best else ''}")


if __name__ == "__main__":
    main()
