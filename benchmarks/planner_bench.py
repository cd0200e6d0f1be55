"""Benchmark the planners: DAPPLE's V100 profiles, new users' GPTs, GPT-3 on 1,024 A100, Llama-405B on 16,384 H100.

Prints, for each case, every planner's search time (wall seconds of this process), the
engine's iteration time and peak memory of its best plan, and the plan; then:

* the 16-GPU paper cases (scenarios/paper/, 5 models x 2 clusters): goal <= 1 s each for
  DAPPLE's planner;
* GPT-6.7B on 1 and 2 DGX H100 servers and a 40-layer, 5120-wide GPT on 512 H100 (the
  planner issue's new users), each against the hand-written plan of the issue;
* GPT-3 175B (96 x 12288, 96 heads, seq 2048, global batch 1536, fp16, Adam) on 1,024
  A100-80GB: DAPPLE's plan against the Megatron-style grid point tensor 8 x pipeline 8 x data
  16, interleaved, full recompute, simulated in the same run (goal: plan <= 10 s, at least
  as fast);
* a Llama-3-405B-sized model on 16,384 H100 (goal <= 60 s).

The machine is shared: read the times as ratios between rows of one run.

    python benchmarks/planner_bench.py [--skip-large] [--only NAME]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from planner.planners.baselines import grid_candidates
from planner.planners.registry import DEFAULT_PLANNERS, get_planner
from planner.search.evaluation import evaluate
from planner.search.space import Candidate, PlannerOptions
from sim.core.parallelism import Recompute
from sim.core.units import format_bytes
from sim.input.plan_section import balanced_cuts
from sim.input.scenario import load_scenario, parse_scenario

PAPER = Path(__file__).resolve().parent.parent / "scenarios" / "paper"

GPT_6_7B = """
name: gpt-6.7b-{nodes}x-dgx-h100
cluster: {{preset: dgx-h100, nodes: {nodes}}}
model: {{preset: gpt, layers: 32, hidden: 4096, heads: 32, seq_len: 2048, vocab: 51200, dtype: bf16}}
training: {{global_batch_size: 256}}
"""
GPT_40L_512 = """
name: gpt-40x5120-512-h100
cluster: {preset: dgx-h100, nodes: 64}
model: {preset: gpt, layers: 40, hidden: 5120, heads: 40, seq_len: 2048, vocab: 51200, dtype: bf16}
training: {global_batch_size: 1024}
"""
GPT3_1024 = """
name: gpt3-175b-1024-a100
cluster: {preset: a100-nvlink-8, nodes: 128}
model: {preset: gpt, layers: 96, hidden: 12288, heads: 96, seq_len: 2048, vocab: 51200, dtype: fp16}
training: {global_batch_size: 1536}
"""
LLAMA_405B_16K = """
name: llama405b-16384-h100
cluster: {preset: dgx-h100, nodes: 2048}
model: {preset: llama, layers: 126, hidden: 16384, heads: 128, kv_heads: 8, ffn_hidden: 53248,
        vocab: 128256, seq_len: 8192, dtype: bf16}
