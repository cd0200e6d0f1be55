"""The baseline planners (PipeDream, even, dp) within a work budget and at scale.

PipeDream's tabulated DP against the recurrence written out (SOSP'19, §3.1), its budget in
partial plans, its cell count at 1,024 GPUs, "no plan fits" for a handful of counts, the
even planner's candidates at 16,384 GPUs within ``max_candidates``, and no replay of a pure
data-parallel plan that leaves replicas without a sample. No test times anything.
"""

from __future__ import annotations

import math
import random

import pytest

from conftest import SCENARIOS
from planner.planners.baselines import NO_FIT_PROBES, baseline_settling, dp_planner, even_candidates, even_planner
from planner.planners.dapple_dp import segment_cuts
from planner.planners.pipedream import pipedream_dp, pipedream_planner, pipedream_search, worker_granule
from planner.search.costs import CostTables
from planner.search.space import PlannerOptions, microbatch_sizes
from sim.core.model_spec import LayerSpec, ModelSpec
from sim.core.specs import ClusterSpec, DeviceSpec, LinkSpec
from sim.core.training import TrainingSpec
from sim.cost.links import contiguous_span, span_link
from sim.input.scenario import Scenario, load_scenario

GPT3_1024 = SCENARIOS / "scale" / "gpt3_175b_a100_1024.yaml"
LLAMA_405B_16K = SCENARIOS / "scale" / "llama3_405b_h100_16384.yaml"


def _scenario(seed: int, *, nodes: int, per_node: int, memory: float = 2.0**40, layers: int = 12) -> Scenario:
    rng = random.Random(seed)
    device = DeviceSpec(name="gpu", memory_bytes=memory, peak_flop_per_s=1e14, peak_fp32_flop_per_s=1e13,
                        memory_bandwidth_bytes_per_s=1e12)
    cluster = ClusterSpec(nodes=nodes, devices_per_node=per_node, device=device,
                          intra_node=LinkSpec(bandwidth_bytes_per_s=2e10, latency_s=5e-6),
                          inter_node=LinkSpec(bandwidth_bytes_per_s=2e9, latency_s=2e-5))
    specs = tuple(
        LayerSpec(name=f"l{i}", param_bytes=rng.choice([0.0, 1e6, 2e7, 1e8]), output_bytes=0.0,
                  stash_bytes=rng.uniform(1e5, 1e7), fwd_s=rng.uniform(1e-4, 3e-3), bwd_s=rng.uniform(2e-4, 6e-3))
        for i in range(layers)
    )
    boundary = (0.0,) + tuple(rng.choice([1e4, 1e5, 1e6, 1e7]) for _ in range(layers - 1)) + (0.0,)
    model = ModelSpec(name=f"m{seed}", layers=specs, boundary_bytes=boundary, dtype="fp32", optimizer="sgd")
    return Scenario(name=f"m{seed}", cluster=cluster, model=model,
                    training=TrainingSpec(global_batch_size=16, microbatch_size=16), plan=None)


def _reference_dp(tables: CostTables, scenario: Scenario, microbatch_size: int):
    """PipeDream's recurrence as written (§3.1), every layer and worker count, O(L²N²):
    A(j, m) = min over i < j, m' < m of max(A(i, m−m'), 2·C_i, T(i+1→j, m')), with
    T = max(compute, 4(m'−1)|w| / (m'·B)) / m' and C_i = 2·|a_i|·mb / B."""
    cluster, L, N = scenario.cluster, tables.num_layers, scenario.cluster.num_devices

    def stage_s(i, j, m):
        compute = sum(tables.compute_s(i, j, microbatch_size))
        sync = 0.0
        if m > 1:
            bandwidth = span_link(cluster, contiguous_span(cluster, m)).bandwidth_bytes_per_s
            sync = 4 * (m - 1) * tables.param_bytes(i, j) / (m * bandwidth)
        return max(compute, sync) / m

    neighbours = span_link(cluster, contiguous_span(cluster, 2)).bandwidth_bytes_per_s
    A = {}
    for j in range(1, L + 1):
        for m in range(1, N + 1):
            best = (stage_s(0, j, m), None, m)
            for i in range(1, j):
                comm = 2 * (2 * scenario.model.boundary_bytes[i] * microbatch_size / neighbours)
                for last in range(1, m):
                    value = max(A[i, m - last][0], comm, stage_s(i, j, last))
                    if value < best[0]:
                        best = (value, (i, m - last), last)
            A[j, m] = best
    m = min(range(1, N + 1), key=lambda k: (A[L, k][0], -k))
    value, bounds, replicas, j = A[L, m][0], [L], [], L
    while True:
        _, parent, last = A[j, m]
        replicas.append(last)
        if parent is None:
            bounds.append(0)
            break
        j, m = parent
        bounds.append(j)
    return value, tuple(reversed(bounds)), tuple(reversed(replicas))


@pytest.mark.parametrize("seed, nodes, per_node", [(1, 1, 8), (2, 2, 4), (3, 4, 2), (4, 8, 1)])
def test_tabulated_dp_is_the_recurrence(seed, nodes, per_node):
    scenario = _scenario(seed, nodes=nodes, per_node=per_node)
    tables = CostTables(scenario)
    for microbatch_size in (1, 4, 16):
        found = pipedream_dp(tables, scenario, microbatch_size, cuts=list(range(13)))
        assert found == _reference_dp(tables, scenario, microbatch_size)  # value, bounds, replicas: exactly
        value, bounds, replicas = found
        assert bounds[0] == 0 and bounds[-1] == 12 and sum(replicas) <= 8 and math.isfinite(value)


