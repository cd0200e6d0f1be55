"""Benchmark a 16,384-GPU MoE replay: DeepSeek-V3-like on 2,048 servers of 8 H800, EP 64 across servers.

Issue 31's acceptance: "a 16,384-GPU MoE scenario simulates in <= 60 s on 2 cores". The case is
``scenarios/deepseek_v3_h800_ep64.yaml`` (671B, 256 routed experts of which 8 a token, the
report's pipeline 16 and expert parallelism 64 over 8 servers, ZeRO-1) grown from 128 to 1,024
replicas (2,048 nodes), 64 micro-batches of one sequence a replica. Every device dispatches and
combines its tokens with an all-to-all over its 64-device expert group (8 servers: NVLink inside,
the NICs across), which the SimPy engine replays as flows that share ports.

Regimes: ``symmetric`` (no faults: one class a stage) and ``straggler`` (device 70 runs 1.5
times slower: the classes split where its waits reach; with contention the optimistic classes
first, as ``sim.engine.run.run_scenario`` does). Engines: ``simpy`` (with contention) and
``fast`` (the vectorised fast path, no contention). Each row prints the replay's wall time and
its ratio to a reference run in the same process (the shipped 2,048-GPU scenario on the fast
path), since the machine is shared and noisy. Times are printed, never asserted.

The straggler row with contention replays 1,040 classes (16 stages x 64, plus one a stage for the
15 untouched expert groups of 64), and that is the coarsest exact partition, not a refinement gone
too far. Each all-to-all is replayed as ring flows inside a server and rail flows to the same rank
on the next server (``sim.engine.groups._expert_all_to_all``): over an expert group of 8 servers
a directed 8 x 8 torus, whose only symmetries are its translations. None but the identity keeps
the straggler in place, so every peer sits differently with respect to it (the straggler's late
flows load its ring and rail neighbours' ports, and theirs load the next ones'), and down the
pipeline the replica chains carry the mark into each stage's group; colour refinement finds
exactly these classes, the coarsest equitable partition. Dropping the all-to-alls' flows from the
optimistic refinement, as it drops the gradient rings, gives 32 classes at 2,048 GPUs but changes
the replay (device 0's out-of-memory instant 0.694 s -> 0.926 s) and deadlocks a 64-GPU version
of the case, which the replay's sibling check does not catch (``tests/test_moe_straggler_classes.py``).
The replay's per-device summaries (busy, idle, peaks and their instants) of the peers do coincide
on this case: 34 distinct among 2,048 devices at 2,048 GPUs (the untouched groups, the
straggler's chain device and its group's other members in the first and last stages; the
untouched groups and the straggler's whole group in the others). A merge by the contention-free
rules (``refine_behaviour``: 48 classes) might then hold here, but it would need a check the
replay lacks (that every merged flow's rate history equals its peers'); without one it is not
made. What is left to cut is each class's flows' cost in the port-sharing model, not their count.

    python benchmarks/moe_bench.py [--gpus 2048 16384] [--regimes symmetric straggler] [--engines simpy fast]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from sim.engine.run import run_scenario
from sim.input.scenario import load_scenario, parse_scenario
from sim.input.yaml_text import load_yaml

SHIPPED = Path(__file__).resolve().parents[1] / "scenarios" / "deepseek_v3_h800_ep64.yaml"
"""The 2,048-GPU scenario the case grows (and the reference run)."""
TARGET_S = 60.0
"""The issue's target for one 16,384-GPU replay, seconds on 2 cores."""
MICROBATCHES = 64
"""Micro-batches of one sequence per replica an iteration."""
FAULTS = {"symmetric": [], "straggler": [{"type": "straggler", "device": 70, "slowdown": 1.5}]}


def case(gpus: int, regime: str):
    """The shipped DeepSeek-V3 scenario on ``gpus`` GPUs (pipeline 16, EP 64, data over the rest)."""
    data = load_yaml(SHIPPED.read_text(), where=str(SHIPPED))
    replicas = gpus // data["plan"]["pipeline_parallel"]
    data["name"] = f"deepseek-v3-{gpus}-{regime}"
    data["cluster"]["nodes"] = gpus // 8
    data["plan"]["data_parallel"] = replicas
    data["training"] = {"global_batch_size": replicas * MICROBATCHES, "microbatch_size": replicas}
    data["faults"] = FAULTS[regime]
    return parse_scenario(_dump(data), source=f"moe-bench-{gpus}")


def _dump(data) -> str:
    """``data`` as YAML flow text for ``parse_scenario`` (JSON is a subset of YAML)."""
    return json.dumps(data)


def _reference_s() -> float:
    """Seconds of a fixed unit of work: the shipped 2,048-GPU scenario on the fast path."""
    scenario = load_scenario(SHIPPED)
    started = time.perf_counter()
    run_scenario(scenario, engine="fast")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[16384])
    parser.add_argument("--regimes", nargs="+", default=list(FAULTS), choices=list(FAULTS))
    parser.add_argument("--engines", nargs="+", default=["simpy", "fast"], choices=["simpy", "fast"])
    args = parser.parse_args()
    reference = _reference_s()
    print(f"reference: {reference:.3f} s (the shipped 2,048-GPU DeepSeek-V3 scenario, fast path)")
    print(f"  {'GPUs':>6} {'regime':>10} {'engine':>6} {'classes':>7} {'iteration':>9} {'wall s':>7} {'x ref':>6}")
    for gpus in args.gpus:
        for regime in args.regimes:
            for engine in args.engines:
                scenario = case(gpus, regime)
                started = time.perf_counter()
                result = run_scenario(scenario, engine=engine)
                wall = time.perf_counter() - started
                verdict = "" if gpus < 16384 else ("  met" if wall <= TARGET_S else "  MISSED")
                print(f"  {gpus:>6,} {regime:>10} {engine:>6} {result.summarize().device_classes:>7} "
                      f"{result.iteration_time_s:>8.3f}s {wall:>7.2f} {wall / reference:>6.1f}{verdict}")
    print(f"target: one 16,384-GPU replay <= {TARGET_S:.0f} s on 2 cores")


if __name__ == "__main__":
    main()
