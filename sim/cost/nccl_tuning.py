"""NCCL's tuning constants, as its cost model (``ncclTopoTuneModel``) reads them.

NCCL prices every (collective, algorithm, protocol) once when a communicator is made: a
latency (a base per algorithm and protocol, plus a hardware latency per hop of NVLink, PCIe
or the network) and a bus bandwidth (the topology's per-channel bandwidth times the number
of channels, with corrections per algorithm and protocol). ``sim.cost.nccl`` turns them into
seconds. The figures are copied as numbers (not code) from NVIDIA/nccl ``src/graph/tuning.cc``
at commit 5067397c2676d5aed50042fc39e5c8ee96eb0027 (June 2026, "Merge nccl4py v0.3.1
release to master"), ``ncclTunerConstantsDefaults`` unless said otherwise; microseconds and
GB/s (10⁹ bytes/s) as NCCL writes them. Each tuple is indexed by protocol in NCCL's order
(``PROTOCOLS``: LL, LL128, Simple); each generation's triple by node count (N1: one node,
N2: two, N4: more).
"""

from __future__ import annotations

from types import MappingProxyType

__all__ = ["BASE_LATENCY_US", "GENERATIONS", "HW_LATENCY_US", "LL_MAX_BW_GBPS", "NET_OVERHEAD_US",
           "NVLS_EFFICIENCY", "PER_CHANNEL_MAX_NVLS_TREE_GBPS", "PER_CHANNEL_MAX_RING_LL128_GBPS",
           "PER_CHANNEL_MAX_TREE_GBPS", "PER_CHANNEL_MAX_TREE_LL128_GBPS", "PROTOCOLS", "RING_PLATEAU",
           "TREE_CORRECTION"]

PROTOCOLS = ("LL", "LL128", "Simple")
"""NCCL's protocols in its index order (``NCCL_PROTO_LL``, ``_LL128``, ``_SIMPLE``): LL sends 8
bytes of data with 8 of flags, LL128 120 of every 128 bytes, Simple whole chunks behind a
fence (more bandwidth, more latency per step)."""

GENERATIONS = ("volta", "ampere", "hopper", "blackwell")
"""GPU generations NCCL's tables distinguish (``compCapIndex``: SM70, SM80, SM90, SM100)."""

BASE_LATENCY_US = MappingProxyType({
    "tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0)})
"""``baseLatencies``: the fixed cost of launching one collective, µs."""

HW_LATENCY_US = MappingProxyType({
    "nvlink": MappingProxyType({"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4),
                                "nvls": (0.0, 0.0, 25.0), "nvls_tree": (0.0, 0.0, 25.0)}),
    "pci": MappingProxyType({"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7),
                             "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0)}),
    "net": MappingProxyType({"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0),
                             "nvls": (0.0, 0.0, 18.0), "nvls_tree": (0.0, 0.0, 20.9)}),
})
"""``hwLatencies``: latency of one step over an NVLink, a PCIe or a network hop, µs."""

LL_MAX_BW_GBPS = MappingProxyType({
    "single_node": MappingProxyType({"volta": 39.0, "ampere": 87.7, "hopper": 141.0, "blackwell": 282.0}),
    "two_nodes": 39.0, "more_nodes": 20.4})
"""``llMaxBws``: the most bus bandwidth LL reaches, GB/s. On one node NCCL reads the GPU's row
(column N1); across nodes the host CPU's (row 0, Intel, columns N2 and N4): an Intel host is
assumed (AMD hosts' row: 22.5 and 19.0 on Ampere's row, not modelled)."""

PER_CHANNEL_MAX_RING_LL128_GBPS = MappingProxyType({"volta": 20.0, "ampere": 20.0, "hopper": 36.7,
                                                    "blackwell": 40.0})
"""``perChMaxRingLL128Bws``: LL128 ring bandwidth cap per channel, GB/s (the same for N1, N2, N4)."""

PER_CHANNEL_MAX_TREE_LL128_GBPS = MappingProxyType({
    "volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 29.0),
    "blackwell": (55.6, 31.67, 20.0)})
"""``perChMaxTreeLL128Bws``: LL128 tree bandwidth cap per channel, GB/s, by (N1, N2, N4)."""

PER_CHANNEL_MAX_TREE_GBPS = MappingProxyType({
    "volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0),
    "blackwell": (70.0, 42.8, 24.0)})
"""``perChMaxTreeBws``: tree all-reduce bandwidth cap per channel, GB/s, by (N1, N2, N4)."""

PER_CHANNEL_MAX_NVLS_TREE_GBPS = MappingProxyType({
    "volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8), "hopper": (0.0, 57.7, 45.5),
    "blackwell": (0.0, 96.0, 80.0)})
"""``perChMaxNVLSTreeBws``: NVLS-tree bandwidth cap per channel, GB/s, by (N1, N2, N4)."""

NVLS_EFFICIENCY = MappingProxyType({"volta": 0.0, "ampere": 0.0, "hopper": 0.85, "blackwell": 0.74})
"""``nvlsEfficiency``: the share of NVLink bandwidth NVLink SHARP reaches; 0: no NVLS (NVSwitch
with in-switch reduction came with Hopper's third-generation NVSwitch)."""

NET_OVERHEAD_US = 1.0
"""``getNetOverhead``: the CPU's cost of posting one network operation on an Intel x86 host (2.0
on AMD), µs; a multi-node ring's intra-node step costs at least this, three times it under
Simple (``ncclTopoTuneModel``)."""

RING_PLATEAU = MappingProxyType({"volta": 1.9, "ampere": 1.4, "hopper": 1.4, "blackwell": 1.4})
"""``ncclTopoGetAlgoTime``: a multi-node Simple ring all-reduce's latency is multiplied by this
once each channel's share per rank reaches 64 bytes ("Plateau effect of ring"; 1.9 below SM80)."""

TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)
"""``treeCorrectionFactor`` (tuning.cc): the share of its modelled bandwidth a tree all-reduce
reaches at medium sizes, by protocol and by ``log2(bytes / 64)`` from 0 (64 B) to 22 (256 MiB);
"Trees are not perfectly sticking to the model for medium sizes"."""
