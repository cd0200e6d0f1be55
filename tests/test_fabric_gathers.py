"""FSDP's gathers, ZeRO-3's reduce-scatter and tensor groups across servers on a fabric: NCCL's
ring over the tiers they cross (``sim.cost.fabric_comm.fabric_across`` / ``fabric_calls_across``).

The cluster: 16 DGX H100 servers (8 NICs of B = 50 GB/s, 5 µs a wire) in two pods of 8 servers at
1:7 below one core; the pod's switches add 1 µs, the core's 2 µs. A group of one GPU a server
climbs to the core. NCCL (tuning.cc at 5067397c) runs an all-gather or reduce-scatter across nodes
as a ring only; for ppn = 1 its per network step latency is the tree's ``hwLatencies[NET]`` (LL 5.0,
LL128 8.5, Simple 14.0 µs) plus the wire (twice under Simple: the flush), ``n − 1`` of them after
the base (LL 6.6, LL128 14.0, Simple 8.4 µs); bus bandwidth the NIC share B/7 (LL: half of it,
LL128: 0.92 of it); algorithm bandwidth ``bus · n / (n − 1)``.
"""

from __future__ import annotations

import pytest

from planner.search.costs import CostTables
from sim.app.check import describe
from sim.core.parallelism import Sharding
from sim.cost.comm import fsdp_gather, gradient_sync, ring_flow_bytes
from sim.cost.fabric_comm import across_choice, nominal_crossing
from sim.cost.group_comm import spanning_phases, tensor_parallel_volumes
from sim.cost.tiers import group_crossing
from sim.engine.groups import group_flows
from sim.input.scenario import parse_scenario

B = 50e9
N = 16
WIRE_S = (5.0 + 1.0 + 2.0) * 1e-6  # the NIC's wire and the pod's and core's switches
SMALL, LARGE = 64 * 1024, 2 ** 30

YAML = """
name: fabgather
cluster:
  preset: dgx-h100
  nodes: 16
  {fabric}
model: {{preset: gpt, layers: 4, hidden: 1024, heads: 16, seq_len: 1024, vocab: 32768, dtype: bf16}}
training: {{global_batch_size: 16, microbatch_size: 16}}
plan: {{schedule: gpipe, tensor_parallel: {t}, pipeline_parallel: 1, data_parallel: {d}, sharding: full}}
"""
FABRIC = ("fabric: {tiers: [{name: pod, size: 8, oversubscription: 7, latency: 1us}, "
          "{name: core, latency: 2us}]}")


