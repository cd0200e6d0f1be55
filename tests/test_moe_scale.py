"""A 16,384-GPU MoE replay stays cheap: the all-to-all's flows grow linearly with the expert group.

``benchmarks/moe_bench.py`` times the 16,384-GPU case; here the reason it is cheap is checked on
the shipped 2,048-GPU DeepSeek-V3 scenario, and the benchmark's case is checked to be the plan it
says it is (no wall-clock time is asserted)."""

from __future__ import annotations

from conftest import REPO, load_benchmark
from sim.engine.compile import _replica_samples
from sim.engine.groups import by_server, group_flows
from sim.input.scenario import load_scenario

DEEPSEEK = REPO / "scenarios" / "deepseek_v3_h800_ep64.yaml"



def test_expert_all_to_all_flows_are_two_per_member_not_n_squared():
    scenario = load_scenario(DEEPSEEK)
    plan = scenario.plan
    samples = {s: _replica_samples(plan, s, scenario.training.microbatch_size) for s in range(plan.num_stages)}
    flows, _ = group_flows(plan, scenario.resolved.model, scenario.cluster, samples)
    groups = plan.expert_groups(0)
    assert [len(g) for g in groups] == [64, 64] and len(by_server(scenario.cluster, groups[0])) == 8
    forward = [f for f in flows if f[2] == ("EP", 0, "F")]
    # each member: one ring flow to its server neighbour, one through its NIC to its rank on the
    # next server; 64 x 63 pairs would be 4,032 flows a group
    assert len(forward) == 2 * 64 * len(groups)
    assert len({(src, dst) for src, dst, _, _ in forward}) == len(forward)


def test_the_benchmark_case_is_16384_gpus_with_ep_64_across_8_servers():
    scenario = load_benchmark("moe_bench").case(16384, "symmetric")
    plan = scenario.plan
    assert scenario.cluster.num_devices == 16384 and plan.num_stages == 16 and plan.num_replicas(0) == 1024
    assert plan.expert_parallel == 64 and scenario.training.num_microbatches == 64
    assert len(by_server(scenario.cluster, plan.expert_groups(0)[0])) == 8
