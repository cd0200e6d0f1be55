"""The planner on a fabric (issue 32 item 4): tensor parallelism inside the scale-up domain, the
data-parallel reduction priced by NCCL's algorithm over the tiers it crosses (``sim.cost.fabric_comm``).

GB200 NVL72 (the ``gb200-nvl72`` preset, two 72-GPU domains): TP 16 does not divide a domain, so
each domain holds four TP groups and 8 GPUs idle (``planner.search.space.place``), and no group
straddles two domains; it beats the best plan of the same GPUs as 8-GPU servers, whose TP 16
crosses the NICs and whose TP 8 cannot hold the model's layers as cheaply.
"""

from __future__ import annotations

import pytest

from planner.planners.dapple import dapple_planner
from planner.search.costs import CostTables
from planner.search.evaluation import evaluate
from planner.search.layouts import layouts
from planner.search.space import REPLICA_FIRST, Candidate, PlannerOptions, place, to_scenario
from sim.core.parallelism import Recompute, Sharding
from sim.cost.tiers import crossing_text, plan_crossings
from sim.input.scenario import parse_scenario

GB200 = """
name: gb200
cluster: {{preset: gb200-nvl72, {cluster}}}
model: {{preset: gpt, layers: 8, hidden: 16384, heads: 128, seq_len: 4096, vocab: 32768, dtype: bf16}}
training: {{global_batch_size: 16, microbatch_size: 1}}
"""
NVL72 = "nodes: 36"
SERVERS = ("nodes: 18, devices_per_node: 8, nics_per_node: 8, "
           "fabric: {tiers: [{name: leaf, size: 18}, {name: spine}], scale_up: null}")  # the preset's domain off


def test_units_that_do_not_divide_a_domain_never_straddle_two():
    cluster = parse_scenario(GB200.format(cluster=NVL72)).cluster
    assert (cluster.nodes, cluster.devices_per_node) == (2, 72)
    (devices,) = place((8,), cluster, "fresh", unit=16)
    groups = [devices[i:i + 16] for i in range(0, len(devices), 16)]
    assert groups[3] == tuple(range(48, 64)) and groups[4] == tuple(range(72, 88))
    assert all(len({d // 72 for d in g}) == 1 for g in groups)


@pytest.mark.slow
def test_the_planner_searches_tp_16_in_a_domain_and_it_beats_the_8_gpu_servers_best():
    nvl72 = parse_scenario(GB200.format(cluster=NVL72))
    assert 16 in {t for t, _, _ in layouts(nvl72, PlannerOptions())}
    servers = parse_scenario(GB200.format(cluster=SERVERS))
    assert 16 not in {t for t, _, _ in layouts(servers, PlannerOptions())}  # without a domain: divisors of 8
    found = dapple_planner(nvl72, PlannerOptions(tensor_parallel=(16,))).best
    assert found.candidate.tensor_parallel == 16
    for stage in found.candidate.devices(nvl72.cluster):
        assert all(len({d // 72 for d in stage[i:i + 16]}) == 1 for i in range(0, len(stage), 16))
    best_on_servers = dapple_planner(servers, PlannerOptions()).best
    assert found.iteration_time_s < best_on_servers.iteration_time_s


PODS = """
name: pods
cluster:
  preset: dgx-h100
  nodes: 8
  fabric: {tiers: [{name: rack, size: 2}, {name: pod, size: 2, oversubscription: 7}, {name: core}]}
model: {preset: gpt, layers: 8, hidden: 4096, heads: 32, seq_len: 2048, vocab: 32768, dtype: bf16}
training: {global_batch_size: 64, microbatch_size: 4}
"""


def _grid(stages: int, placement: str) -> Candidate:
    """TP 8 (a server), ``stages`` even stages of the 10 layers, 8 / stages replicas each."""
    bounds = tuple(10 * i // stages for i in range(stages + 1))
    return Candidate(bounds=bounds, replicas=(8 // stages,) * stages, microbatch_size=4, tensor_parallel=8,
                     placement=placement)


def test_replica_first_puts_each_pipeline_in_a_rack_and_data_parallelism_across_the_core():
    # 64 GPUs: 8 servers, racks of 2, pods of 2 racks, 1:7 from the pods to the core. Replica First
    # puts each pipeline in a rack and data parallelism across the core (Llama 3's order); Fresh
    # First the stages' replicas in a pod and the pipeline across the core
    scenario = parse_scenario(PODS)
    replica, fresh = (to_scenario(scenario, _grid(2, p)) for p in (REPLICA_FIRST, "fresh"))
    assert [crossing_text(k, c) for k, c in plan_crossings(replica.plan, replica.cluster)][1:] == \
        ["PP crosses the rack (non-blocking)", "DP crosses the core at 1:7"]
    assert [crossing_text(k, c) for k, c in plan_crossings(fresh.plan, fresh.cluster)][1:] == \
        ["PP crosses the core at 1:7", "DP crosses the pod (non-blocking)"]


def test_the_planners_reduction_pays_the_tiers_its_span_crosses():
    # one GPU on each of 4 servers (TP 8), a ring of 1/8 of layers [0, 5)'s gradients: inside a pod
    # (span 4) it runs at the NIC, spread over both pods (span 8, Replica First) at 1/7 of it; the
    # latency is NCCL's ring's over 4 nodes either way, (8.4 + 6·(14 + 2·5))·1.4 µs
    tables = CostTables(parse_scenario(PODS), tensor_parallel=8)
    latency = (8.4 + 6 * (14.0 + 2 * 5.0)) * 1.4e-6
    inside, across = (tables.allreduce_s(0, 5, 1, 4, span=span) for span in (4, 8))
    assert tables.allreduce_s(0, 5, 1, 4) == inside
    assert across - latency == pytest.approx(7 * (inside - latency), rel=1e-9)


@pytest.mark.slow
def test_on_two_pods_at_1_to_7_the_planner_tries_dp_outermost_and_picks_the_simulators_fastest():
    scenario = parse_scenario(PODS)
    options = PlannerOptions(tensor_parallel=(8,), microbatch_sizes=(4,), schedules=(("dapple", ()),),
                             interleaved=False, recompute=(Recompute.NONE,), sharding=(Sharding.NONE,))
    result = dapple_planner(scenario, options)
    assert any(e.candidate.placement == REPLICA_FIRST and e.engine == "simpy" for e in result.evaluations)
    listed = {(s, p): evaluate(scenario, _grid(s, p), engine="simpy").iteration_time_s
              for s in (1, 2, 5) for p in ("fresh", REPLICA_FIRST)}
    assert result.best.iteration_time_s <= min(listed.values())
    # here the gradients outweigh the activations: the reduction inside a pod wins over DP outermost
    assert min(listed, key=listed.get) == (2, "fresh") and listed[(2, "fresh")] < listed[(2, REPLICA_FIRST)]
