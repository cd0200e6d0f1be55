"""Collectives by algorithm (sim.cost.nccl) against NCCL's model worked out by hand.

Constants from NVIDIA/nccl src/graph/tuning.cc at 5067397c (ncclTunerConstantsDefaults,
ncclTopoTuneModel, ncclTopoGetAlgoTime); H100 NVLink as NCCL rates it (src/graph/topo.h:
SM90_NVLINK_BW 20.6 GB/s a link, 18 links: 370.8 GB/s), a 400 Gb/s NIC per GPU as NCCL reads
it (topo.cc: mbps / 8000 = 50 GB/s). Latencies in µs below, as NCCL writes them.
"""

from __future__ import annotations

import math

import pytest

from conftest import load_benchmark
from sim.core.errors import DappleError, SpecError
from sim.cost.nccl import (
    InterTier,
    IntraTier,
    candidates,
    cluster_collective,
    cluster_tiers,
    collective,
    device_generation,
    tree_ring_crossover_bytes,
)
from sim.input.scenario import parse_scenario

US = 1e-6
GIB = 2**30
H100_NVLINK = 18 * 20.6e9
NIC_400G = 400e9 / 8
INTRA = IntraTier(bandwidth_bytes_per_s=H100_NVLINK)
INTER = InterTier(bandwidth_bytes_per_s=NIC_400G)
SIMPLE = ("Simple",)


def test_ring_on_one_node_is_the_alpha_beta_formula():
    # base 8.4 (Ring/Simple) + 2(n-1) NVLink steps of 3.4 µs; bytes 2(n-1)/n · S at the bus bandwidth
    n, size = 8, GIB
    got = collective("all-reduce", n, 1, size, INTRA, INTER, algorithm="ring", protocols=SIMPLE)
    expected = 8.4 * US + 2 * (n - 1) * 3.4 * US + 2 * (n - 1) / n * size / H100_NVLINK
    assert (got.algorithm, got.protocol) == ("ring", "Simple")
    assert got.seconds == pytest.approx(expected, rel=1e-12)
    # nccl-tests' busbw of that time is the bus bandwidth less the latency's share
    assert got.bus_bandwidth_bytes_per_s == pytest.approx(size / expected * 2 * (n - 1) / n, rel=1e-12)
    gather = collective("all-gather", n, 1, size, INTRA, INTER, algorithm="ring", protocols=SIMPLE)
    assert gather.seconds == pytest.approx(8.4 * US + (n - 1) * 3.4 * US + (n - 1) / n * size / H100_NVLINK)


def test_ring_across_nodes_pays_network_steps_the_net_overhead_and_the_plateau():
    # 4 nodes of 8: 2(32-1) = 62 steps, 2(4-1) = 6 of them network steps at 14 µs; intra steps at
    # max(3.4, 3 · 1.0 net overhead) = 3.4; the whole latency × 1.4 (the ring's plateau) once
    # S / (16 channels · 32 ranks) >= 64 B; bus bandwidth min(370.8, 8 · 50) GB/s.
    size = GIB
    got = collective("all-reduce", 8, 4, size, INTRA, INTER, algorithm="ring", protocols=SIMPLE)
    latency = (8.4 + (62 - 6) * 3.4 + 6 * 14.0) * 1.4 * US
    assert got.latency_s == pytest.approx(latency, rel=1e-12)
    assert got.seconds == pytest.approx(latency + 62 / 32 * size / min(H100_NVLINK, 8 * NIC_400G), rel=1e-12)
    # a tier latency is added to each network step, twice under Simple (NCCL's flush)
    slow = collective("all-reduce", 8, 4, size, INTRA, InterTier(bandwidth_bytes_per_s=NIC_400G, latency_s=2 * US),
                      algorithm="ring", protocols=SIMPLE)
    assert slow.latency_s == pytest.approx((8.4 + 56 * 3.4 + 6 * (14.0 + 4.0)) * 1.4 * US, rel=1e-12)


