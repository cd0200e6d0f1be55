"""Where NCCL's model moves an all-reduce from the tree to the ring, and the bus bandwidth it predicts.

For 2 to 1,024 nodes of 8 H100 (and of 8 A100) this prints, from ``sim.cost.nccl`` (NCCL's
``ncclTopoTuneModel`` at NVIDIA/nccl 5067397c): the all-reduce size from which the ring stays
faster than the double binary tree, and the algorithm, protocol and nccl-tests bus bandwidth
the tuner's choice reaches at 1 MiB, 64 MiB and 1 GiB. Then a few published nccl-tests figures
next to the model's for the same set-up. The model is NCCL's own estimate, which is what its
tuner acts on; measured figures fall below it (protocol overheads it leaves out).

Set-ups as NCCL rates the links (``src/graph/topo.h``, ``topo.cc``): H100 18 NVLink4 links of
20.6 GB/s (370.8 GB/s), NVSwitch with NVLink SHARP, one 400 Gb/s NIC per GPU (50 GB/s); A100
12 NVLink3 links of 20.0 GB/s (240 GB/s), one 200 Gb/s NIC per GPU (25 GB/s); link latencies 0
(NCCL's own per-hop constants only; InfiniBand reports none).

    python benchmarks/nccl_crossover.py [--nodes 2 4 ... 1024]
"""

from __future__ import annotations

import argparse

from sim.cost.nccl import InterTier, IntraTier, collective, tree_ring_crossover_bytes

MIB = 2**20
SIZES = {"1 MiB": MIB, "64 MiB": 64 * MIB, "1 GiB": 1024 * MIB}
SETUPS = {
    "8x H100": ("hopper", IntraTier(bandwidth_bytes_per_s=18 * 20.6e9, nvls=True), 400e9 / 8),
    "8x A100": ("ampere", IntraTier(bandwidth_bytes_per_s=12 * 20.0e9), 200e9 / 8),
}
"""Set-up name -> (NCCL generation, intra tier, NIC bandwidth per GPU in bytes/s)."""

PUBLISHED = (
    # (what, generation, ranks per node, nodes, intra, NIC bytes/s per GPU, algorithm, bytes, busbw GB/s, source)
    ("8 H100, one node, ring", "hopper", 8, 1, IntraTier(bandwidth_bytes_per_s=370.8e9), 50e9, "ring", 1024 * MIB,
     370.0, "nccl-tests #212, sjeaugey 2024-05-06: 'effective NVLink bandwidth of 370GB/s' (NCCL_ALGO=RING)"),
    ("8 H100, one node, NVLS", "hopper", 8, 1, IntraTier(bandwidth_bytes_per_s=370.8e9, nvls=True), 50e9, "nvls",
     8192 * MIB, 480.0, "nccl-tests #212, sjeaugey 2024-05-06: 'peak busBw of ~480GB/s' at large sizes"),
    ("5 x 8 H100, 4x400G RoCE, ring", "hopper", 8, 5, IntraTier(bandwidth_bytes_per_s=370.8e9), 4 * 50e9 / 8,
     "ring", 1024 * MIB, 190.0, "nccl #1368, 2024-07-18: ring 190 GB/s busbw (-e 1G)"),
    ("5 x 8 H100, 4x400G RoCE, tree", "hopper", 8, 5, IntraTier(bandwidth_bytes_per_s=370.8e9), 4 * 50e9 / 8,
     "tree", 1024 * MIB, 150.0, "nccl #1368, 2024-07-18: tree 150 GB/s busbw"),
    ("5 x 8 H100, 4x400G RoCE, ring", "hopper", 8, 5, IntraTier(bandwidth_bytes_per_s=370.8e9), 4 * 50e9 / 8,
     "ring", MIB, 5.76, "nccl #1368, 2024-07-18: ring 5.76 GB/s busbw at 1048576 B"),
    ("2 x 8 A100, 4x200G IB", "ampere", 8, 2, IntraTier(bandwidth_bytes_per_s=240e9), 4 * 25e9 / 8, "auto",
     1024 * MIB, 91.0, "nccl-tests #100, 2022-01-17: 91 GB/s busbw at 1-8 GiB (user's report, NCCL of 2022; today's "
     "tuner runs a 2-node tree at up to 2x the network, sjeaugey in nccl #946)"),
)
"""Published nccl-tests all-reduce figures found in stored copies of NVIDIA's issue threads."""


def _bytes(value: float) -> str:
    if value == float("inf"):
        return "> 16 TiB"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def crossover_table(nodes_list: list[int]) -> list[str]:
    lines = []
    for name, (generation, intra, nic) in SETUPS.items():
        inter = InterTier(bandwidth_bytes_per_s=nic)
        lines.append(f"{name} per node: all-reduce crossover tree -> ring, and the tuner's choice (busbw GB/s)")
        lines.append(f"{'nodes':>6} {'crossover':>10}  " + "  ".join(f"{label:>22}" for label in SIZES))
        for nodes in nodes_list:
            crossover = tree_ring_crossover_bytes(8, nodes, intra, inter, generation=generation)
            cells = []
            for size in SIZES.values():
                best = collective("all-reduce", 8, nodes, size, intra, inter, generation=generation)
                cells.append(f"{best.algorithm}/{best.protocol} {best.bus_bandwidth_bytes_per_s / 1e9:7.1f}")
            lines.append(f"{nodes:>6} {_bytes(crossover):>10}  " + "  ".join(f"{cell:>22}" for cell in cells))
        lines.append("")
    return lines


def published_table() -> list[str]:
    lines = ["Published nccl-tests all_reduce_perf bus bandwidth next to the model's (GB/s)"]
    for what, generation, ppn, nodes, intra, nic, algorithm, size, measured, source in PUBLISHED:
        got = collective("all-reduce", ppn, nodes, size, intra, InterTier(bandwidth_bytes_per_s=nic),
                         algorithm=algorithm, generation=generation)
        lines.append(f"  {what:<32} {_bytes(size):>9}  model {got.bus_bandwidth_bytes_per_s / 1e9:7.1f}"
                     f" ({got.algorithm}/{got.protocol})  published {measured:7.2f}  [{source}]")
    lines.append("  (per NIC: 400 Gb/s NDR should reach 46-48 GB/s, nccl-tests #290, AddyLaddy 2025-03-03)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2**k for k in range(1, 11)])
    args = parser.parse_args()
    print("\n".join(crossover_table(args.nodes) + published_table()))


if __name__ == "__main__":
    main()
