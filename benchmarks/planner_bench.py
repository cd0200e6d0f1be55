"""Benchmark the planners: the issue's time targets, quality against published plans, and scaling.

Every case runs all of ``dapple-plan``'s default planners through one ``SearchContext``, as
the command does (DAPPLE's planner runs the baselines it must beat; the others answer from
that shared run), and prints per planner its spend (work: candidates, partial plans,
replays), wall and CPU seconds, and the engine's iteration time of its best plan.

* **Targets** (issue "The planner answers at any scale", must-have 2, all planners together,
  2 cores): the default BERT-48 on 16 V100 <= 2 s; GPT-3 175B on 1,024 A100 <= 60 s;
  Llama 3 405B on 16,384 H100 <= 120 s.
* **Quality** (must-have 3), each simulated in the same run: on 175B / 1,024 A100 DAPPLE's
  plan against Megatron-LM's TP 8 x PP 8 interleaved grid (Narayanan et al., SC'21, Table 1's
  175B row: tensor 8, pipeline 8; here data 16 and the chunk count that serves it best); on
  405B / 16,384 H100 against Llama 3's TP 8 x PP 16 x DP 128 (Grattafiori et al. 2024,
  "The Llama 3 Herd of Models", Table 4: 16,384 GPUs, TP 8, CP 1, PP 16, DP 128, sequence
  8,192, batch size per DP 16, 16M tokens per batch), with the schedule and recompute that
  serve it best; and on small cases (at most 8 GPUs and 12 layers) the gap to the exhaustive
  search's optimum of the data x pipeline space (goal <= 2%; DAPPLE's space is larger, so the
  gap may be negative).
* **Scaling**: a 13B GPT (one sequence per GPU) planned on 16 to 16,384 H100; the growth
  exponent between neighbouring sizes (log t2/t1 over log n2/n1) should stay <= 1.
* The issue's other cases: Megatron-Turing NLG 530B (Smith et al. 2022, "Using DeepSpeed and
  Megatron to Train Megatron-Turing NLG 530B", §2.1/§3: 105 layers, hidden 20,480, 128 heads,
  sequence 2,048, global batch 1,920) on 5,128 A100 (641 servers, 641 prime: planned on a
  subset) and a Llama-3-70B-like model on 64 and 512 H100.

The machine is shared and noisy: every case also prints a reference unit (a fixed replay
loop timed in the same process) so runs on different machines compare as ratios.

    python benchmarks/planner_bench.py [--only NAME] [--skip-large] [--skip-scaling]
"""

from __future__ import annotations

import argparse
import math
import time

from planner.planners.dapple import RIVALS
from planner.planners.exhaustive import exhaustive_planner
from planner.planners.registry import DEFAULT_PLANNERS, get_planner
from planner.search.context import SearchContext
from planner.search.evaluation import evaluate
from planner.search.space import Candidate, PlannerOptions
from sim.core.parallelism import Recompute, Sharding
from sim.core.units import format_bytes
from sim.input.plan_section import balanced_cuts
from sim.input.scenario import load_scenario, parse_scenario

GPT3_1024 = "scenarios/scale/gpt3_175b_a100_1024.yaml"
LLAMA_405B_16K = "scenarios/scale/llama3_405b_h100_16384.yaml"
TNLG_5128 = """
name: turing-nlg-530b-5128-a100
cluster: {preset: a100-nvlink-8, nodes: 641}
model: {preset: gpt, layers: 105, hidden: 20480, heads: 128, seq_len: 2048, vocab: 51200, dtype: fp16}
training: {global_batch_size: 1920}
"""
LLAMA_70B = """
name: llama70b-{gpus}-h100
cluster: {{preset: dgx-h100, nodes: {nodes}}}
model: {{preset: llama, layers: 80, hidden: 8192, heads: 64, kv_heads: 8, ffn_hidden: 28672, vocab: 128256,
        seq_len: 8192, dtype: bf16}}
training: {{global_batch_size: {batch}}}
"""
GPT_13B = """
name: gpt13b-{gpus}-h100
cluster: {{preset: dgx-h100, nodes: {nodes}}}
model: {{preset: gpt, layers: 40, hidden: 5120, heads: 40, seq_len: 2048, vocab: 51200, dtype: bf16}}
training: {{global_batch_size: {batch}}}
"""
SMALL = """
name: gpt{layers}-{gpus}gpu
cluster:
  nodes: 1
  devices_per_node: {gpus}
  device: {{name: A100-80GB}}
  intra_node: {{bandwidth: 300GB/s, latency: 5us}}
  inter_node: {{bandwidth: 25GB/s, latency: 10us}}
model: {{preset: gpt, layers: {layers}, hidden: 2048, heads: 16, seq_len: 2048, vocab: 32768, dtype: bf16}}
training: {{global_batch_size: 16}}
"""
TARGETS_S = {"bert48-v100-2x8": 2.0, "gpt3-175b-1024-a100": 60.0, "llama405b-16384-h100": 120.0}
"""The issue's targets, all planners together, seconds on 2 cores."""


