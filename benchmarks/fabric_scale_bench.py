"""Issue 32 item 6: 16,384 GPUs on a three-tier fabric, with symmetry and with one slow uplink.

The case is ``scenarios/llama3_405b_h100_fabric.yaml``: Llama 3 405B on the ``llama3-roce-h100``
preset (racks of 2 servers, pods of 192 racks, 1:7 from the pods to the core; 2,048 servers of
8 H100), TP 8 × PP 16 × DP 128, 16 micro-batches. Regimes:

* ``symmetric``: no faults, one class per stage and position (goal: 60 s);
* ``slow-uplink``: pod 0's uplinks to the core at a quarter of their capacity
  (``{type: slow_link, tier: pod, index: 0, factor: 0.25}``; goal: 120 s). With contention the
  optimistic classes are not tried over a fabric's modelled uplinks (``port_split`` knows a
  flow's two ports only): the equitable classes are replayed; the fast path needs only the
  classes that wait for the slow link (``Symmetry.behaviour``).

Each row runs on the SimPy engine (with contention) and the fast path, and prints wall seconds
(compile and replay together, as ``run_scenario`` does them: a faulted scenario's fault-free
baseline too), device classes, actions (every op of every device) and the ratio of its seconds
to a reference run in the same process just before it: the same plan with ``fabric: null``
(the servers on one non-blocking switch; for the slow uplink, with NIC 0 slowed instead), so the
ratio is what the fabric costs, whatever the machine's load. Times are printed, never asserted.

    python benchmarks/fabric_scale_bench.py [--regimes symmetric slow-uplink] [--engines simpy fast]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from sim.core.faults import SlowLink
from sim.engine.run import run_scenario
from sim.input.scenario import load_scenario

REPO = Path(__file__).resolve().parent.parent
SCENARIO = REPO / "scenarios" / "llama3_405b_h100_fabric.yaml"
GOALS_S = {"symmetric": 60.0, "slow-uplink": 120.0}
"""Issue 32 item 6's goals, seconds."""


def regime(scenario, name: str):
    """``scenario`` in regime ``name``: the slow uplink is pod 0's (tier 1) at a quarter; without a
    fabric (the reference), NIC 0 at a quarter, a fault that splits the classes alike."""
    if name == "slow-uplink":
        fault = SlowLink(tier=1, index=0, factor=0.25) if scenario.cluster.fabric else SlowLink(nic=0, factor=0.25)
        return replace(scenario, faults=(fault,))
    return scenario


def timed(scenario, engine: str):
    start = time.perf_counter()
    result = run_scenario(scenario, engine=engine)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regimes", nargs="+", default=list(GOALS_S), choices=list(GOALS_S))
    parser.add_argument("--engines", nargs="+", default=["simpy", "fast"], choices=["simpy", "fast"])
    args = parser.parse_args()
    base = load_scenario(SCENARIO)
    flat = replace(base, cluster=replace(base.cluster, fabric=None))
    for name in args.regimes:
        for engine in args.engines:
            reference_s, _ = timed(regime(flat, name), engine)
            seconds, result = timed(regime(base, name), engine)
            classes = result.workload.classes
            actions = sum(len(c.ops) * len(c.devices) for c in classes)
            print(f"{name:<12} {engine:<6} {seconds:7.1f} s (goal {GOALS_S[name]:g} s)  {len(classes):6d} classes  "
                  f"{actions:>11,d} actions (events)  iteration {result.iteration_time_s:.4f} s  "
                  f"{seconds / reference_s:.2f}x the same plan without a fabric ({reference_s:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