@pytest.mark.parametrize("name", ["amoeba36", "bert48", "gnmt16", "vgg19", "xlnet36"])
def test_paper_plans_are_the_dp_over_every_cut(name):
    """The paper models are longer than 24 layers, so the search cuts at DAPPLE's segments only;
    it finds the partition the DP over every cut and every micro-batch size finds (the one the
    planner found before the tables: pure data parallelism on the 16 V100s, whose compute
    outweighs the weight synchronisation)."""
    scenario = load_scenario(SCENARIOS / "paper" / f"{name}_v100_2x8.yaml", ignore_plan=True)
    tables = CostTables(scenario)
    search = pipedream_search(tables, scenario, PlannerOptions())
    every = list(range(tables.num_layers + 1))
    best = min((pipedream_dp(tables, scenario, size, cuts=every)[0] / size, k, size)
               for k, size in enumerate(microbatch_sizes(scenario.training.global_batch_size, PlannerOptions())))
    _, bounds, replicas = pipedream_dp(tables, scenario, best[2], cuts=every)
    assert (search.bounds, search.replicas) == (bounds, replicas) == ((0, tables.num_layers), (16,))


def test_baselines_settle_with_few_replays_at_scale():
    options = PlannerOptions()
    small, mid, large = (baseline_settling(options, n) for n in (16, 64, 1024))
    assert (small.fast_top, small.fast_max, small.engine_top, small.fast_budget_ops) == (4, 8, 2, 20_000)
    assert (mid.fast_top, mid.fast_max, mid.engine_top) == (4, 8, 2)
    assert (large.fast_top, large.fast_max, large.engine_top) == (1, 1, 1)  # 1,024 device-replays: one each
    assert baseline_settling(options, 16, fast_max=16).fast_max == 16
    assert baseline_settling(PlannerOptions(fast_top=2, engine_top=1), 16).fast_top == 2  # never more than asked


def test_a_budget_of_partials_stops_the_search_with_a_plan():
    scenario = _scenario(5, nodes=2, per_node=4)
    sizes = microbatch_sizes(16, PlannerOptions())
    per_size = 8 * (12 * 13 // 2)  # workers × (earlier cut, cut) pairs: 624 cells per micro-batch size
    full = pipedream_search(CostTables(scenario), scenario, PlannerOptions())
    assert full.partials == per_size * len(sizes) == 3120 and full.sizes_done == len(sizes)
    result = pipedream_planner(scenario, PlannerOptions(max_partials=700))
    assert result.spend.partials == per_size  # the first size always runs; the second would pass 700
    assert result.spend.reached == ["partial plans (700)"]
    assert result.best is not None and "stopped at the budget of 700 partial plans after 1 of 5" in result.note
    assert pipedream_planner(scenario, PlannerOptions()).spend.reached == []


def test_cells_at_1024_gpus_are_bounded():
    scenario = load_scenario(GPT3_1024, ignore_plan=True)
    tables = CostTables(scenario)
    assert worker_granule(1024, 8) == 8 and worker_granule(16384, 8) == 128 and worker_granule(128, 8) == 1
    cuts = segment_cuts(tables)
    assert len(cuts) == 25  # 24 groups of similar compute
    # 1536 = 2^9·3: 14 divisors give at most 128 micro-batches (12, 16, 24, ..., 1536)
    sizes = microbatch_sizes(1536, PlannerOptions())
    assert len(sizes) == 14
    search = pipedream_search(tables, scenario, PlannerOptions(microbatch_sizes=(96, 192)))
    assert search.partials == 2 * 128 * (24 * 25 // 2) == 76_800  # 128 server workers, 300 cut pairs
    assert search.bounds[0] == 0 and search.bounds[-1] == tables.num_layers
    assert set(search.bounds) <= set(cuts) and all(r % 8 == 0 for r in search.replicas)
    assert sum(search.replicas) <= 1024


def test_no_plan_fits_after_a_handful():
    scenario = _scenario(6, nodes=2, per_node=4, memory=1e6)  # far less than any stage's states
    for planner in (pipedream_planner, even_planner, dp_planner):
        result = planner(scenario, PlannerOptions())
        assert result.best is None and result.note.startswith("no plan fits")
        assert result.spend.replays <= NO_FIT_PROBES and result.spend.engine_replays == 0


def test_even_candidates_at_16384_gpus_within_the_budget():
    scenario = load_scenario(LLAMA_405B_16K, ignore_plan=True)
    tables = CostTables(scenario)
    candidates, cut = even_candidates(scenario, PlannerOptions(), tables)
    assert 0 < len(candidates) <= PlannerOptions().max_candidates and not cut
    # unsharded, a stage's parameters, gradients and Adam states (16 bytes a parameter) fit in the
    # H100's 77 GiB only at 128 stages of one layer each (126 blocks, the embedding, the head):
    # 47.5 GiB; at 64 stages they need 95 GiB, so no candidate is made for 2 to 64
    assert scenario.model.num_layers == 128 and {c.num_stages for c in candidates} == {128}
    # micro-batches of 128 to 2,048 samples feed each stage's 128 replicas: 5 sizes × 3 recompute modes
    assert len(candidates) == 15 and min(c.microbatch_size for c in candidates) == 128
    few, cut = even_candidates(scenario, PlannerOptions(max_candidates=5), tables)
    assert len(few) == 5 and cut


def test_dp_without_a_sample_per_replica_replays_nothing():
    scenario = load_scenario(LLAMA_405B_16K, ignore_plan=True)  # 2,048 samples, 16,384 replicas
    result = dp_planner(scenario, PlannerOptions())
    assert result.best is None and result.spend.replays == 0
    assert result.note.startswith("no plan: no micro-batch size of the global batch (2,048)")