def _reference_s() -> float:
    """Seconds of a fixed unit of work (ten fast-path replays of a 16-GPU plan) on this machine now."""
    scenario = load_scenario("scenarios/bert48_v100_2x8.yaml", ignore_plan=True)
    candidate = Candidate(bounds=(0, 26, 53), replicas=(8, 8), microbatch_size=16)
    started = time.perf_counter()
    for _ in range(10):
        evaluate(scenario, candidate, engine="fast")
    return time.perf_counter() - started


def _describe(evaluation) -> str:
    c = evaluation.candidate
    layout = f", {c.layout()}" if c.layout() else ""
    stages = f"{c.num_stages // c.chunks} x {c.replicas[0]}" if len(set(c.replicas)) == 1 else "uneven"
    idle = f", on {c.on_devices:,} devices" if c.on_devices else ""
    return f"PP {stages} [{c.schedule}, {c.chunks} chunks, mb {c.microbatch_size}{layout}{idle}]"


def _row(case: str, name: str, result, seconds: float | None = None) -> None:
    spend = result.spend
    work = (f"{spend.candidates:>6} cand {spend.partials / 1e3:>7.0f}k part {spend.fast_replays:>4} fast "
            f"{spend.engine_replays:>3} eng")
    shown = result.search_time_s if seconds is None else seconds
    if result.best is None:
        print(f"  {case:<26} {name:<10} {shown:>7.1f}s  {work}  {result.note[:80]}")
        return
    best = result.best
    print(f"  {case:<26} {name:<10} {shown:>7.1f}s  {work}  {best.iteration_time_s:>9.4f}s "
          f"{format_bytes(best.peak_memory_bytes):>9}  {_describe(best)}")


def plan_all(scenario, options: PlannerOptions | None = None) -> tuple[dict, float, float]:
    """(results by planner, wall seconds, CPU seconds of this process) of every default planner."""
    options = options or PlannerOptions()
    context = SearchContext(scenario)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        results = {name: context.run(name, get_planner(name), options) for name in DEFAULT_PLANNERS}
    finally:
        context.close()
    return results, time.perf_counter() - wall, time.process_time() - cpu


def _case(scenario, options=None) -> dict:
    results, wall, cpu = plan_all(scenario, options)
    for name in DEFAULT_PLANNERS:
        _row(scenario.name, name, results[name])
    target = TARGETS_S.get(scenario.name)
    verdict = "" if target is None else f"; target <= {target:g} s: {'met' if wall <= target else 'MISSED'}"
    print(f"  {scenario.name}: all planners {wall:.1f} s wall, {cpu:.1f} s CPU of this process "
          f"({scenario.cluster.num_devices:,} GPUs){verdict}")
    if results["dapple"].note:
        print(f"    dapple: {results['dapple'].note}")
    return results


def _grid(scenario, stages: int, replicas: int, microbatch_size: int, **fields) -> Candidate:
    weights = [layer.fwd_flop + 1.0 for layer in scenario.model.layers]
    chunks = fields.get("chunks", 1)
    return Candidate(bounds=balanced_cuts(weights, stages * chunks), replicas=(replicas,) * (stages * chunks),
                     microbatch_size=microbatch_size, **fields)


def _against(scenario, label: str, grid: list[Candidate], dapple) -> None:
    """The best of ``grid`` (a published plan's variants) by the engine, against DAPPLE's plan."""
    replayed = [evaluate(scenario, c, engine="simpy") for c in grid]
    fitting = [e for e in replayed if e.ok]
    if not fitting:
        print(f"  {label}: none of its {len(grid)} variants fits ({replayed[0].rejected})")
        return
    best = min(fitting, key=lambda e: e.iteration_time_s)
    print(f"  {label}: {best.iteration_time_s:.4f} s ({_describe(best)})")
    if dapple.best is not None:
        ratio = best.iteration_time_s / dapple.best.iteration_time_s
        print(f"    DAPPLE {dapple.best.iteration_time_s:.4f} s: {ratio:.3f}x "
              f"({'at least as fast' if ratio >= 1 else 'SLOWER'})")