training: {global_batch_size: 2048}
"""


def _describe(evaluation) -> str:
    c = evaluation.candidate
    extra = f", {c.layout()}" if c.layout() else ""
    return f"{c.describe()} [{c.schedule}{dict(c.params) or ''}, mb {c.microbatch_size}, {c.placement}{extra}]"


def _line(case: str, name: str, seconds: float, evaluation, note: str = "") -> None:
    if evaluation is None or not evaluation.ok:
        print(f"{case:<26} {name:<10} {seconds:>8.2f} {'-':>10} {'-':>9}  {note or evaluation.rejected}")
        return
    print(f"{case:<26} {name:<10} {seconds:>8.2f} {evaluation.iteration_time_s:>9.3f}s "
          f"{format_bytes(evaluation.peak_memory_bytes):>9}  {_describe(evaluation)}")


def _plan(case: str, scenario, planners, options) -> dict:
    results = {}
    for name in planners:
        started = time.perf_counter()
        result = get_planner(name)(scenario, options)
        results[name] = result
        _line(case, name, time.perf_counter() - started, result.best, result.note)
    return results


def _even(scenario, stages: int, replicas: int, microbatch_size: int, **fields) -> Candidate:
    weights = [layer.fwd_flop + 1.0 for layer in scenario.model.layers]
    return Candidate(bounds=balanced_cuts(weights, stages * fields.get("chunks", 1)),
                     replicas=(replicas,) * (stages * fields.get("chunks", 1)), microbatch_size=microbatch_size,
                     **fields)


def _against(case: str, label: str, scenario, candidate, results) -> None:
    started = time.perf_counter()
    written = evaluate(scenario, candidate, engine="simpy")
    _line(case, label, time.perf_counter() - started, written)
    best = results["dapple"].best
    if best is not None and written.ok:
        print(f"{'':<26} dapple vs {label}: {written.iteration_time_s / best.iteration_time_s:.3f}x "
              f"({'at least as fast' if best.iteration_time_s <= written.iteration_time_s else 'SLOWER'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-large", action="store_true", help="leave out the 1,024- and 16,384-GPU cases")
    parser.add_argument("--only", help="case name substring")
    args = parser.parse_args()
    options = PlannerOptions()
    print(f"{'case':<26} {'planner':<10} {'search s':>8} {'iteration':>10} {'peak mem':>9}  plan")
    wanted = (lambda name: args.only is None or args.only in name)
    slower, paper_times = [], []
    for path in sorted(PAPER.glob("*.yaml")):
        if not wanted(path.stem):
            continue
        scenario = load_scenario(path, ignore_plan=True)
        results = _plan(scenario.name, scenario, DEFAULT_PLANNERS, options)
        paper_times.append(results["dapple"].search_time_s)
        mine = results["dapple"].best
        for name, result in results.items():
            if result.best and (mine is None or result.best.iteration_time_s < mine.iteration_time_s * (1 - 1e-9)):
                slower.append((scenario.name, name))
    if paper_times:
        print(f"paper cases: DAPPLE planned in {min(paper_times):.2f}-{max(paper_times):.2f} s "
              f"(goal <= 1 s each); slower than a baseline in: {slower or 'none'}")
    for nodes, hand in ((1, (8, 1, 1)), (2, (4, 4, 4))):
        scenario = parse_scenario(GPT_6_7B.format(nodes=nodes), ignore_plan=True)
        if wanted(scenario.name):
            results = _plan(scenario.name, scenario, ("dapple", "megatron", "dp"), options)
            _against(scenario.name, "hand", scenario, _even(scenario, *hand), results)
    if args.skip_large:
        return
    scenario = parse_scenario(GPT_40L_512, ignore_plan=True)
    if wanted(scenario.name):
        _plan(scenario.name, scenario, ("dapple", "megatron"), options)
    scenario = parse_scenario(GPT3_1024, ignore_plan=True)
    if wanted(scenario.name):
        results = _plan(scenario.name, scenario, ("dapple",), options)
        for chunks in (2, 3, 4):  # Megatron's grid point, with the chunk count that serves it best
            grid = _even(scenario, 8, 16, 16, schedule="interleaved", chunks=chunks, tensor_parallel=8,
                         recompute=Recompute.FULL)
            _against(scenario.name, f"tp8pp8dp16v{chunks}", scenario, grid, results)
        print(f"{'':<26} (grid candidates in DAPPLE's space: {len(grid_candidates(scenario, options))})")
    scenario = parse_scenario(LLAMA_405B_16K, ignore_plan=True)
    if wanted(scenario.name):
        _plan(scenario.name, scenario, ("dapple",), options)


if __name__ == "__main__":
    main()
