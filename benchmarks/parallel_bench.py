"""Benchmark 4D plans: the shipped tensor/context/sharded scenarios and a 16,384-GPU grid.

For each scenario it prints the devices, the device classes the symmetry reduction leaves,
the wall time of loading the scenario, compiling the workload and replaying it with the
SimPy engine (contention on), the predicted iteration time, MFU and peak memory per device.
The last row is a Llama-3-405B-sized model (126 layers, hidden 16384, 128 heads, 8 key/value
heads, SwiGLU width 53248, vocabulary 128256, sequence 8192; Dubey et al. 2024, Table 3) on
2,048 DGX H100 servers: tensor 8 x pipeline 16 x data 128, interleaved with 2 chunks.
Times are wall-clock on this machine: compare them as ratios within one run.

    python benchmarks/parallel_bench.py [--skip-large]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from sim.core.units import format_bytes
from sim.engine.compile import compile_workload
from sim.engine.replay import simulate
from sim.input.scenario import load_scenario, parse_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
SHIPPED = ("gpt3_175b_a100_tp8_pp8", "llama3_70b_h100_fsdp", "llama3_8b_h100_context_parallel")

LLAMA_405B_16K = """
name: llama405b-h100-16384
cluster: {preset: dgx-h100, nodes: 2048}
model: {preset: llama, layers: 126, hidden: 16384, heads: 128, kv_heads: 8, ffn_hidden: 53248,
        vocab: 128256, seq_len: 8192, dtype: bf16}
training: {global_batch_size: 2048, microbatch_size: 128}
plan: {schedule: {name: interleaved, chunks: 2}, tensor_parallel: 8, sequence_parallel: true,
       recompute: selective, sharding: optimizer, pipeline_parallel: 16, data_parallel: 128}
"""


def _row(name: str, load) -> None:
    t0 = time.perf_counter()
    scenario = load()
    t1 = time.perf_counter()
    workload = compile_workload(scenario)
    t2 = time.perf_counter()
    summary = simulate(workload).summarize()
    t3 = time.perf_counter()
    mfu = "-" if summary.mfu is None else f"{summary.mfu:.1%}"
    print(f"{name:<34} {summary.num_devices:>7} {summary.device_classes:>8} {t1 - t0:>7.2f} {t2 - t1:>9.2f} "
          f"{t3 - t2:>9.2f} {t3 - t0:>8.2f} {summary.iteration_time_s:>11.3f} {mfu:>6} "
          f"{format_bytes(summary.peak_memory_bytes):>10}{'  OOM' if summary.oom else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-large", action="store_true", help="leave out the 16,384-GPU grid")
    args = parser.parse_args()
    print(f"{'scenario':<34} {'devices':>7} {'classes':>8} {'load s':>7} {'compile s':>9} {'engine s':>9} "
          f"{'total s':>8} {'iteration':>11} {'MFU':>6} {'peak mem':>10}")
    for name in SHIPPED:
        _row(name, lambda name=name: load_scenario(SCENARIOS / f"{name}.yaml"))
    if not args.skip_large:
        _row("llama-405b 16,384 H100 (tp8 pp16 dp128)", lambda: parse_scenario(LLAMA_405B_16K, source="llama405b"))


if __name__ == "__main__":
    main()