def quality_175b(scenario, results) -> None:
    grid = [_grid(scenario, 8, 16, mb, schedule="interleaved", chunks=v, tensor_parallel=8, recompute=r,
                  sharding=Sharding.OPTIMIZER)
            for v in (2, 3, 4) for mb in (16, 32) for r in (Recompute.SELECTIVE, Recompute.FULL)]
    _against(scenario, "Megatron-LM TP 8 x PP 8 x DP 16 (interleaved)", grid, results["dapple"])


def quality_405b(scenario, results) -> None:
    # batch size per DP 16 (Table 4): 16 micro-batches of one sequence on each of the 128 replicas
    grid = [_grid(scenario, 16, 128, 128, schedule=schedule, chunks=v, tensor_parallel=8, recompute=r,
                  sharding=Sharding.OPTIMIZER)
            for schedule, v in (("dapple", 1), ("interleaved", 2)) for r in (Recompute.SELECTIVE, Recompute.FULL)]
    _against(scenario, "Llama 3 TP 8 x PP 16 x DP 128 (Table 4)", grid, results["dapple"])


def exhaustive_gaps() -> None:
    print("gap to the exhaustive search (DAPPLE / exhaustive - 1; goal <= 2%):")
    options = PlannerOptions(microbatch_sizes=(1, 2, 4))
    for layers, gpus in ((6, 4), (8, 4), (4, 8)):
        scenario = parse_scenario(SMALL.format(layers=layers, gpus=gpus), ignore_plan=True)
        context = SearchContext(scenario)
        started = time.perf_counter()
        exhaustive = exhaustive_planner(scenario, options, context=context)
        spent = time.perf_counter() - started
        dapple = context.run("dapple", get_planner("dapple"), options)
        gap = dapple.best.iteration_time_s / exhaustive.best.iteration_time_s - 1
        print(f"  {scenario.name:<14} exhaustive {exhaustive.best.iteration_time_s:.5f} s "
              f"({exhaustive.spend.engine_replays} replays, {spent:.1f} s)  dapple {dapple.best.iteration_time_s:.5f} s"
              f"  gap {gap:+.2%} {'ok' if gap <= 0.02 else 'OVER 2%'}")


def scaling() -> None:
    print("scaling: a 13B GPT, one sequence per GPU, all planners (growth exponent <= 1 is linear or better):")
    previous = None
    for gpus in (16, 64, 256, 1024, 4096, 16384):
        scenario = parse_scenario(GPT_13B.format(gpus=gpus, nodes=gpus // 8, batch=gpus), ignore_plan=True)
        results, wall, cpu = plan_all(scenario)
        growth = "" if previous is None else \
            f"  growth exponent {math.log(wall / previous[1]) / math.log(gpus / previous[0]):.2f}"
        best = results["dapple"].best
        shown = f"{best.iteration_time_s:.3f} s {_describe(best)}" if best else "no plan fits"
        print(f"  {gpus:>6,} GPUs  {wall:>7.1f} s wall {cpu:>7.1f} s CPU{growth}  dapple {shown}")
        previous = (gpus, wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="run only the cases whose name contains this")
    parser.add_argument("--skip-large", action="store_true", help="leave out the cases above 1,024 GPUs")
    parser.add_argument("--skip-scaling", action="store_true", help="leave out the 16 to 16,384 GPU scaling")
    args = parser.parse_args()
    wanted = (lambda name: args.only is None or args.only in name)
    print(f"reference unit: {_reference_s():.3f} s (ten fast-path replays of a 16-GPU BERT-48 plan)")
    print(f"planners: {', '.join(DEFAULT_PLANNERS)} (DAPPLE's runs {', '.join(n for n, _ in RIVALS)} itself)")
    print(f"  {'case':<26} {'planner':<10} {'search':>8}  {'spend':<44}  {'iteration':>10} {'peak mem':>9}  plan")
    if wanted("bert48"):
        _case(load_scenario("scenarios/bert48_v100_2x8.yaml", ignore_plan=True))
    if wanted("gpt3"):
        scenario = load_scenario(GPT3_1024, ignore_plan=True)
        quality_175b(scenario, _case(scenario))
    if not args.skip_large and wanted("llama405b"):
        scenario = load_scenario(LLAMA_405B_16K, ignore_plan=True)
        quality_405b(scenario, _case(scenario))
    if wanted("exhaustive"):
        exhaustive_gaps()
    if not args.skip_large and wanted("turing"):
        _case(parse_scenario(TNLG_5128, ignore_plan=True))
    for gpus in (64, 512):
        if wanted(f"llama70b-{gpus}"):
            _case(parse_scenario(LLAMA_70B.format(gpus=gpus, nodes=gpus // 8, batch=gpus // 2), ignore_plan=True))
    if not args.skip_scaling and wanted("scaling"):
        scaling()


if __name__ == "__main__":
    main()
