"""A resolved plan is built once and passed along: the reader, the compiler, the planner, the runtime.

``sim.schedule.resolved.resolve_plan`` derives a plan's K_i policies, schedule, lowered
schedule, sharded model and stage costs; ``Scenario.resolved`` keeps the result. These tests
count the work (a counter on ``schedule_for_plan``, ``stage_cost`` and ``lower`` in every
module that holds them) and check that a scenario whose plan, model, cluster or training is
replaced never reads a stale resolution.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

import sim.cost.compute
import sim.schedule.passes
import sim.schedule.plan_schedule
from planner.planners.dapple import RIVALS, dapple_planner
from planner.search.context import SearchContext
from planner.search.evaluation import evaluate
from planner.search.memory import plan_peak_bytes
from planner.search.space import Candidate, PlannerOptions, to_scenario
from sim.core.errors import DappleError
from sim.core.parallelism import Sharding
from sim.cost.compute import stage_cost
from sim.cost.links import embedding_group_link
from sim.engine.compile import compile_workload
from sim.engine.run import run_scenario
from sim.input.scenario import load_scenario
from sim.models import shard_model
from sim.schedule.passes import lower
from sim.schedule.plan_schedule import schedule_for_plan

BERT = "scenarios/bert48_v100_2x8.yaml"
"""Two stages of 8 replicas, dapple with policy auto, micro-batch 16: 2 samples per replica."""
UNEVEN = "scenarios/bert48_v100_15to1.yaml"
"""15 replicas then 1, micro-batch 32: stage 0's replicas take 3 or 2 samples, stage 1's takes 32."""
STRAGGLER = "scenarios/bert48_v100_straggler.yaml"


def _count(monkeypatch, module, name: str) -> list:
    """Calls of ``module.name`` from anywhere: every loaded module's reference to it is wrapped."""
    original, calls = getattr(module, name), []

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    for loaded in list(sys.modules.values()):
        if getattr(loaded, name, None) is original:
            monkeypatch.setattr(loaded, name, counted)
    return calls


@pytest.fixture
def counters(monkeypatch):
    return {"schedule_for_plan": _count(monkeypatch, sim.schedule.plan_schedule, "schedule_for_plan"),
            "stage_cost": _count(monkeypatch, sim.cost.compute, "stage_cost"),
            "lower": _count(monkeypatch, sim.schedule.passes, "lower")}


def test_a_planner_candidate_is_resolved_once_for_the_memory_check_the_fast_path_and_the_engine(counters):
    scenario = load_scenario(BERT, ignore_plan=True)
    assert scenario.plan is None and not any(counters.values())
    candidate = Candidate(bounds=(0, 26, 53), replicas=(8, 8), microbatch_size=16,
                          params=(("policy", "auto"),))
    resolved = {}
    fast = evaluate(scenario, candidate, engine="fast", resolved=resolved)
    engine = evaluate(scenario, candidate, engine="simpy", resolved=resolved)
    assert fast.ok and engine.ok and fast.summary is not None and engine.summary is not None
    assert fast.estimate == engine.estimate  # both memory counts read the one resolution
    # one schedule, one lowering, one stage cost per stage (16 // 8 = 2 samples on every replica)
    assert len(counters["schedule_for_plan"]) == 1
    assert len(counters["lower"]) == 1
    assert [args[2:5] for args in counters["stage_cost"]] == [(0, 26, 2), (26, 53, 2)]
    assert list(resolved) == [candidate]
    assert resolved[candidate].resolved.stage_policies is not None  # auto chose K_i from those costs


def test_a_search_resolves_each_candidate_once_whichever_engines_score_it(counters):
    scenario = load_scenario(BERT, ignore_plan=True)
    options = PlannerOptions(schedules=(("dapple", ()),), placements=("append",), recompute=(False,),
                             sharding=(Sharding.NONE,), microbatch_sizes=(8, 16), interleaved=False,
                             fast_top=4, fast_max=6, engine_top=2)
    context = SearchContext(scenario)
    result = context.run("dapple", dapple_planner, options)
    searched = [result] + [context.run(name, planner, options) for name, planner in RIVALS]  # run inside DAPPLE's
    evaluations = [e for r in searched for e in r.evaluations]
    fast = [e for e in evaluations if e.engine == "fast"]
    settled = [e for e in evaluations if e.engine == "simpy"]
    assert result.best is not None and settled and all(e.plan is not None for e in fast)
    assert {e.candidate for e in settled} <= {e.candidate for e in fast}
    # one schedule per candidate the fast path scored; the engine's verdicts built none of their own
    assert len(counters["schedule_for_plan"]) == len({e.candidate for e in fast})


def test_the_memory_check_reads_the_resolved_costs_not_its_own(counters):
    scenario = to_scenario(load_scenario(BERT, ignore_plan=True),
                           Candidate(bounds=(0, 26, 53), replicas=(8, 8), microbatch_size=16))
    built = len(counters["stage_cost"])
    estimate = plan_peak_bytes(scenario.resolved)
    assert len(counters["stage_cost"]) == built == 2 and len(counters["schedule_for_plan"]) == 1
    costs = scenario.resolved.stage_costs
    # under 1F1B (policy s-i) stage i holds K_i = S − i micro-batches' stash at its peak: 2, then 1
    peaks = [costs[0].static_bytes + 2 * costs[0].stash_bytes, costs[1].static_bytes + 1 * costs[1].stash_bytes]
    rank = max(range(2), key=peaks.__getitem__)
    assert estimate.peak_bytes == pytest.approx(peaks[rank]) and estimate.device == 8 * rank
    assert estimate.static_bytes == costs[rank].static_bytes


