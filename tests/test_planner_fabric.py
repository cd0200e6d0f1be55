"""The planner on a fabric (issue 32 item 4): tensor parallelism inside the scale-up domain, the
data-parallel reduction priced by NCCL's algorithm over the tiers it crosses (``sim.cost.fabric_comm``).

GB200 NVL72 (the ``gb200-nvl72`` preset, two 72-GPU domains): TP 16 does not divide a domain, so
each domain holds four TP groups and 8 GPUs idle (``planner.search.space.place``), and no group
straddles two domains; it beats the best plan of the same GPUs as 8-GPU servers, whose TP 16
crosses the NICs and whose TP 8 cannot hold the model's layers as cheaply.
"""

from __future__ import annotations

from planner.planners.dapple import dapple_planner
from planner.search.layouts import layouts
from planner.search.space import PlannerOptions, place
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
