"""Benchmark a capacity sweep: Llama-3-70B-like on 64 to 16,384 H100, with failures and checkpoints.

Issue 33's acceptance: "a sweep of 64 to 16,384 GPUs with failures and checkpoints runs in
<= 60 s on 2 cores". Eight sizes (64, 128, 256, 512, 1,024, 2,048, 4,096 and 16,384 GPUs),
each a fixed plan shape (tensor 8 inside a server, pipeline 4, interleaved 1F1B of 2 chunks,
data over the rest, sharded optimizer state, selective recompute; global batch 1,024 sequences
of 8,192 tokens, 15T tokens), replayed on the fast path and turned into a whole run by
``sim.cost.capacity.estimate_run``: Llama 3's interruption rate (``reliability.preset``),
Daly's checkpoint interval, the exact expected time and a 1,000-run Monte Carlo per size.

The machine is shared and noisy: a reference unit (ten fast-path replays of a 16-GPU plan, as
``benchmarks/planner_bench.py`` times it) runs in the same process and the sweep is printed as a
ratio to it too. Times are printed, never asserted.

    python benchmarks/capacity_bench.py
"""

from __future__ import annotations

import time

from sim.cost.capacity import estimate_run
from sim.engine.run import run_scenario
from sim.input.scenario import load_scenario, parse_scenario

SIZES = (64, 128, 256, 512, 1024, 2048, 4096, 16384)
"""GPUs of each point."""
TARGET_S = 60.0
"""The issue's target for the whole sweep, seconds on 2 cores."""
GLOBAL_BATCH = 1024

LLAMA_70B = """
name: llama70b-{gpus}-h100
cluster: {{preset: dgx-h100, nodes: {nodes}, price_per_gpu_hour: 2.0}}
model: {{preset: llama, layers: 80, hidden: 8192, heads: 64, kv_heads: 8, ffn_hidden: 28672, vocab: 128256,
        seq_len: 8192, dtype: bf16}}
training: {{global_batch_size: {batch}, microbatch_size: {microbatch}, tokens: 15T}}
plan: {{schedule: {{name: interleaved, chunks: 2}}, tensor_parallel: 8, sequence_parallel: true, sharding: optimizer,
        recompute: selective, pipeline_parallel: 4, data_parallel: {dp}}}
reliability: {{preset: llama3-405b, checkpoint: {{write_bandwidth: 1TB/s}}, restart_s: 10min}}
"""
"""A point: price 2.0 per GPU-hour is a placeholder (the benchmark times the sweep, not the price)."""


def _reference_s() -> float:
    """Seconds of a fixed unit of work (ten fast-path replays of a 16-GPU plan) on this machine now."""
    scenario = load_scenario("scenarios/bert48_v100_2x8.yaml")
    started = time.perf_counter()
    for _ in range(10):
        run_scenario(scenario, engine="fast")
    return time.perf_counter() - started


def point(gpus: int):
    """The scenario of one size: data parallel over the GPUs beyond tensor x pipeline, micro-batches
    of up to 4 sequences per replica."""
    dp = gpus // 32
    per_replica = max(1, min(4, GLOBAL_BATCH // dp))
    return parse_scenario(LLAMA_70B.format(gpus=gpus, nodes=gpus // 8, batch=GLOBAL_BATCH,
                                           microbatch=per_replica * dp, dp=dp))


def main() -> None:
    reference = _reference_s()
    print(f"reference unit: {reference:.3f} s (ten fast-path replays of BERT-48 on 16 V100)")
    print(f"  {'GPUs':>6} {'iteration':>9} {'days':>6} {'expected':>8} {'goodput':>7} {'GPU-hours':>10} "
          f"{'MC mean':>7} {'wall s':>6}")
    started = time.perf_counter()
    for gpus in SIZES:
        begun = time.perf_counter()
        scenario = point(gpus)
        result = run_scenario(scenario, engine="fast")
        run = estimate_run(scenario, result.summarize())
        print(f"  {gpus:>6,} {result.iteration_time_s:>8.3f}s {run.failure_free.days:>6.1f} {run.expected.days:>8.1f} "
              f"{run.goodput.goodput:>7.1%} {run.expected.gpu_hours:>10.3g} {run.monte_carlo.mean_s / 86400:>7.1f} "
              f"{time.perf_counter() - begun:>6.2f}")
    wall = time.perf_counter() - started
    print(f"sweep of {len(SIZES)} sizes, {SIZES[0]:,} to {SIZES[-1]:,} GPUs: {wall:.1f} s "
          f"({wall / reference:.1f} reference units; target <= {TARGET_S:.0f} s on 2 cores: "
          f"{'met' if wall <= TARGET_S else 'MISSED'})")


if __name__ == "__main__":
    main()
