"""DAPPLE's planner is never worse than its own space, within budgets that count work.

Its plan is at least as fast, by the SimPy engine, as every baseline's (pure data parallelism,
Megatron's grid, GPipe on even stages, PipeDream's plan) and as every other schedule its
plan's device sets could run (``planner.search.variants``); the planners of one run share
their replays (``planner.search.context``) without changing any planner's answer or spend.
"""

from __future__ import annotations

import json

import pytest

from planner.planners.baselines import megatron_planner
from planner.planners.dapple import RIVALS, dapple_planner
from planner.search.context import SearchContext
from planner.search.evaluation import evaluate
from planner.search.space import Candidate, PlannerOptions
from planner.search.variants import schedule_variants
from sim.input.scenario import parse_scenario

GPT = """
name: gpt-small-8
cluster: {{preset: a100-nvlink-8, nodes: {nodes}}}
model: {{preset: gpt, layers: 8, hidden: 1024, heads: 16, seq_len: 1024, vocab: 32768, dtype: bf16}}
training: {{global_batch_size: 32}}
"""
FEW = PlannerOptions(microbatch_sizes=(1, 4), chunks=(2,))


@pytest.fixture(scope="module")
def planned():
    scenario = parse_scenario(GPT.format(nodes=1), ignore_plan=True)
    context = SearchContext(scenario)
    return scenario, context, context.run("dapple", dapple_planner, FEW)


def test_dapple_is_at_least_as_fast_as_every_baseline(planned):
    scenario, context, result = planned
    assert result.best is not None and result.best.engine == "simpy"
    for name, planner in RIVALS:
        rival = context.run(name, planner, FEW)  # the run DAPPLE's planner made, shared
        if rival.best is not None:
            assert result.best.iteration_time_s <= rival.best.iteration_time_s, name


def test_dapple_is_at_least_as_fast_as_every_schedule_its_devices_could_run(planned):
    scenario, _, result = planned
    best = result.best
    others = schedule_variants(best.candidate, FEW.chunks)
    assert others  # an 8-GPU plan has other schedules
    for variant in others:
        replayed = evaluate(scenario, variant, engine="simpy")  # replayed afresh, not from the context
        if replayed.ok:
            assert best.iteration_time_s <= replayed.iteration_time_s, variant.schedule


def test_a_shared_context_changes_no_answer_and_no_spend(planned):
    scenario, context, _ = planned
    alone = megatron_planner(scenario, FEW)
    shared = context.run("megatron", megatron_planner, FEW)
    assert alone.best.candidate == shared.best.candidate
    assert alone.best.iteration_time_s == shared.best.iteration_time_s
    assert alone.spend.to_json() == shared.spend.to_json()
    assert context.run("megatron", megatron_planner, FEW) is shared  # asked twice: searched once


def test_dapple_spend_includes_its_rivals(planned):
    _, context, result = planned
    rivals = [context.run(name, planner, FEW).spend for name, planner in RIVALS]
    assert result.spend.candidates > sum(s.candidates for s in rivals)
    assert result.spend.engine_replays > sum(s.engine_replays for s in rivals)
    assert result.spend.partials > 0  # its dynamic programme's partial plans


def test_a_partial_plan_budget_stops_the_dynamic_programme_and_says_so():
    scenario = parse_scenario(GPT.format(nodes=1), ignore_plan=True)
    options = PlannerOptions(microbatch_sizes=(1, 4), chunks=(2,), max_partials=50)
    context = SearchContext(scenario)
    tight = context.run("dapple", dapple_planner, options)
    assert "partial plans (50)" in tight.spend.reached
    assert tight.best is not None  # the best so far: the rivals' plans at least
    rivals = sum(context.run(name, planner, options).spend.partials for name, planner in RIVALS)
    assert tight.spend.partials - rivals < 50 + 200  # its own DP stopped within one extension round


def test_a_candidate_budget_keeps_the_first_candidates_and_says_so():
    scenario = parse_scenario(GPT.format(nodes=1), ignore_plan=True)
    tight = megatron_planner(scenario, PlannerOptions(microbatch_sizes=(1, 4), chunks=(2,), max_candidates=3))
    assert "candidates (3)" in tight.spend.reached
    assert tight.spend.candidates == 3