def test_loading_and_running_a_scenario_builds_its_schedule_once(counters):
    scenario = load_scenario(BERT)
    run_scenario(scenario, engine="simpy")
    run_scenario(scenario, engine="fast")
    assert len(counters["schedule_for_plan"]) == 1 and len(counters["lower"]) == 1
    assert len(counters["stage_cost"]) == 2  # one per stage: every replica takes 2 samples


def test_the_fault_free_baseline_reuses_the_resolution(counters):
    result = run_scenario(load_scenario(STRAGGLER))
    assert result.baseline is not None
    assert len(counters["schedule_for_plan"]) == 1 and len(counters["stage_cost"]) == 4


def test_uneven_replicas_get_one_cost_per_distinct_slice(counters):
    scenario = load_scenario(UNEVEN)
    resolved = scenario.resolved
    # 32 samples over 15 replicas: 2 take 3, 13 take 2; the single replica of stage 1 takes all 32
    assert [[cost.samples for cost in costs] for costs in resolved.costs] == [[3, 2], [32]]
    assert [cost.samples for cost in resolved.stage_costs] == [3, 32]
    assert len(counters["stage_cost"]) == 3
    plan, cluster = scenario.plan, scenario.cluster
    direct = stage_cost(shard_model(scenario.model, plan.shard), cluster.device, 0, 50, 2,
                        recompute=plan.recompute, data_parallel=15, sharding=plan.sharding,
                        tied_link=embedding_group_link(plan, cluster))
    assert resolved.stage_cost(0, 2) == direct
    with pytest.raises(KeyError):
        resolved.stage_cost(0, 5)
    before = len(counters["stage_cost"])
    workload = compile_workload(scenario)
    assert len(counters["stage_cost"]) == before  # the compiler reads them too
    by_slice = {cls.samples: cls.static_bytes for cls in workload.classes}
    assert by_slice[(3,)] == resolved.stage_cost(0, 3).static_bytes
    assert by_slice[(32,)] == resolved.stage_cost(1, 32).static_bytes


def test_the_resolution_is_the_reader_s_and_holds_the_lowered_schedule():
    scenario = load_scenario(BERT)
    resolved = scenario.resolved
    assert resolved is scenario.resolved and resolved.plan is scenario.plan
    assert resolved.schedule == schedule_for_plan(scenario.plan, 8, stage_policies=resolved.stage_policies)
    assert resolved.lowered == lower(resolved.schedule) and resolved.lowered.is_lowered
    assert resolved.num_microbatches == 128 // 16
    assert resolved.model == shard_model(scenario.model, scenario.plan.shard)


def test_a_replaced_plan_model_or_training_is_resolved_afresh():
    scenario = load_scenario(BERT)
    old = scenario.resolved
    assert scenario.without_faults().resolved is old
    # a new plan (the planner's to_scenario, compare's variants)
    plan = replace(scenario.plan, stages=(replace(scenario.plan.stages[0], layers=(0, 20)),
                                          replace(scenario.plan.stages[1], layers=(20, 53))))
    moved = replace(scenario, plan=plan)
    assert moved.resolved is not old and moved.resolved.plan is plan
    assert moved.resolved.stage_costs[0] != old.stage_costs[0]
    # new training: the micro-batch count and the slices follow
    smaller = replace(scenario, training=replace(scenario.training, microbatch_size=8))
    assert smaller.resolved.num_microbatches == 16 and smaller.resolved.stage_costs[0].samples == 1
    assert old.num_microbatches == 8 and old.stage_costs[0].samples == 2
    # and no plan, nothing to resolve
    with pytest.raises(DappleError, match="plan: missing"):
        _ = replace(scenario, plan=None).resolved


def test_set_and_plan_overrides_resolve_what_they_read():
    scenario = load_scenario(BERT, {"training.microbatch_size": "32"})
    assert scenario.resolved.num_microbatches == 4 and scenario.resolved.stage_costs[0].samples == 4
    assert len(scenario.resolved.schedule.ranks[0]) == 2 * 4  # a forward and a backward per micro-batch
    plan = {"schedule": "gpipe", "stages": [{"layers": [0, 30], "devices": "0-7"},
                                            {"layers": [30, 53], "devices": "8-15"}]}
    other = load_scenario(BERT, plan=plan)
    assert other.resolved.plan is other.plan and other.plan.stages[0].layers == (0, 30)
    assert other.resolved.stage_policies is None and other.resolved.stage_costs[0] != scenario.resolved.stage_costs[0]


def test_a_candidate_on_a_scenario_with_a_plan_resolves_the_candidate():
    scenario = load_scenario(BERT)
    file_plan = scenario.resolved
    candidate = Candidate(bounds=(0, 10, 53), replicas=(4, 12), microbatch_size=8, schedule="gpipe")
    planned = to_scenario(scenario, candidate)
    assert planned.resolved.plan is planned.plan and planned.resolved is not file_plan
    assert [cost.samples for cost in planned.resolved.stage_costs] == [2, 1]
    assert planned.resolved.num_microbatches == 128 // 8