def test_tree_is_two_log2_network_hops_at_half_the_bus_bandwidth():
    # 4 nodes of 8, Simple, 1 GiB (above 256 MiB: no medium-size correction): base 8.4 +
    # 2((8-1) · 4.0 + log2(4) · 14); bandwidth 0.5 · 0.92 · 370.8 GB/s (the cap 16 · 36.0 does not bind)
    got = collective("all-reduce", 8, 4, GIB, INTRA, INTER, algorithm="tree", protocols=SIMPLE)
    latency = (8.4 + 2 * (7 * 4.0 + 2 * 14.0)) * US
    assert got.seconds == pytest.approx(latency + GIB / (0.5 * 0.92 * H100_NVLINK), rel=1e-12)
    # 1 MiB = 64 B · 2^14: the Simple row's correction at index 14 is 0.5
    small = collective("all-reduce", 8, 4, 2**20, INTRA, INTER, algorithm="tree", protocols=SIMPLE)
    assert small.seconds == pytest.approx(latency + 2**20 / (0.5 * 0.92 * H100_NVLINK * 0.5), rel=1e-12)


@pytest.mark.parametrize("nodes", [16, 128])
def test_tree_wins_small_messages_across_many_nodes_and_the_ring_large_ones(nodes):
    small = collective("all-reduce", 8, nodes, 2**20, INTRA, INTER)
    large = collective("all-reduce", 8, nodes, 2**40, INTRA, INTER)
    assert small.algorithm == "tree"
    assert large.algorithm == "ring"
    ring_small = collective("all-reduce", 8, nodes, 2**20, INTRA, INTER, algorithm="ring")
    assert small.seconds < ring_small.seconds


# NCCL's own crossover by hand, Simple against Simple (the protocols both sides pick there: above
# 512 MiB no tree correction applies, and the ring's LL128 bandwidth, 0.92 · 370.8 · n/(2(n-1)),
# is below the tree's Simple one, so LL128 cannot win at those sizes). With n = 8N ranks on N nodes:
#   ring latency  L_r = 1.4 · (8.4 + (2(n-1) - 2(N-1)) · 3.4 + 2(N-1) · 14)  µs
#   tree latency  L_t = 8.4 + 2 · (7 · 4.0 + log2(N) · 14)                    µs
#   ring bandwidth B_r = 370.8 · n / (2(n-1)),  tree bandwidth B_t = 0.5 · 0.92 · 370.8   GB/s
#   crossover S* = (L_r - L_t) / (1/B_t - 1/B_r)
# N = 16 (n = 128): L_r = 1.4 · (8.4 + 224 · 3.4 + 30 · 14) = 1666.0, L_t = 176.4;
#   B_r = 186.86, B_t = 170.57: S* = 1489.6e-6 / (5.8627e-12 - 5.3516e-12) = 2.91e9 B.
# N = 128 (n = 1024): L_r = 1.4 · (8.4 + 1792 · 3.4 + 254 · 14) = 13520.1, L_t = 260.4;
#   B_r = 185.58, B_t = 170.57: S* = 13259.7e-6 / (5.8627e-12 - 5.3885e-12) = 2.80e10 B.
NCCL_CROSSOVER_BYTES = {16: 2.91e9, 128: 2.80e10}


@pytest.mark.parametrize("nodes", sorted(NCCL_CROSSOVER_BYTES))
def test_crossover_lies_within_a_factor_of_two_of_nccls_model(nodes):
    hand = NCCL_CROSSOVER_BYTES[nodes]
    got = tree_ring_crossover_bytes(8, nodes, INTRA, INTER)
    assert hand / 2 <= got <= hand * 2
    # restricted to Simple the model is the hand formula itself
    assert tree_ring_crossover_bytes(8, nodes, INTRA, INTER, protocols=SIMPLE) == pytest.approx(hand, rel=0.01)


def test_the_crossover_grows_with_the_number_of_nodes():
    sizes = [tree_ring_crossover_bytes(8, nodes, INTRA, INTER) for nodes in (4, 16, 64, 256)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]


@pytest.mark.parametrize("kind", ["all-reduce", "all-gather", "reduce-scatter", "broadcast"])
@pytest.mark.parametrize("nodes,nvls", [(1, False), (1, True), (2, True), (32, False), (32, True)])
def test_auto_picks_the_fastest_candidate(kind, nodes, nvls):
    intra = IntraTier(bandwidth_bytes_per_s=H100_NVLINK, nvls=nvls)
    for size in (1 << 10, 1 << 20, 1 << 26, 1 << 30, 1 << 34):
        options = candidates(kind, 8, nodes, size, intra, INTER)
        best = collective(kind, 8, nodes, size, intra, INTER)
        assert best.seconds == min(c.seconds for c in options)
        assert kind == "all-reduce" or all(c.algorithm != "tree" for c in options)