def test_schedule_variants_of_a_uniform_plan():
    plain = Candidate(bounds=(0, 4, 8), replicas=(2, 2), microbatch_size=4, schedule="dapple")
    got = [(c.schedule, dict(c.params).get("policy"), c.chunks, c.bounds) for c in schedule_variants(plain, (2,))]
    assert got == [
        ("gpipe", None, 1, (0, 4, 8)),
        ("dapple", "2(s-i)-1", 1, (0, 4, 8)),
        ("zb-h1", None, 1, (0, 4, 8)),
        ("interleaved", None, 2, (0, 2, 4, 6, 8)),
        ("interleaved-zb", None, 2, (0, 2, 4, 6, 8)),
        ("looped-bfs", None, 2, (0, 2, 4, 6, 8)),
        ("zb-v", None, 2, (0, 2, 4, 6, 8)),
        ("dualpipe-v", None, 2, (0, 2, 4, 6, 8)),
    ]


def test_schedule_variants_of_a_looped_plan_merge_its_chunks_back():
    looped = Candidate(bounds=(0, 2, 4, 6, 8), replicas=(2,) * 4, microbatch_size=4, schedule="interleaved", chunks=2)
    got = [(c.schedule, c.chunks, c.bounds, c.replicas) for c in schedule_variants(looped, (2, 4))]
    assert ("looped-bfs", 2, (0, 2, 4, 6, 8), (2,) * 4) in got
    assert ("gpipe", 1, (0, 4, 8), (2, 2)) in got
    assert all(c != 4 for _, c, _, _ in got)  # a looped plan keeps its own chunk count


def test_an_uneven_plan_has_only_one_chunk_variants():
    uneven = Candidate(bounds=(0, 5, 8), replicas=(3, 1), microbatch_size=4)
    assert {c.schedule for c in schedule_variants(uneven, (2,))} == {"gpipe", "dapple", "zb-h1"}


def test_a_v_shaped_candidate_places_chunk_s_and_2s_minus_1_minus_s_together():
    scenario = parse_scenario(GPT.format(nodes=1), ignore_plan=True)
    v = Candidate(bounds=(0, 2, 4, 6, 8), replicas=(4, 4, 4, 4)[:2] * 2, microbatch_size=4, schedule="zb-v", chunks=2)
    groups = v.devices(scenario.cluster)
    assert groups[0] == groups[3] and groups[1] == groups[2] and groups[0] != groups[1]


def test_replays_on_worker_processes_give_the_same_answer_and_spend():
    scenario = parse_scenario(GPT.format(nodes=1), ignore_plan=True)
    here = SearchContext(scenario, workers=1).run("dapple", dapple_planner, FEW)
    pooled = SearchContext(scenario, workers=2)
    try:
        there = pooled.run("dapple", dapple_planner, FEW)
    finally:
        pooled.close()
    assert there.best.candidate == here.best.candidate
    assert there.best.iteration_time_s == here.best.iteration_time_s
    assert there.spend.to_json() == here.spend.to_json()
    assert [e.candidate for e in there.evaluations] == [e.candidate for e in here.evaluations]


def test_the_budgets_can_be_set_on_the_command_line(tmp_path, capsys):
    from planner.cli import main as plan_main

    path = tmp_path / "gpt.yaml"
    path.write_text(GPT.format(nodes=1).replace("{{", "{").replace("}}", "}"))
    assert plan_main([str(path), "--planner", "megatron", "--microbatch-size", "4", "--max-candidates", "3",
                      "--json"]) == 0
    spend = json.loads(capsys.readouterr().out)["planners"]["megatron"]["spend"]
    assert spend["candidates"] == 3 and spend["budget_reached"][0] == "candidates (3)"
    assert plan_main([str(path), "--max-replays", "-1"]) == 2
    assert "--max-replays -1: give a positive count" in capsys.readouterr().err


def test_the_exhaustive_search_stops_at_its_replay_budget_and_says_so():
    from planner.planners.exhaustive import exhaustive_planner

    tiny = parse_scenario(GPT.format(nodes=1).replace("layers: 8", "layers: 4").replace(
        "preset: a100-nvlink-8, nodes: 1", "preset: a100-nvlink-8, nodes: 1, devices_per_node: 4, nics_per_node: 4"),
        ignore_plan=True)
    result = exhaustive_planner(tiny, PlannerOptions(microbatch_sizes=(4,), max_engine_replays=2))
    assert result.spend.engine_replays == 2 and "engine replays (2)" in result.spend.reached
    assert result.best is not None and "not proven optimal" in result.note
