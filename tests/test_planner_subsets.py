"""A cluster whose size factors badly is planned on a subset too, the rest of it idle."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.planners.dapple import dapple_planner
from planner.search.space import Candidate, PlannerOptions, restrict_cluster
from planner.search.subsets import smooth, subset_sizes
from sim.core.errors import DappleError
from sim.input.scenario import parse_scenario

CLUSTER = """
name: gpt-on-{nodes}
cluster:
  nodes: {nodes}
  devices_per_node: {per_node}
  device: {{name: A100-80GB}}
  intra_node: {{bandwidth: 300GB/s, latency: 5us}}
  inter_node: {{bandwidth: 25GB/s, latency: 10us}}
model: {{preset: gpt, layers: 8, hidden: 1024, heads: 16, seq_len: 1024, vocab: 32768, dtype: bf16}}
training: {{global_batch_size: 40}}
"""


def _scenario(nodes: int, per_node: int):
    return parse_scenario(CLUSTER.format(nodes=nodes, per_node=per_node), ignore_plan=True)


def test_smooth_counts():
    assert [n for n in range(1, 30) if not smooth(n)] == [11, 13, 17, 19, 22, 23, 26, 29]


@pytest.mark.parametrize("nodes, per_node, sizes", [
    (641, 8, (640 * 8,)),  # Turing-NLG's 5,128 A100 (641 servers): 640 servers
    (16, 8, ()), (2, 8, ()), (1, 8, ()),  # factor well
    (13, 8, (12 * 8,)),
    (1, 11, (10,)),  # one server: its first GPUs
])
def test_subset_sizes(nodes, per_node, sizes):
    assert subset_sizes(_scenario(nodes, per_node).cluster) == sizes


def test_a_restricted_cluster_keeps_its_servers_and_links():
    cluster = _scenario(13, 8).cluster
    sub = restrict_cluster(cluster, 96)
    assert (sub.nodes, sub.devices_per_node, sub.intra_node, sub.inter_node) == \
        (12, 8, cluster.intra_node, cluster.inter_node)
    one = restrict_cluster(_scenario(1, 11).cluster, 10)
    assert (one.nodes, one.devices_per_node) == (1, 10)
    with pytest.raises(DappleError, match="whole servers"):
        restrict_cluster(cluster, 95)


@pytest.mark.parametrize("placement", ["fresh", "append", "scatter"])
def test_a_plan_on_a_subset_uses_only_its_first_devices(placement):
    cluster = _scenario(13, 8).cluster
    candidate = Candidate(bounds=(0, 5, 10), replicas=(48, 48), microbatch_size=48, placement=placement,
                          on_devices=96)
    used = sorted(d for group in candidate.devices(cluster) for d in group)
    assert used == list(range(96))
    whole = replace(candidate, on_devices=None).devices(cluster)
    if placement == "scatter":  # over all 13 servers, not 12
        assert max(d for group in whole for d in group) >= 96


def test_dapple_plans_an_eleven_gpu_server_on_ten_too_and_says_what_it_compares():
    scenario = _scenario(1, 11)
    result = dapple_planner(scenario, PlannerOptions(microbatch_sizes=(4, 8), chunks=(2,)))
    on_ten = [e for e in result.evaluations if e.candidate.on_devices == 10 and e.engine == "simpy"]
    assert on_ten and all(max(e.plan.devices) < 10 for e in on_ten if e.ok)
    if result.best.candidate.on_devices == 10:
        assert result.note.startswith("planned on 10 of 11 devices (1 idle); ")
    else:
        assert result.note == ""
        assert all(result.best.iteration_time_s <= e.iteration_time_s for e in on_ten)