def test_nvls_on_one_h100_node():
    # NVLS, Simple: latency 25 µs (NVLink NVLS), bus bandwidth 2 · 0.85 · 370.8 · 15/16 (16
    # channels), algorithm bandwidth × n / (2(n-1)); it wins large all-reduces on one node
    intra = IntraTier(bandwidth_bytes_per_s=H100_NVLINK, nvls=True)
    got = collective("all-reduce", 8, 1, GIB, intra, INTER, algorithm="nvls")
    bus = 2 * 0.85 * H100_NVLINK * 15 / 16
    assert got.seconds == pytest.approx(25 * US + GIB / (bus * 8 / 14), rel=1e-12)
    assert collective("all-reduce", 8, 1, GIB, intra, INTER).algorithm == "nvls"
    assert collective("all-reduce", 8, 4, GIB, intra, INTER, algorithm="nvls").algorithm == "nvls_tree"


def test_bad_input_raises_a_dapple_error_naming_the_argument():
    cases = [
        (dict(kind="all-to-all"), "kind"), (dict(ranks_per_node=0), "ranks_per_node"), (dict(nodes=-1), "nodes"),
        (dict(nbytes=-1.0), "nbytes"), (dict(algorithm="butterfly"), "algorithm"),
        (dict(generation="kepler"), "generation"), (dict(protocols=("LL256",)), "protocols"),
        (dict(kind="all-gather", algorithm="tree"), "algorithm"), (dict(algorithm="nvls"), "algorithm"),
    ]
    for change, key in cases:
        args = dict(kind="all-reduce", ranks_per_node=8, nodes=4, nbytes=1e6, intra=INTRA, inter=INTER)
        args.update(change)
        with pytest.raises(DappleError, match=key) as info:
            collective(**args)
        assert isinstance(info.value, SpecError) and info.value.key == key
    with pytest.raises(SpecError, match="intra.bandwidth_bytes_per_s"):
        IntraTier(bandwidth_bytes_per_s=0.0)
    with pytest.raises(SpecError, match="inter.latency_s"):
        InterTier(bandwidth_bytes_per_s=1e9, latency_s=math.inf)


def test_cluster_entry_point_prices_todays_cluster_spec():
    text = """
name: nccl
cluster: {preset: dgx-h100, nodes: 16}
model: {preset: llama, layers: 2, hidden: 64, heads: 4, seq_len: 32, vocab: 128}
training: {global_batch_size: 8, microbatch_size: 8}
plan: {pipeline_parallel: 1, data_parallel: 128}
"""
    cluster = parse_scenario(text, source="nccl.yaml").cluster
    intra, inter = cluster_tiers(cluster, [8] * 16)
    # the port at its collective bandwidth (450 GB/s · 0.78), NVSwitch on a Hopper: NVLS;
    # one 400 Gb/s NIC per GPU (8 a node); the links' latencies (3 µs, 5 µs) as tier latencies
    assert intra == IntraTier(bandwidth_bytes_per_s=450e9 * 0.78, latency_s=3 * US, nvlink=True, nvls=True)
    assert inter == InterTier(bandwidth_bytes_per_s=50e9, latency_s=5 * US)
    got = cluster_collective("all-reduce", [8] * 16, GIB, cluster, algorithm="ring")
    assert got == collective("all-reduce", 8, 16, GIB, intra, inter, algorithm="ring", generation="hopper")
    # two GPUs of a server share NIC 0 when a server has 4 NICs for 8 GPUs: a GPU's share halves
    four_nics = parse_scenario(text.replace("nodes: 16}", "nodes: 16, nics_per_node: 4}"), source="nccl.yaml").cluster
    assert cluster_tiers(four_nics, [8] * 16)[1].bandwidth_bytes_per_s == pytest.approx(25e9)
    assert device_generation("A100-80GB") == "ampere" and device_generation("H800-80GB") == "hopper"
    with pytest.raises(SpecError, match="members_per_node"):
        cluster_collective("all-reduce", [], GIB, cluster)


def test_the_crossover_benchmark_prints_its_tables():
    bench = load_benchmark("nccl_crossover")
    lines = bench.crossover_table([16])
    h100 = next(line for line in lines if line.split()[:1] == ["16"])
    assert h100.split()[1:3] == ["2.7", "GiB"]  # NCCL_CROSSOVER_BYTES[16] = 2.91e9 B = 2.7 GiB
    assert len([line for line in bench.published_table() if "published" in line]) == len(bench.PUBLISHED)
