"""Collectives by algorithm, priced as NCCL prices them and chosen by size as its tuner does.

*Ring.* The n ranks pass shards around a circle: an all-reduce is a reduce-scatter then an
all-gather, ``2(n−1)`` steps in which each rank sends ``2(n−1)/n · S`` (Patarasuk & Yuan,
JPDC 2009, §3): ``t = 2(n−1)·α + 2(n−1)/n · S / B``. No algorithm moves fewer bytes per rank,
so the ring wins when S is large, but its latency grows linearly with n.

*Double binary tree.* Across nodes NCCL reduces up two complementary binary trees (each
carrying half of the data, so every node is a leaf in one and an inner node in the other) and
broadcasts back down (Sanders, Speck & Träff, "Two-tree algorithms for full bandwidth
broadcast, reduction and scan", Parallel Computing 2009; NCCL 2.4, NVIDIA developer blog
"Massively Scale Your Deep Learning Training with NCCL 2.4", 2019): a chain inside each node
and ``log2(nodes)`` network hops up and as many down, ``t ≈ 2(ppn−1 + log2(nodes))·α + S /
B_tree``, with ``B_tree`` about half the bus bandwidth (NCCL's ``ratio = .5``, times 0.92 and a
correction at medium sizes). Logarithmic latency, but fewer bytes per second than a ring:
*the crossover*. Below some size the tree's ``log2`` latency wins, above it the ring's
bandwidth, and the crossover size grows with the number of nodes (the ring's latency grows
as 2·nodes, the tree's as 2·log2(nodes)).

*NVLS* (NVLink SHARP, Hopper's third-generation NVSwitch): the switch reduces what the GPUs
write to it and multicasts the sum back, so each GPU sends its data once and receives the
result once, at the ``nvlsEfficiency`` share of NVLink's bandwidth and a flat 25 µs latency;
across nodes *NVLS tree* reduces inside each node on the switch and runs a tree between nodes.

NCCL's model (NVIDIA/nccl ``src/graph/tuning.cc`` at 5067397c, ``ncclTopoTuneModel`` and
``ncclTopoGetAlgoTime``; constants in ``sim.cost.nccl_tuning``): ``time = latency + bytes /
algorithm bandwidth`` with ``algorithm bandwidth = bus bandwidth · n / nsteps`` for ring and
NVLS (nsteps ``2(n−1)`` for an all-reduce, ``n−1`` for an all-gather or reduce-scatter, n for
a broadcast) and half of it for the tree; the tuner (``topoGetAlgoInfo`` in ``src/enqueue.cc``)
takes the smallest time over every enabled (algorithm, protocol), trees first on ties. The tree
runs all-reduce only; NVLS all-gather and reduce-scatter only inside one node (across nodes
they need CollNet); Broadcast the ring only.

What is approximated: NCCL's topology search (``src/graph/search.cc``) finds channels and a
per-channel bandwidth; here the bus bandwidth is given (intra tier: a GPU's NVLink or PCIe
bandwidth, NCCL's effective figure; inter tier: a GPU's NIC, so a node sends
``ranks_per_node ×`` it) and a ring across nodes runs at the lesser of the two, as the search
sets a ring's bwIntra equal to its bwInter; a tree on ≤ 2 nodes and an NVLS tree may go up to
twice the network's (search.cc raises those graphs' other bandwidth to at most 2×). ``channels``
(default 16) only sets the per-channel caps, NVLS's ``(c−1)/c`` and the ring's plateau test.
CollNet (InfiniBand SHARP) and PAT (one GPU per node) are not modelled; a tree is NCCL's
balanced pattern (no 0.85 of the plain tree pattern); the host is Intel x86; LL128 runs where
the GPUs share NVLink. A tier's ``latency_s`` is the wire's, added to NCCL's per-hop constants
(NCCL's ``latencyInter``, 0 for InfiniBand: ``net_ib/init.cc`` reports ``latency = 0``), also
inside a node where NCCL adds none, so 0 gives NCCL's own model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sim.core.errors import SpecError
from sim.core.specs import non_negative, positive, positive_int
from sim.cost import nccl_tuning as T
from sim.cost.links import busiest_nic_flows

if TYPE_CHECKING:
    from sim.core.specs import ClusterSpec

__all__ = ["ALGORITHMS", "KINDS", "InterTier", "IntraTier", "NcclCost", "bus_factor", "candidates",
           "cluster_collective", "cluster_tiers", "collective", "device_generation",
           "tree_ring_crossover_bytes"]

ALGORITHMS = ("auto", "ring", "tree", "nvls")
"""What ``collective`` accepts: ``auto`` (NCCL's tuner), or one algorithm forced, as
``NCCL_ALGO`` does (``nvls`` is NVLS on one node, NVLS tree across nodes)."""

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "broadcast")
"""Collectives priced; ``nbytes`` is NCCL's (and nccl-tests' ``size``): the all-reduced or
broadcast buffer, the gathered whole of an all-gather or reduce-scatter."""


@dataclass(frozen=True, slots=True, kw_only=True)
class IntraTier:
    """The GPUs of one node to each other."""

    bandwidth_bytes_per_s: float
    """Bus bandwidth a ring reaches through one GPU's port (NVLink: about 370 GB/s of H100's
    450 GB/s line rate, nccl-tests issue #212), bytes/s."""
    latency_s: float = 0.0
    """Wire latency per step, added to NCCL's per-hop constant, seconds."""
    nvlink: bool = True
    """NVLink (NCCL's ``LINK_NVL`` hop latencies, LL128 enabled) rather than PCIe."""
    nvls: bool = False
    """The node's NVSwitch reduces in the switch (NVLink SHARP: Hopper and later)."""

    def __post_init__(self) -> None:
        positive("intra.bandwidth_bytes_per_s", self.bandwidth_bytes_per_s)
        non_negative("intra.latency_s", self.latency_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class InterTier:
    """The nodes to each other: each GPU's share of its node's NICs."""

    bandwidth_bytes_per_s: float
    """Bandwidth of one GPU's NIC (or its share of one), one direction, bytes/s."""
    latency_s: float = 0.0
    """Wire latency per network step, added to NCCL's per-hop constant (twice under Simple:
    NCCL's flush), seconds."""

    def __post_init__(self) -> None:
        positive("inter.bandwidth_bytes_per_s", self.bandwidth_bytes_per_s)
        non_negative("inter.latency_s", self.latency_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclCost:
    """One collective priced by NCCL's model: the algorithm and protocol and what they take."""

    kind: str
    """The collective (``KINDS``)."""
    algorithm: str
    """``ring``, ``tree``, ``nvls`` (one node) or ``nvls_tree`` (across nodes)."""
    protocol: str
    """``LL``, ``LL128`` or ``Simple`` (``sim.cost.nccl_tuning.PROTOCOLS``)."""
    seconds: float
    """Predicted time of the collective alone: ``latency_s + nbytes / algorithm bandwidth``, s."""
    latency_s: float
    """Its latency part, seconds."""
    bus_bandwidth_bytes_per_s: float
    """nccl-tests' bus bandwidth of that time: ``nbytes / seconds · bus_factor``, bytes/s."""


def bus_factor(kind: str, ranks: int) -> float:
    """nccl-tests' ``busbw = algbw · factor`` (its ``doc/PERFORMANCE.md``): ``2(n−1)/n`` for an
    all-reduce, ``(n−1)/n`` for an all-gather or reduce-scatter, 1 for a broadcast."""
    return {"all-reduce": 2 * (ranks - 1) / ranks, "broadcast": 1.0}.get(kind, (ranks - 1) / ranks)


def _log2i(value: int) -> int:
    """NCCL's ``log2i`` (``log2Down``): floor of log2, −1 for 0."""
    return int(value).bit_length() - 1


def _node_column(nodes: int) -> int:
    """NCCL's ``index2``: column N1, N2 or N4 of a per-generation triple."""
    return min(nodes, 3) - 1


def _check(kind, ranks_per_node, nodes, nbytes, generation, channels) -> None:
    if kind not in KINDS:
        raise SpecError("kind", f"unknown collective {kind!r}; use one of {', '.join(KINDS)}")
    positive_int("ranks_per_node", ranks_per_node)
    positive_int("nodes", nodes)
    non_negative("nbytes", nbytes)
    if generation not in T.GENERATIONS:
        raise SpecError("generation", f"unknown GPU generation {generation!r}; use one of {', '.join(T.GENERATIONS)}")
    positive_int("channels", channels)


def _ring(kind, p, ppn, nodes, nbytes, intra, inter, generation, channels):
    """(latency s, algorithm bandwidth bytes/s) of a ring under protocol index ``p``."""
    n = ppn * nodes
    simple = T.PROTOCOLS[p] == "Simple"
    bus = intra.bandwidth_bytes_per_s if nodes == 1 else min(intra.bandwidth_bytes_per_s,
                                                             ppn * inter.bandwidth_bytes_per_s)
    if T.PROTOCOLS[p] == "LL":
        bus = min(_ll_max_bps(nodes, generation), bus * 0.5)
    elif T.PROTOCOLS[p] == "LL128":
        bus = min(bus * 0.92, channels * T.PER_CHANNEL_MAX_RING_LL128_GBPS[generation] * 1e9)
    hop = "nvlink" if intra.nvlink else "pci"
    net_lat = (T.HW_LATENCY_US["net"]["tree" if ppn == 1 else "ring"][p] * 1e-6
               + inter.latency_s * (2 if simple else 1))
    latency = T.BASE_LATENCY_US["ring"][p] * 1e-6
    if kind == "broadcast":
        # a pipelined chain of n steps at the hop's latency, Simple at the tree's (tuning.cc:
        # "Add some chunk latency, waiting for proper chunk modeling"; not sameChannels assumed)
        step = T.HW_LATENCY_US["net" if nodes > 1 else hop]["tree" if simple else "ring"][p] * 1e-6
        step += inter.latency_s if nodes > 1 else intra.latency_s
        return latency + n * step, bus
    nsteps = 2 * (n - 1) if kind == "all-reduce" else n - 1
    inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if kind == "all-reduce" else nodes - 1)
    intra_lat = T.HW_LATENCY_US[hop]["ring"][p] * 1e-6 + intra.latency_s
    if nodes > 1:  # "Inter-node rings still have to launch nsteps * net overhead."
        intra_lat = max(intra_lat, T.NET_OVERHEAD_US * (3 if simple else 1) * 1e-6)
    latency += (nsteps - inter_steps) * intra_lat + inter_steps * net_lat
    if simple and nodes > 1 and kind == "all-reduce" and int(nbytes) // (channels * n) >= 64:
        latency *= T.RING_PLATEAU[generation]
    return latency, bus * n / nsteps


def _ll_max_bps(nodes: int, generation: str) -> float:
    if nodes == 1:
        return T.LL_MAX_BW_GBPS["single_node"][generation] * 1e9
    return (T.LL_MAX_BW_GBPS["two_nodes"] if nodes == 2 else T.LL_MAX_BW_GBPS["more_nodes"]) * 1e9


def _tree(p, ppn, nodes, nbytes, intra, inter, generation, channels):
    """(latency s, algorithm bandwidth bytes/s) of a tree all-reduce under protocol index ``p``."""
    column = _node_column(nodes)
    aggregate = ppn * inter.bandwidth_bytes_per_s
    if nodes == 1:
        bus = intra.bandwidth_bytes_per_s
    else:  # trees may raise bwIntra to twice bwInter on <= 2 nodes (search.cc); else the network's
        bus = min(intra.bandwidth_bytes_per_s, aggregate * (2 if nodes <= 2 else 1))
    bus = min(bus * 0.92, channels * T.PER_CHANNEL_MAX_TREE_GBPS[generation][column] * 1e9)
    if T.PROTOCOLS[p] == "LL":
        bus = min(bus / 3.8, _ll_max_bps(nodes, generation))
    elif T.PROTOCOLS[p] == "LL128":
        bus = min(bus * (7.0 / 9.0 if nodes == 1 else 120.0 / 128.0),
                  channels * T.PER_CHANNEL_MAX_TREE_LL128_GBPS[generation][column] * 1e9)
    hop = "nvlink" if intra.nvlink else "pci"
    intra_lat = T.HW_LATENCY_US[hop]["tree"][p] * 1e-6 + intra.latency_s
    net_lat = (T.HW_LATENCY_US["net"]["tree"][p] * 1e-6
               + inter.latency_s * (2 if T.PROTOCOLS[p] == "Simple" else 1))
    latency = T.BASE_LATENCY_US["tree"][p] * 1e-6 + 2 * ((ppn - 1) * intra_lat + _log2i(nodes) * net_lat)
    log_size = _log2i(int(nbytes) >> 6)
    correction = T.TREE_CORRECTION[p][log_size] if 0 <= log_size < 23 else 1.0
    return latency, bus * 0.5 * correction


def _nvls(kind, ppn, nodes, intra, inter, generation, channels):
    """(latency s, algorithm bandwidth bytes/s) of NVLS (one node) or NVLS tree (several), Simple."""
    n = ppn * nodes
    intra_bw = intra.bandwidth_bytes_per_s * T.NVLS_EFFICIENCY[generation] * (channels - 1) / channels
    intra_bw *= 2.0 if kind == "all-reduce" else (ppn - 1) / ppn  # "AllReduce pipelines two operations."
    net_lat = T.HW_LATENCY_US["net"]["nvls_tree" if nodes > 1 else "nvls"][2] * 1e-6 + 2 * inter.latency_s
    if nodes == 1:  # the NVLS graph's bwInter may reach twice its bwIntra (search.cc)
        bus = min(intra_bw, 2 * intra.bandwidth_bytes_per_s)
        latency = T.HW_LATENCY_US["nvlink"]["nvls"][2] * 1e-6 + intra.latency_s
    else:
        cap = channels * T.PER_CHANNEL_MAX_NVLS_TREE_GBPS[generation][_node_column(nodes)] * 1e9
        bus = min(intra_bw, ppn * inter.bandwidth_bytes_per_s * (2 if nodes <= 2 else 1), cap)
        latency = (T.HW_LATENCY_US["nvlink"]["nvls_tree"][2] * 1e-6 + intra.latency_s
                   + 2 * _log2i(nodes) * net_lat)
    if kind == "all-reduce":
        return latency, bus * n / (2 * (n - 1))
    return latency, bus  # tuning.cc converts bus to algorithm bandwidth only for the ring's AG/RS


def _allowed(kind: str, ppn: int, nodes: int, intra: IntraTier, generation: str, channels: int) -> tuple[str, ...]:
    """Algorithms NCCL runs for ``kind`` on this topology, in its index order (tree, ring, NVLS)."""
    names = ["tree"] if kind == "all-reduce" else []
    names.append("ring")
    nvls_ok = (intra.nvls and T.NVLS_EFFICIENCY[generation] > 0 and channels >= 2 and ppn > 1
               and kind in ("all-reduce", "all-gather", "reduce-scatter"))
    if nvls_ok and (kind == "all-reduce" or (nodes == 1 and ppn <= 32)):  # NCCL_MAX_NVLS_ARITY (device.h)
        names.append("nvls")
    return tuple(names)


def candidates(kind: str, ranks_per_node: int, nodes: int, nbytes: float, intra: IntraTier, inter: InterTier, *,
               generation: str = "hopper", channels: int = 16,
               protocols: tuple[str, ...] = T.PROTOCOLS) -> tuple[NcclCost, ...]:
    """Every (algorithm, protocol) NCCL would consider for ``kind`` of ``nbytes`` over
    ``ranks_per_node`` × ``nodes`` ranks, priced, in NCCL's order (tree, ring, NVLS; LL, LL128,
    Simple). Empty for one rank (NCCL: no work)."""
    _check(kind, ranks_per_node, nodes, nbytes, generation, channels)
    for name in protocols:
        if name not in T.PROTOCOLS:
            raise SpecError("protocols", f"unknown protocol {name!r}; use some of {', '.join(T.PROTOCOLS)}")
    ppn, n = ranks_per_node, ranks_per_node * nodes
    if n == 1:
        return ()
    out = []
    for algorithm in _allowed(kind, ppn, nodes, intra, generation, channels):
        for p, protocol in enumerate(T.PROTOCOLS):
            if protocol not in protocols or (protocol == "LL128" and not intra.nvlink):
                continue
            if algorithm == "nvls":
                if protocol != "Simple":
                    continue
                latency, bw = _nvls(kind, ppn, nodes, intra, inter, generation, channels)
            elif algorithm == "tree":
                latency, bw = _tree(p, ppn, nodes, nbytes, intra, inter, generation, channels)
            else:
                latency, bw = _ring(kind, p, ppn, nodes, nbytes, intra, inter, generation, channels)
            seconds = latency + nbytes / bw
            busbw = nbytes / seconds * bus_factor(kind, n) if seconds > 0 else 0.0
            out.append(NcclCost(kind=kind, algorithm="nvls_tree" if algorithm == "nvls" and nodes > 1 else algorithm,
                                protocol=protocol, seconds=seconds, latency_s=latency,
                                bus_bandwidth_bytes_per_s=busbw))
    return tuple(out)


def collective(kind: str, ranks_per_node: int, nodes: int, nbytes: float, intra: IntraTier, inter: InterTier, *,
               algorithm: str = "auto", generation: str = "hopper", channels: int = 16,
               protocols: tuple[str, ...] = T.PROTOCOLS) -> NcclCost:
    """``kind`` of ``nbytes`` over ``ranks_per_node`` GPUs on each of ``nodes`` nodes, as NCCL
    runs it: ``algorithm="auto"`` takes the fastest of ``candidates`` (NCCL's tuner; the first on
    ties), a named one the fastest of its protocols. One rank: zero seconds."""
    if algorithm not in ALGORITHMS:
        raise SpecError("algorithm", f"unknown algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
    options = candidates(kind, ranks_per_node, nodes, nbytes, intra, inter, generation=generation,
                         channels=channels, protocols=protocols)
    if ranks_per_node * nodes == 1:
        return NcclCost(kind=kind, algorithm="ring", protocol="Simple", seconds=0.0, latency_s=0.0,
                        bus_bandwidth_bytes_per_s=0.0)
    if algorithm != "auto":
        options = tuple(c for c in options if c.algorithm.split("_")[0] == algorithm)
        if not options:
            raise SpecError("algorithm", f"{algorithm!r} does not run {kind} on {nodes} node(s) of "
                                         f"{ranks_per_node} here (NVLS needs intra.nvls on Hopper or later; "
                                         "the tree runs all-reduce only); use auto or ring")
    if not options:
        raise SpecError("protocols", f"{protocols!r} leaves no protocol for {kind}; include Simple")
    best = options[0]
    for option in options[1:]:
        if option.seconds < best.seconds:
            best = option
    return best


def device_generation(device_name: str) -> str:
    """NCCL's generation of a device named like the presets (``V100-16GB``, ``A100-80GB``,
    ``H100-80GB``, ``H800-80GB``, ``B200``, ``GB200``); any other name: ``ampere`` (no NVLS)."""
    name = device_name.upper()
    for prefix, generation in (("GB", "blackwell"), ("B", "blackwell"), ("H", "hopper"), ("V", "volta")):
        if name.startswith(prefix):
            return generation
    return "ampere"


def cluster_tiers(cluster: ClusterSpec, members_per_node: Sequence[int]) -> tuple[IntraTier, InterTier]:
    """The tiers a group of ``members_per_node[j]`` GPUs on server j crosses in today's cluster:
    inside a server the GPU port at its collective bandwidth (NCCL's effective bus bandwidth,
    ``LinkSpec.collective_efficiency``), NVLS where the port is an ``NVSwitch`` of a Hopper or
    later device; across servers each GPU's share of the NICs of the group's smallest server
    (``sim.cost.links.busiest_nic_flows``, as ``sim.cost.comm.hierarchical_allreduce``), spread
    over the widest server's GPUs so that a node sends what the smallest one can."""
    intra_link, inter_link = cluster.intra_node, cluster.inter_node
    widest, smallest = max(members_per_node), min(members_per_node)
    generation = device_generation(cluster.device.name)
    nvswitch = "nvswitch" in intra_link.name.lower()
    intra = IntraTier(bandwidth_bytes_per_s=intra_link.collective_bandwidth_bytes_per_s,
                      latency_s=intra_link.latency_s, nvlink="pcie" not in intra_link.name.lower(),
                      nvls=nvswitch and T.NVLS_EFFICIENCY[generation] > 0)
    node_bytes_per_s = (smallest * inter_link.collective_bandwidth_bytes_per_s
                        / busiest_nic_flows(cluster, smallest))
    inter = InterTier(bandwidth_bytes_per_s=node_bytes_per_s / widest, latency_s=inter_link.latency_s)
    return intra, inter


def cluster_collective(kind: str, members_per_node: Sequence[int], nbytes: float, cluster: ClusterSpec, *,
                       algorithm: str = "auto", channels: int = 16) -> NcclCost:
    """``collective`` for a group of ``members_per_node[j]`` GPUs on server j of ``cluster``
    (``cluster_tiers``; an uneven group priced as the widest server's count on every server,
    an upper bound). The entry point ``sim.cost.comm`` calls when a collective is priced by
    algorithm; nothing calls it by default (today's costs are ``comm``'s ring model)."""
    if not members_per_node or min(members_per_node) < 1:
        raise SpecError("members_per_node", f"must list at least one GPU per server, got {list(members_per_node)!r}")
    intra, inter = cluster_tiers(cluster, members_per_node)
    return collective(kind, max(members_per_node), len(members_per_node), nbytes, intra, inter, algorithm=algorithm,
                      generation=device_generation(cluster.device.name), channels=channels)


def tree_ring_crossover_bytes(ranks_per_node: int, nodes: int, intra: IntraTier, inter: InterTier, *,
                              generation: str = "hopper", channels: int = 16,
                              protocols: tuple[str, ...] = T.PROTOCOLS) -> float:
    """All-reduce size, bytes, from which the ring (its best protocol) stays faster than the tree
    (its best) up to 2⁴⁴ bytes: the last crossing, found on powers of two and bisected (the
    tree's medium-size correction can make the two cross more than once). 0: the ring wins at
    every size; ``inf``: the tree wins up to 2⁴⁴ bytes."""
    def tree_wins(nbytes: float) -> bool:
        kwargs = dict(generation=generation, channels=channels, protocols=protocols)
        tree = collective("all-reduce", ranks_per_node, nodes, nbytes, intra, inter, algorithm="tree", **kwargs)
        ring = collective("all-reduce", ranks_per_node, nodes, nbytes, intra, inter, algorithm="ring", **kwargs)
        return tree.seconds <= ring.seconds

    wins = [e for e in range(45) if tree_wins(2.0 ** e)]
    if not wins:
        return 0.0
    if wins[-1] == 44:
        return float("inf")
    low, high = 2.0 ** wins[-1], 2.0 ** (wins[-1] + 1)
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if tree_wins(middle) else (low, middle)
    return high
