"""Measure what a fabric costs (issue 32): the 1:7 core under a 405B model's DP 128, NVL72 under TP 16 and EP 64.

Comparisons, each printed as seconds (and the fabric's tier utilisation), never asserted:

* ``scenarios/llama3_405b_h100_fabric.yaml`` (Llama 3 405B on 16,384 H100, TP 8, PP 16, DP 128 in
  the paper's [TP, CP, PP, DP] order) with its pod-to-core tier at 1:7 (the Llama 3 paper, §3.3.1),
  non-blocking (1:1) and 1:28, on both engines: the iteration and device 0's gradient reduction (its
  ``allreduce`` rows). A gradient ring runs through its members in device order (as NCCL's rings
  follow the ranks), so it leaves each pod once: a pod's uplink carries one hop of each of a stage's
  8 rings, 8 flows on 384 servers' worth of NICs over 7, and the core does not bind;
* a Llama-3-70B-like model (80 layers, hidden 8192, 16 key/value heads so that TP 16 divides them)
  at TP 16 on the ``gb200-nvl72`` preset (one NVLink domain of 72) and on the same GPUs in 8-GPU
  servers (900 GB/s NVLink inside, 8 × 400 Gb/s NICs across): the iteration and device 0's
  communication;
* a DeepSeek-V3-like MoE layer stack (8 blocks of hidden 7168, 256 routed experts of width 2048,
  top 8, one shared; ``scenarios/deepseek_v3_h800_ep64.yaml``'s shapes) at EP 64 × DP 64 on 64
  GB200: one NVL72 domain against 8 servers of 8 GPUs (the all-to-all's 7/8 across servers).

    python benchmarks/fabric_bench.py [--only 405b tp16 ep64]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from sim.core.faults import SlowLink
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
EP64 = """
name: ep64-{name}
cluster:
  {cluster}
model: {{preset: llama, layers: 8, hidden: 7168, heads: 128, kv_heads: 128, ffn_hidden: 18432, vocab: 129280,
         seq_len: 4096, dtype: bf16, optimizer: adam, attention: flash,
         experts: {{count: 256, top_k: 8, ffn_hidden: 2048, shared: 1, layers: [1, 2, 3, 4, 5, 6, 7]}}}}
training: {{global_batch_size: 256, microbatch_size: 64}}
plan: {{schedule: 1f1b, sharding: optimizer, pipeline_parallel: 1, data_parallel: 64, expert_parallel: 64}}
"""
EP_CLUSTERS = {"NVL72 (one domain of 72)": "preset: gb200-nvl72\n  nodes: 18",
               "8-GPU servers": "preset: gb200-nvl72\n  nodes: 8\n  devices_per_node: 8\n  nics_per_node: 8\n"
                                "  fabric: null"}
CLUSTERS = {"NVL72 (one domain of 72)": "preset: gb200-nvl72\n  nodes: 18",
            "8-GPU servers": "preset: gb200-nvl72\n  nodes: 2\n  devices_per_node: 8\n  nics_per_node: 8\n  fabric: null"}


def reduction_s(result, device: int = 0) -> float:
    """Seconds ``device`` spends in its gradient reduction (its ``allreduce`` rows)."""
    return sum(r.end_s - r.start_s for r in result.event_rows([device]) if r.stream == "allreduce")


def with_core(scenario, oversubscription: float, rack: float = 1.0):
    """``scenario`` with its pod tier's uplinks at ``oversubscription`` (and its rack tier's at ``rack``)."""
    fabric = scenario.cluster.fabric
    tiers = (replace(fabric.tiers[0], oversubscription=rack), replace(fabric.tiers[1], oversubscription=oversubscription),
             *fabric.tiers[2:])
    return replace(scenario, cluster=replace(scenario.cluster, fabric=replace(fabric, tiers=tiers)))


def utilisation(result) -> str:
    """Each tier's utilisation, ``rack 1.2%, pod 0.4%``, from the summary's ``fabric`` (none: ``-``)."""
    fabric = result.summarize().fabric
    return "-" if fabric is None else ", ".join(f"{t.name} {t.utilisation:.1%}" for t in fabric.tiers)


def llama_405b() -> None:
    base = load_scenario(LLAMA_405B)
    cases = [(f"core 1:{ratio:g}", with_core(base, ratio)) for ratio in (7.0, 1.0, 28.0)]
    cases.append(("racks 1:7, core 1:1", with_core(base, 1.0, rack=7.0)))
    for factor in (0.25, 0.02):
        cases.append((f"core 1:7, pod 0's uplinks at {factor:g}",
                      replace(base, faults=(SlowLink(tier=1, index=0, factor=factor),))))
    for name, scenario in cases:
        for engine in ("simpy", "fast"):
            result = run_scenario(scenario, engine=engine)
            print(f"405B DP 128, {name}, {engine}: iteration {result.iteration_time_s:.4f} s, "
                  f"gradient reduction {reduction_s(result):.4f} s; tiers {utilisation(result)}", flush=True)


def scale_up(template: str, clusters: dict, what: str) -> None:
    for name, cluster in clusters.items():
        result = run_scenario(parse_scenario(template.format(name=name, cluster=cluster)))
        device = result.summary()["devices"][0]
        print(f"{what}, {name}: iteration {result.iteration_time_s:.4f} s, "
              f"communication {device['communication_s']:.4f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=["405b", "tp16", "ep64"], choices=["405b", "tp16", "ep64"])
    args = parser.parse_args()
    if "tp16" in args.only:
        scale_up(TP16, CLUSTERS, "70B-like TP 16")
    if "ep64" in args.only:
        scale_up(EP64, EP_CLUSTERS, "DeepSeek-V3-like EP 64")
    if "405b" in args.only:
        llama_405b()


if __name__ == "__main__":
    main()
