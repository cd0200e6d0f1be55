"""Multi-tier fabrics (``cluster.fabric``): oversubscribed uplinks, rails, scale-up domains, slow uplinks.

Every expected time is a closed form written out here: a ring all-reduce of ``P`` gradient bytes
over ``n`` members moves ``2(n - 1)/n · P`` through every member's port, at the smallest share
on its path (``sim.engine.ports``): its NIC's ``B``, or an uplink's capacity over the flows on it.
On a fabric the all-reduce's latency is NCCL's (``sim.cost.fabric_comm``): :func:`_nccl_ring_s`.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from conftest import SCENARIOS, synthetic_scenario
from sim.app.cli import main
from sim.core.fabric import FabricSpec, ScaleUpSpec, TierSpec
from sim.core.faults import SlowLink
from sim.core.plan import StageSpec
from sim.cost.tiers import climb, group_crossing, uplink_capacity_bytes_per_s, uplink_group
from sim.engine.compile import compile_workload
from sim.engine.fastpath import replay
from sim.engine.replay import simulate
from sim.input.scenario import parse_scenario

B = 1e9  # NIC bandwidth, bytes/s
P = 1e9  # gradient bytes of the one stage


def _ring(n: int, devices_per_node: int = 1, devices=None):
    """One stage of zero compute whose ``n`` replicas all-reduce ``P`` bytes of gradients."""
    scenario = synthetic_scenario(fwd_s=[0.0], bwd_s=[0.0], replicas=[n], microbatches=1,
                                  devices_per_node=devices_per_node, param_bytes=P, inter_bandwidth=B,
                                  nodes=None if devices is None else -(-(max(devices) + 1) // devices_per_node))
    if devices is not None:
        plan = replace(scenario.plan, stages=(StageSpec(layers=(0, 1), devices=tuple(devices)),))
        scenario = replace(scenario, plan=plan)
    return scenario


def _nccl_ring_s(n: int) -> float:
    """NCCL's latency of a Simple ring all-reduce over n servers of one GPU each (tuning.cc): the
    base 8.4 µs and 2(n − 1) network steps of 14 µs (a zero-latency wire), times the ring's
    plateau 1.4 (each channel's share per rank is ≥ 64 bytes)."""
    return (8.4 + 2 * (n - 1) * 14.0) * 1.4 * 1e-6


def _on(scenario, *faults, nics_per_node=None, **fabric):
    cluster = replace(scenario.cluster, fabric=FabricSpec(**fabric),
                      nics_per_node=nics_per_node or scenario.cluster.nics_per_node)
    return replace(scenario, cluster=cluster, faults=tuple(faults))


def _times(scenario) -> tuple[float, float, float]:
    """Iteration time replayed three ways: SimPy with contention, the fast path, every device its own class."""
    return (simulate(compile_workload(scenario)).iteration_time_s,
            replay(compile_workload(scenario, contention=False)).iteration_time_s,
            simulate(compile_workload(scenario, symmetric=False)).iteration_time_s)


def _two_tier(size: int, oversubscription: float, **kw) -> dict:
    return dict(tiers=(TierSpec(name="leaf", size=size, oversubscription=oversubscription), TierSpec(name="spine", size=None)),
                **kw)


def test_without_a_fabric_key_a_ring_runs_at_the_nic():
    assert _times(_ring(4)) == pytest.approx((2 * 3 / 4 * P / B,) * 3, rel=1e-5)


def test_ring_all_reduce_across_an_oversubscribed_tier_runs_at_the_uplink_share():
    # 4 servers in leaf groups of 2 at 1:4: each group's uplink carries 2·B / 4 = B/2 per direction;
    # the ring 0→1→2→3→0 sends one flow up out of each group (1→2, 3→0) and one down into it
    scenario = _on(_ring(4), **_two_tier(2, 4.0))
    assert uplink_capacity_bytes_per_s(scenario.cluster, 0) == pytest.approx(2 * B / 4)
    share = (2 * B / 4) / 1
    assert _times(scenario) == pytest.approx((2 * (4 - 1) / 4 * P / share + _nccl_ring_s(4),) * 3, rel=1e-5)
    # at 1:2 the uplink carries 2·B / 2 = B: the NIC binds again, as without a fabric
    assert _times(_on(_ring(4), **_two_tier(2, 2.0))) == pytest.approx((2 * 3 / 4 * P / B + _nccl_ring_s(4),) * 3,
                                                        rel=1e-5)


def test_a_non_blocking_fabric_changes_only_the_latency_to_nccls():
    with_fabric, without = _times(_on(_ring(4), **_two_tier(2, 1.0))), _times(_ring(4))
    assert [a - b for a, b in zip(with_fabric, without)] == pytest.approx([_nccl_ring_s(4)] * 3, rel=1e-6)


def test_rail_aligned_ring_stays_on_its_leaf_and_a_cross_rail_one_pays_the_spine():
    # 4 servers of 2 GPUs and 2 NICs, one leaf group, rail-optimised at 1:8: a rail's leaf carries
    # 4 NICs · B / 8 = B/2 up to the spine. GPU 0 of every server (rail 0) rings inside its leaf;
    # GPUs 0, 3, 4, 7 alternate rails, so every hop climbs, two flows on each rail leaf's uplink
    fabric = _two_tier(4, 8.0, rail_optimised=True, rails=2)
    aligned = _on(_ring(4, devices_per_node=2, devices=(0, 2, 4, 6)), nics_per_node=2, **fabric)
    crossed = _on(_ring(4, devices_per_node=2, devices=(0, 3, 4, 7)), nics_per_node=2, **fabric)
    assert group_crossing(aligned.cluster, (0, 2, 4, 6)).name == "leaf"
    assert group_crossing(crossed.cluster, (0, 3, 4, 7)).name == "spine"
    assert _times(aligned) == pytest.approx((2 * 3 / 4 * P / B + _nccl_ring_s(4),) * 3, rel=1e-5)
    share = (4 * B / 8) / 2
    assert _times(crossed) == pytest.approx((2 * 3 / 4 * P / share + _nccl_ring_s(4),) * 3, rel=1e-5)


def _three_tier(*faults):
    """8 servers: leaves of 2 (non-blocking), spine groups of 2 leaves at 1:2, a core on top."""
    return _on(_ring(8), *faults, tiers=(TierSpec(name="leaf", size=2), TierSpec(name="spine", size=2, oversubscription=2.0),
                                         TierSpec(name="core", size=None)))


def test_a_slow_spine_uplink_slows_exactly_the_flows_that_cross_it():
    healthy, slow = _three_tier(), _three_tier(SlowLink(tier=1, index=0, factor=0.25))
    cluster = slow.cluster
    # a spine group's uplink: 2 leaves · (2 servers · B) / 2 = 2B, slowed to 0.5B, one flow each way
    assert uplink_capacity_bytes_per_s(cluster, 1) == pytest.approx(2 * B)
    rates = {}
    for scenario in (healthy, slow):
        workload = compile_workload(scenario, symmetric=False, contention=False)
        members = {c.index: c.devices[0] for c in workload.classes}
        rates[scenario is slow] = {(members[k.src_class], members[k.dst_class]): k.static_rate_bytes_per_s
                                   for k in workload.kinds}
    for (src, dst), rate in rates[True].items():
        crosses = climb(cluster, src, dst) == 2 and 0 in (uplink_group(cluster, 1, src), uplink_group(cluster, 1, dst))
        assert rate == pytest.approx(0.25 * 2 * B if crosses else rates[False][(src, dst)]), (src, dst)
    assert {pair for pair in rates[True] if rates[True][pair] != rates[False][pair]} == {(3, 4), (7, 0)}
    assert _times(healthy) == pytest.approx((2 * 7 / 8 * P / B + _nccl_ring_s(8),) * 3, rel=1e-5)
    assert _times(slow) == pytest.approx((2 * 7 / 8 * P / (0.25 * 2 * B) + _nccl_ring_s(8),) * 3, rel=1e-5)


TP16 = """
name: tp16
cluster:
  preset: dgx-h100
  nodes: {nodes}
  devices_per_node: {per_node}
  {fabric}
model: {{preset: gpt, layers: 4, hidden: 4096, heads: 32, seq_len: 2048, vocab: 32768, dtype: bf16}}
training: {{global_batch_size: 8, microbatch_size: 8}}
plan: {{schedule: gpipe, tensor_parallel: 16, pipeline_parallel: 1, data_parallel: 1}}
"""


def test_tensor_parallel_16_inside_a_scale_up_domain_runs_as_on_one_16_gpu_server():
    # two 8-GPU servers in one NVLink domain of 16 at 450 GB/s are, to the network, one server of
    # 16 GPUs on a 450 GB/s port; without the domain TP 16 crosses the NICs
    domain = parse_scenario(TP16.format(nodes=2, per_node=8, fabric="fabric: {tiers: [{name: leaf}], "
                                                                      "scale_up: {size: 16, bandwidth: 450GB/s, latency: 3us}}"))
    server = parse_scenario(TP16.format(nodes=1, per_node=16, fabric="nics_per_node: 16"))
    apart = parse_scenario(TP16.format(nodes=2, per_node=8, fabric=""))
    assert (domain.cluster.nodes, domain.cluster.devices_per_node, domain.cluster.nics_per_node) == (1, 16, 16)
    assert group_crossing(domain.cluster, range(16)).name == "scale-up domain"
    runs = [simulate(compile_workload(s)) for s in (domain, server, apart)]
    communication = [r.summary()["devices"][0]["communication_s"] for r in runs]
    assert runs[0].iteration_time_s == runs[1].iteration_time_s and communication[0] == communication[1]
    # across the NICs (8 × 400 Gb/s a server, hierarchical) the same collectives take over 25% longer
    assert communication[2] > 1.25 * communication[0] and runs[2].iteration_time_s > runs[0].iteration_time_s


def test_check_prints_where_each_group_crosses(capsys):
    assert main(["check", str(SCENARIOS / "llama3_405b_h100_fabric.yaml"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    placement = info["fabric"]["placement"]
    assert placement["TP"]["text"] == "TP inside the server"
    assert placement["DP"]["text"] == "DP crosses the core at 1:7"
    assert placement["DP"]["bandwidth_bytes_per_s"] == pytest.approx(400e9 / 8 / 7)
    assert placement["PP"]["text"] == "PP crosses the pod (non-blocking)"


def test_presets_read_as_their_sources_say():
    text = "name: p\ncluster: {{preset: {}}}\nmodel: {{preset: gpt, layers: 2, hidden: 256, heads: 4, seq_len: 128, vocab: 512}}\n" \
           "training: {{global_batch_size: 8, microbatch_size: 8}}\n"
    superpod = parse_scenario(text.format("dgx-superpod-h100")).cluster
    assert superpod.fabric.rail_optimised and superpod.fabric.tiers[0].size == 32
    llama = parse_scenario(text.format("llama3-roce-h100")).cluster
    assert [t.size for t in llama.fabric.tiers] == [2, 192, 8]
    assert llama.fabric.reach(1) * 8 == 3072  # a pod of 3,072 GPUs
    nvl72 = parse_scenario(text.format("gb200-nvl72")).cluster
    assert (nvl72.devices_per_node, nvl72.nics_per_node, nvl72.fabric.servers_per_domain) == (72, 72, 18)
    assert nvl72.intra_node.bandwidth_bytes_per_s == pytest.approx(900e9)


def test_a_scale_up_domain_needs_whole_servers():
    bad = TP16.format(nodes=3, per_node=8, fabric="fabric: {tiers: [{name: leaf}], scale_up: {size: 16, bandwidth: 1TB/s}}")
    with pytest.raises(Exception, match=r"cluster.nodes: 3 servers do not fill whole scale-up domains of 2"):
        parse_scenario(bad)


def test_scale_up_spec_checks_itself():
    with pytest.raises(Exception, match="size"):
        ScaleUpSpec(size=0, bandwidth_bytes_per_s=1.0)


def test_a_ring_that_leaves_its_group_at_two_of_its_hops_runs_at_their_uplink_share():
    # 6 servers, leaf groups of 4 at 1:8 (an uplink carries 4·B / 8 = B/2): hops 3→4 and 5→0 leave
    # their group, one flow on each uplink; the others stay on a leaf. The ring's members are one
    # symmetry class, its two kinds of hop loading the uplinks as the real flows do
    scenario = _on(_ring(6), **_two_tier(4, 8.0))
    assert len(compile_workload(scenario).classes) == 1
    assert _times(scenario) == pytest.approx((2 * 5 / 6 * P / (4 * B / 8) + _nccl_ring_s(6),) * 3, rel=1e-5)


def test_a_slow_leaf_uplink_under_a_ring_is_priced_alike_with_and_without_symmetry():
    # the same ring, group 0's uplinks at half their B/2: the hops 5→0 (into it) and 3→4 (out of it) at B/4
    scenario = _on(_ring(6), SlowLink(tier=0, index=0, factor=0.5), **_two_tier(4, 8.0))
    assert _times(scenario) == pytest.approx((2 * 5 / 6 * P / (0.5 * 4 * B / 8) + _nccl_ring_s(6),) * 3, rel=1e-5)


def test_check_says_the_placement_in_words(capsys):
    assert main(["check", str(SCENARIOS / "llama3_405b_h100_fabric.yaml")]) == 0
    out = capsys.readouterr().out
    assert "fabric: rack (2) > pod (192, 1:7 up) > core (8)" in out
    assert "placement: TP inside the server; PP crosses the pod (non-blocking); DP crosses the core at 1:7" in out


def test_an_uplink_bandwidth_says_the_same_as_its_oversubscription():
    # leaf groups of 2 servers (2·B down): 0.5·B up is 1:4, as oversubscription 4 says
    by_ratio = _on(_ring(4), **_two_tier(2, 4.0))
    by_bandwidth = _on(_ring(4), tiers=(TierSpec(name="leaf", size=2, uplink_bandwidth_bytes_per_s=0.5 * B),
                                        TierSpec(name="spine", size=None)))
    assert _times(by_bandwidth) == _times(by_ratio)
    assert group_crossing(by_bandwidth.cluster, range(4)).oversubscription == pytest.approx(4.0)
    with pytest.raises(Exception, match="uplink_bandwidth or oversubscription"):
        TierSpec(name="leaf", size=2, oversubscription=2.0, uplink_bandwidth_bytes_per_s=B)


def test_uplinks_loaded_differently_are_different_classes():
    # 4 stages of 2 replicas, stage s on servers s and 4 + s, racks of 2 servers at 1:4 (an uplink
    # carries 2·B/4 = B/2): rack 0 (servers 0, 1) carries stage 0's and stage 1's rings, rack 1
    # stages 2 and 3'. Backwards of 5 s in turn (stage 3 first) keep the reductions apart, so each
    # ring is alone on its uplinks: its P bytes at B/2, 2 s; the iteration 4 · 5 s + stage 0's 2 s.
    # One class for every rack uplink spread each stage's ring over all four: 0.5 of a flow on
    # each, at min(B, B/2 / 0.5) = B (21 s).
    scenario = synthetic_scenario(fwd_s=[0.0] * 4, bwd_s=[5.0] * 4, replicas=[2] * 4, microbatches=1,
                                  microbatch_size=1, devices_per_node=1, param_bytes=P, inter_bandwidth=B)
    stages = tuple(StageSpec(layers=(s, s + 1), devices=(s, 4 + s)) for s in range(4))
    scenario = _on(replace(scenario, plan=replace(scenario.plan, stages=stages)),
                   tiers=(TierSpec(name="rack", size=2, oversubscription=4.0), TierSpec(name="spine", size=None)))
    assert _times(scenario) == pytest.approx((4 * 5.0 + P / (B / 2),) * 3, rel=1e-5)