def _scenario(t: int = 8, fabric: bool = True):
    return parse_scenario(YAML.format(fabric=FABRIC if fabric else "", t=t, d=128 // t))


def _ring_latency_s(protocol: str, steps: int = N - 1) -> float:
    base, hop = {"LL": (6.6, 5.0), "LL128": (14.0, 8.5), "Simple": (8.4, 14.0)}[protocol]
    return (base + steps * hop) * 1e-6 + steps * WIRE_S * (2 if protocol == "Simple" else 1)


def test_an_all_gather_over_two_pods_at_1_to_7_is_the_rings_bytes_at_the_nic_share_over_7_plus_the_tiers():
    cluster = _scenario().cluster
    crossing = nominal_crossing(cluster, N)
    assert (crossing.name, crossing.oversubscription) == ("core", 7.0)
    gather = fsdp_gather(N, LARGE, cluster.inter_node, cluster, crossing=crossing)
    assert gather.flow_bytes == pytest.approx(ring_flow_bytes(N, LARGE, cluster.inter_node, halves=1))
    assert gather.rate_bytes_per_s == pytest.approx(B / 7)
    assert gather.latency_s == pytest.approx(_ring_latency_s("Simple"))  # no plateau: all-reduce only
    eff = cluster.inter_node.collective_efficiency
    assert gather.seconds == pytest.approx((N - 1) / N * LARGE / eff / (B / 7) + _ring_latency_s("Simple"))
    # without the crossing (or the fabric) it is the ring of before: the NIC's B, 5 µs a step
    plain = fsdp_gather(N, LARGE, cluster.inter_node, cluster)
    assert (plain.rate_bytes_per_s, plain.latency_s) == (B, pytest.approx((N - 1) * 5e-6))


def test_nccl_picks_ll_for_a_small_all_gather_and_simple_for_a_large_one():
    cluster = _scenario().cluster
    small, large = (across_choice([1] * N, nbytes, cluster, kind="all-gather") for nbytes in (SMALL, LARGE))
    # LL: 201.6 µs + S·15/16 / (B/7 · 0.5), against LL128's 262 µs + ... and Simple's 458 µs + ...
    assert (small.algorithm, small.protocol) == ("ring", "LL")
    assert small.latency_s == pytest.approx(_ring_latency_s("LL"))
    assert small.bytes_factor == pytest.approx(2.0)  # LL's half bandwidth: twice the Simple ring's byte time
    assert small.nccl.seconds == pytest.approx(_ring_latency_s("LL") + SMALL * (N - 1) / N / (B / 7 * 0.5))
    assert (large.algorithm, large.protocol, large.bytes_factor) == ("ring", "Simple", 1.0)
    # a reduce-scatter is a ring as well; the tree, even forced, runs the all-reduce only
    assert across_choice([1] * N, LARGE, cluster, kind="reduce-scatter").algorithm == "ring"


def test_a_tensor_groups_across_phase_pays_every_calls_nccl_latency_at_the_share_over_7():
    cluster = _scenario().cluster
    volumes = {"all-gather": (2 * SMALL, 2), "reduce-scatter": (2 * SMALL, 2)}  # two calls of SMALL each
    crossing = group_crossing(cluster, [0, 8 * 8])  # servers 0 and 8: one in each pod
    assert (crossing.name, crossing.oversubscription) == ("core", 7.0)
    across = spanning_phases(volumes, [8, 8], cluster, crossing=crossing)["across"]
    # 8 GPUs a server: each GPU's share is its own NIC (8 NICs), over 7; per call LL's ring over 2 servers
    ag, rs = (across_choice([8, 8], SMALL, cluster, kind=kind, crossing=crossing)
              for kind in ("all-gather", "reduce-scatter"))
    # LL's ring of 16 over 2 servers: 14 NVLink steps (0.6 µs and the link's wire), one network step
    # (the ring's 2.7 µs with 8 GPUs a server, and the wire)
    nvlink_step_s = 0.6e-6 + cluster.intra_node.latency_s
    assert (ag.protocol, ag.latency_s) == ("LL", pytest.approx(6.6e-6 + 14 * nvlink_step_s + 2.7e-6 + WIRE_S))
    assert across.latency_s == pytest.approx(2 * ag.latency_s + 2 * rs.latency_s)
    assert across.rate_bytes_per_s == pytest.approx(B / 7)
    ring = (2 - 1) / 2 * 4 * SMALL / 8  # each GPU's 1/8 shard over the 2 servers' ring, four calls
    assert across.bytes_per_device == pytest.approx(ring * ag.bytes_factor)
    plain = spanning_phases(volumes, [8, 8], _scenario(fabric=False).cluster)["across"]
    assert (plain.bytes_per_device, plain.rate_bytes_per_s, plain.latency_s) == (ring, B, pytest.approx(4 * 5e-6))


def test_zero3s_gradient_reduce_scatter_is_nccls_ring_reduce_scatter():
    cluster = _scenario().cluster
    (phase,) = gradient_sync([1] * N, LARGE, Sharding.FULL, cluster)
    # the all-reduce layout of half the bytes: the reduce-scatter's ring bytes, its n − 1 network steps
    assert phase.flow_bytes == pytest.approx(ring_flow_bytes(N, LARGE, cluster.inter_node, halves=1))
    assert phase.latency_s == pytest.approx(_ring_latency_s("Simple"))
    assert phase.rate_bytes_per_s == pytest.approx(B / 7)


def test_the_engines_fsdp_gather_is_the_one_homes():
    scenario = _scenario()
    model, plan, cluster = scenario.resolved.model, scenario.resolved.plan, scenario.cluster
    samples = {0: {d: (0, 1) for d in plan.stages[0].devices}}
    flows, latency = group_flows(plan, model, cluster, samples)
    gather = fsdp_gather(N, model.param_bytes(*plan.stages[0].layers), cluster.inter_node, cluster,
                         crossing=nominal_crossing(cluster, N))
    assert latency[("FS", 0, "F")] == pytest.approx(gather.latency_s)
    sent = [b for _, _, label, b in flows if label == ("FS", 0, "F")]
    assert len(sent) == 128 and sent == [pytest.approx(gather.flow_bytes)] * 128


def test_the_planners_gather_is_the_one_homes_on_a_fabric():
    # TP 8, 16 replicas: one GPU a server over all 16 (both pods), as the engine prices it
    scenario = _scenario()
    tables = CostTables(scenario, tensor_parallel=8)
    cluster, nbytes = scenario.cluster, tables.param_bytes(0, 4)
    gather = fsdp_gather(N, nbytes, cluster.inter_node, cluster, crossing=nominal_crossing(cluster, N))
    assert tables.gather_s(0, 4, N) == pytest.approx(gather.seconds)
    assert gather.rate_bytes_per_s == pytest.approx(B / 7)
    # TP 4, 32 replicas: two GPUs on each of the 16 servers is hierarchical, priced at the stage's bytes
    # (the 4 gradient groups' 8 GPUs a server on their own NICs: one flow each)
    tables4 = CostTables(scenario, tensor_parallel=4)
    phases = spanning_phases({"all-gather": (tables4.param_bytes(0, 4), 1)}, [2] * 16, cluster, flows_per_nic=1)
    assert phases["across"].rate_bytes_per_s == pytest.approx(B / 7)
    assert tables4.gather_s(0, 4, 32) == pytest.approx(sum(p.seconds for p in phases.values()))


def test_check_names_zero3s_reduce_scatter_and_its_whole_gradient():
    # the whole gradient (22.06 MiB of the stage's bf16 gradients over TP 8), not the layout's half
    assert describe(_scenario()).collectives == ("DP reduce-scatter 22.06MiB: ring across the core",)


def test_the_engines_tensor_group_across_servers_sends_the_one_homes_protocol_bytes():
    # TP 16 over servers 0 and 1 (pod 0) of small activations: NCCL's LL ring, whose bus bandwidth
    # across two nodes is capped at llMaxBw 39 GB/s, against Simple's min(NVLink, 8 NICs): the bytes
    # factor is their ratio, and the engine's cross-server flows carry it
    scenario = parse_scenario(YAML.format(fabric=FABRIC, t=16, d=8).replace("hidden: 1024", "hidden: 64")
                              .replace("seq_len: 1024", "seq_len: 64").replace("sharding: full", "sequence_parallel: true"))
    model, plan, cluster = scenario.resolved.model, scenario.resolved.plan, scenario.cluster
    group = next(g for g in plan.tensor_groups(0) if g[0] == 0)
    assert [cluster.node_of(d) for d in group] == [0] * 8 + [1] * 8
    samples = {0: {d: (0, 2) for d in plan.stages[0].devices}}
    flows, latency = group_flows(plan, model, cluster, samples)
    volumes = tensor_parallel_volumes(model.layers[slice(*plan.stages[0].layers)], "forward", 2)
    across = spanning_phases(volumes, [8, 8], cluster, crossing=group_crossing(cluster, [0, 8]))["across"]
    simple_bus = min(cluster.intra_node.collective_bandwidth_bytes_per_s, 8 * B * cluster.inter_node.collective_efficiency)
    factor = simple_bus / min(39e9, 0.5 * simple_bus)
    ring = sum((2 - 1) / 2 * b / 8 for b, _ in volumes.values())
    assert across.bytes_per_device == pytest.approx(ring * factor)
    assert {across_choice([8, 8], b / n, cluster, kind=kind).protocol for kind, (b, n) in volumes.items()} == {"LL"}
    sent = [b for src, _, label, b in flows if label == ("TP", 0, "F", 1) and src in group]
    assert sent == [pytest.approx(across.flow_bytes)] * 16
    assert latency[("TP", 0, "F", 1)] == pytest.approx(across.latency_s)
