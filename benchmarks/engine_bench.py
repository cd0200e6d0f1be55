"""Benchmark the SimPy engine and the fast path on large DAPPLE plans.

Prints one row per cluster size: GPUs, device classes after symmetry reduction, simulated
actions (every action of every device), wall time of compiling the workload, of the SimPy
replay (contention, all-reduce and memory tracking on), and of the fast path, with actions
per second. ``--no-symmetry`` replays every device separately (the reduction's cost check).

    python benchmarks/engine_bench.py [--gpus 64 256 1024 4096] [--no-symmetry]
"""

from __future__ import annotations

import argparse
import time

from sim.engine.replay import simulate
from sim.engine.fastpath import replay
from sim.input.scenario import parse_scenario
from sim.engine.compile import compile_workload

TEMPLATE = """
name: bench-{gpus}
cluster: {{preset: v100-nvlink-8, nodes: {nodes}}}
model: {{preset: gpt, layers: 30, hidden: 2048, heads: 16, seq_len: 1024, vocab: 50257, dtype: fp16}}
training: {{global_batch_size: {gbs}, microbatch_size: {microbatch_size}}}
plan:
  schedule: dapple
  stages:
{stages}
"""


def scenario_text(gpus: int, num_stages: int = 16, num_microbatches: int = 64) -> str:
    replicas = gpus // num_stages
    layers = 32  # embedding + 30 blocks + head
    bounds = [round(i * layers / num_stages) for i in range(num_stages + 1)]
    stages = "\n".join(
        f"    - {{layers: [{bounds[s]}, {bounds[s + 1]}], devices: '{s * replicas}-{(s + 1) * replicas - 1}'}}"
        for s in range(num_stages)
    )
    microbatch_size = 2 * replicas
    return TEMPLATE.format(
        gpus=gpus, nodes=gpus // 8, gbs=microbatch_size * num_microbatches, microbatch_size=microbatch_size, stages=stages
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--no-symmetry", action="store_true", help="replay every device separately")
    args = parser.parse_args()
    print(f"{'GPUs':>6} {'classes':>8} {'actions':>10} {'compile s':>10} {'engine s':>9} "
          f"{'engine act/s':>13} {'fast s':>8} {'fast act/s':>12} {'iteration s':>12}")
    for gpus in args.gpus:
        scenario = parse_scenario(scenario_text(gpus), source=f"bench-{gpus}")
        t0 = time.perf_counter()
        workload = compile_workload(scenario, symmetric=not args.no_symmetry)
        t1 = time.perf_counter()
        result = simulate(workload, contention=True)
        t2 = time.perf_counter()
        fast = replay(workload)
        t3 = time.perf_counter()
        actions = sum(len(c.ops) * len(c.devices) for c in workload.classes)
        print(f"{gpus:>6} {len(workload.classes):>8} {actions:>10} {t1 - t0:>10.3f} {t2 - t1:>9.3f} "
              f"{actions / (t2 - t1):>13.3g} {t3 - t2:>8.3f} {actions / (t3 - t2):>12.3g} "
              f"{result.iteration_time_s:>12.4f}")
        assert abs(fast.iteration_time_s - simulate(workload, contention=False).iteration_time_s) < 1e-9 * fast.iteration_time_s


if __name__ == "__main__":
    main()
