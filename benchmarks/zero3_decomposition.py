"""What a ZeRO-3 prediction charges per iteration, next to ZeRO's closed form (issue 29, item 3).

For each of SC21 Table 2's ZeRO-3 scenarios (Narayanan et al. 2021, arXiv 2104.04473,
``scenarios/published/narayanan2021_t2_*_zero3.yaml``) it prints, per device: the compute, each
group collective (the ``FS`` all-gathers of the forward and the backward) and the gradient
reduce-scatter alone, with the link their slowest flow crosses and its bytes, whether the
replay hid them (exposed communication, iteration time), and ZeRO's closed form
``3 · 2Ψ · (n−1)/n`` bytes per device per micro-batch over one NIC (Rajbhandari et al. 2020,
§7.2.2) and over a server's eight (NCCL's hierarchical path). ``--set plan.fsdp.path=hierarchical``
and the like show what each of ``sim.cost.zero3``'s settings moves.

    python benchmarks/zero3_decomposition.py [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.engine.compile import compile_workload  # noqa: E402
from sim.engine.rules import collective_alone_s, flow_alone_s  # noqa: E402
from sim.engine.run import run_scenario  # noqa: E402
from sim.engine.workload import COMPUTE  # noqa: E402
from sim.input.scenario import load_scenario  # noqa: E402

SCENARIOS = sorted((ROOT / "scenarios" / "published").glob("narayanan2021_t2_*_zero3.yaml"))


def _slowest(workload, collective) -> str:
    """The slowest flow of each phase: its seconds alone, bytes and the port kind it crosses."""
    parts = []
    for members, _ in collective.phases:
        kind = max((workload.kinds[k] for k in members), key=flow_alone_s)
        parts.append(f"{flow_alone_s(kind):.2f} s for {kind.bytes / 1e9:.1f} GB")
    return "; ".join(parts)


def decompose(path: Path, overrides: dict[str, str]) -> list[str]:
    scenario = load_scenario(path, overrides=overrides)
    workload = compile_workload(scenario, contention=False)
    summary = run_scenario(scenario, engine="fast").summarize()
    ops = workload.classes[0].ops
    n = scenario.plan.num_replicas(0)
    model = scenario.resolved.model
    psi2 = model.param_bytes(0, len(model.layers))
    nic = scenario.cluster.inter_node.bandwidth_bytes_per_s
    lines = [f"{scenario.name}: {n} GPUs, {workload.num_microbatches} micro-batch(es), 2Ψ = {psi2 / 1e9:.0f} GB, "
             f"fsdp {scenario.plan.fsdp.to_json()}",
             f"  compute {sum(op.duration_s for op in ops if op.code == COMPUTE):.2f} s"]
    for c in workload.group_collectives:
        lines.append(f"  gather {c.index} (per action): {collective_alone_s(workload.kinds, c):.2f} s alone "
                     f"[{_slowest(workload, c)}]")
    for c in workload.collectives:
        lines.append(f"  reduce-scatter: {collective_alone_s(workload.kinds, c):.2f} s alone [{_slowest(workload, c)}]")
    closed = 3 * psi2 * (n - 1) / n / nic
    lines.append(f"  iteration {summary.iteration_time_s:.2f} s, exposed communication "
                 f"{summary.exposed_communication_s:.2f} s; closed form 3·2Ψ(n−1)/n: {closed:.1f} s over one "
                 f"{nic / 1e9:.0f} GB/s NIC, {closed / 8:.2f} s over a server's eight")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a scenario key")
    args = parser.parse_args(argv)
    overrides = dict(item.split("=", 1) for item in args.set)
    for path in SCENARIOS:
        print("\n".join(decompose(path, overrides)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
