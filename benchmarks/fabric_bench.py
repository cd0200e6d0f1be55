"""Measure what a fabric costs (issue 32): the 1:7 core under a 405B model's DP 128, NVL72 under TP 16.

Two comparisons, each printed as seconds, never asserted:

* ``scenarios/llama3_405b_h100_fabric.yaml`` (Llama 3 405B on 16,384 H100, TP 8, PP 16, DP 128 in
  the paper's [TP, CP, PP, DP] order) with its pod-to-core tier at 1:7 (the Llama 3 paper, §3.3.1),
  non-blocking (1:1) and 1:28, on both engines: the iteration and device 0's gradient reduction (its
  ``allreduce`` rows). A gradient ring runs through its members in device order (as NCCL's rings
  follow the ranks), so it leaves each pod once: a pod's uplink carries one hop of each of a stage's
  8 rings, 8 flows on 384 servers' worth of NICs over 7, and the core does not bind;
* a Llama-3-70B-like model (80 layers, hidden 8192, 16 key/value heads so that TP 16 divides them)
  at TP 16 on the ``gb200-nvl72`` preset (one NVLink domain of 72) and on the same GPUs in 8-GPU
  servers (900 GB/s NVLink inside, 8 × 400 Gb/s NICs across): the iteration and device 0's
  communication.

    python benchmarks/fabric_bench.py
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sim.engine.run import run_scenario
from sim.input.scenario import load_scenario, parse_scenario

REPO = Path(__file__).resolve().parent.parent
LLAMA_405B = REPO / "scenarios" / "llama3_405b_h100_fabric.yaml"

TP16 = """
name: tp16-{name}
cluster:
  {cluster}
model: {{preset: llama, layers: 80, hidden: 8192, heads: 64, kv_heads: 16, ffn_hidden: 28672, vocab: 128256,
         seq_len: 8192, dtype: bf16, optimizer: adam}}
training: {{global_batch_size: 16, microbatch_size: 1}}
plan: {{schedule: gpipe, tensor_parallel: 16, sequence_parallel: true, pipeline_parallel: 1, data_parallel: 1}}
"""
CLUSTERS = {"NVL72 (one domain of 72)": "preset: gb200-nvl72\n  nodes: 18",
            "8-GPU servers": "preset: gb200-nvl72\n  nodes: 2\n  devices_per_node: 8\n  nics_per_node: 8\n  fabric: null"}


def reduction_s(result, device: int = 0) -> float:
    """Seconds ``device`` spends in its gradient reduction (its ``allreduce`` rows)."""
    return sum(r.end_s - r.start_s for r in result.event_rows([device]) if r.stream == "allreduce")


def with_core(scenario, oversubscription: float):
    """``scenario`` with its pod tier's uplinks at ``oversubscription``."""
    fabric = scenario.cluster.fabric
    tiers = (fabric.tiers[0], replace(fabric.tiers[1], oversubscription=oversubscription), *fabric.tiers[2:])
    return replace(scenario, cluster=replace(scenario.cluster, fabric=replace(fabric, tiers=tiers)))


def main() -> None:
    base = load_scenario(LLAMA_405B)
    for ratio in (7.0, 1.0, 28.0):
        for engine in ("simpy", "fast"):
            result = run_scenario(with_core(base, ratio), engine=engine)
            print(f"405B DP 128, core 1:{ratio:g}, {engine}: iteration {result.iteration_time_s:.4f} s, "
                  f"gradient reduction {reduction_s(result):.4f} s")
    for name, cluster in CLUSTERS.items():
        result = run_scenario(parse_scenario(TP16.format(name=name, cluster=cluster)))
        device = result.summary()["devices"][0]
        print(f"70B-like TP 16, {name}: iteration {result.iteration_time_s:.4f} s, "
              f"communication {device['communication_s']:.4f} s")


if __name__ == "__main__":
    main()
