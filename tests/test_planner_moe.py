"""The planner searches the expert-parallel degree (issue 31, item 4).

An MoE stage is priced by the planner's tables on its EP degree with the engine's own functions
(the grouped GEMMs on the busiest rank, the all-to-all, the expert states over their own
data-parallel group, the two gradient groups), so a one-stage plan's table figures equal what
the engine replays; on a small fine-grained MoE on 2 × 8 GPUs the planner picks EP > 1, never
slower than its best EP 1 plan or the shipped EP 8 plan; the degree is in ``--json``, the plan
file and the summary line, and reads back through ``--plan``; an impossible EP is one line.
"""

from __future__ import annotations

import json

import pytest

from planner.cli import main as plan_main
from planner.search.costs import CostTables
from planner.search.describe import plan_summary
from planner.search.layouts import layouts, replica_step
from planner.search.space import Candidate, PlannerOptions
from sim.app.cli import main as sim_main
from sim.core.parallelism import Recompute, Sharding
from sim.cost.comm import all_to_all_s
from sim.engine.run import run_scenario
from sim.engine.workload import GROUP, REDUCE
from sim.input.scenario import load_scenario, parse_scenario

REL = 1e-9
TINY = """
name: moe-tiny
cluster: {preset: dgx-h100, nodes: 1}
model: {preset: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 2, seq_len: 32, vocab: 128,
        experts: {count: 8, top_k: 2, ffn_hidden: 128}}
training: {global_batch_size: 8, microbatch_size: 8}
plan: {schedule: gpipe, pipeline_parallel: 1, data_parallel: 8, expert_parallel: 4, sharding: optimizer}
"""
FINE = """
name: moe-fine-2x8
cluster: {preset: dgx-h100, nodes: 2}
model: {preset: llama, layers: 4, hidden: 1024, heads: 8, kv_heads: 4, seq_len: 1024, vocab: 1024,
        experts: {count: 64, top_k: 4, ffn_hidden: 512}}
training: {global_batch_size: 64, microbatch_size: 16}
plan: {pipeline_parallel: 2, data_parallel: 8, expert_parallel: 8}
"""


def _op_seconds(result, code: int) -> dict[str, list[float]]:
    seconds: dict[str, list[float]] = {}
    for cls, rec in zip(result.workload.classes, result.records):
        for op, times in zip(cls.ops, rec.op_times):
            if op.code == code:
                seconds.setdefault(op.kind.value, []).append(times[1] - times[0])
    return seconds


def test_an_moe_stage_is_priced_as_the_engine_replays_it():
    scenario = parse_scenario(TINY, source="moe-tiny.yaml")
    tables = CostTables(scenario, expert_parallel=4)
    layers, cost = tables.num_layers, scenario.resolved.stage_costs[0]
    # one sample a replica (8 over 8): compute on the busiest rank's rows, the engine's StageCost
    f, b, overhead = tables.own_compute_s(0, layers, 1, Recompute.NONE)
    assert (f + overhead, b + overhead) == pytest.approx((cost.fwd_s, cost.bwd_s), rel=REL)
    # expert states: dense ZeRO-1 over 8, the experts' over the t·c·r/e = 2 that hold the same experts
    assert tables.expert_data_parallel(8) == 2
    assert tables.static_bytes(0, layers, 8, Sharding.OPTIMIZER) == pytest.approx(cost.static_bytes, rel=REL)
    assert tables.optimizer_s(0, layers, 8, Sharding.OPTIMIZER) == pytest.approx(cost.optimizer_s, rel=REL)
    # the dispatch + combine, alone in the SimPy engine, and written out: EP 4 on one server sends
    # 3/4 of its two payloads over NVLink at 450 GB/s × 0.78, one latency
    engine = _op_seconds(run_scenario(scenario, engine="simpy", contention=True), GROUP)
    forward, backward = tables.all_to_all_s(0, layers, 1)
    assert engine["F"] == pytest.approx([forward] * len(engine["F"]), rel=REL)
    assert engine["B"] == pytest.approx([backward] * len(engine["B"]), rel=REL)
    payload = 2 * sum(layer.a2a_bytes for layer in tables.model.layers)
    assert forward == pytest.approx(all_to_all_s([4], payload, scenario.cluster), rel=REL)
    assert forward == pytest.approx(3 / 4 * payload / (450e9 * 0.78) + 3e-6, rel=REL)
    # the two gradient groups in the same phase, as the fast path replays them
    reduce = _op_seconds(run_scenario(scenario, engine="fast", contention=False), REDUCE)["REDUCE_GRAD"]
    assert reduce == pytest.approx([tables.allreduce_s(0, layers, 8, 1, Sharding.OPTIMIZER)] * len(reduce), rel=REL)


def test_the_layouts_of_an_moe_model_carry_the_expert_degrees_inside_a_server():
    scenario = parse_scenario(FINE, source="fine.yaml", ignore_plan=True)
    found = layouts(scenario, PlannerOptions())
    assert {e for _, _, e in found} == {1, 2, 4, 8}  # 64 experts, 8 GPUs a server: 16 and up cross servers
    assert (1, 1, 8) in found and (4, 1, 8) in found  # 4 key/value heads: TP up to 4
    assert layouts(scenario, PlannerOptions(expert_parallel=(16,))) == [(t, 1, 16) for t in (1, 2, 4)]
    # a stage's replicas make t·c·replicas a multiple of EP
    assert (replica_step((1, 1, 8)), replica_step((2, 1, 8)), replica_step((8, 1, 4))) == (8, 4, 1)


def test_the_summary_line_names_expert_parallelism():
    candidate = Candidate(bounds=(0, 1, 2, 3, 4), replicas=(8,) * 4, microbatch_size=16, tensor_parallel=2,
                          expert_parallel=8)
    assert plan_summary(candidate, global_batch_size=64).startswith("TP 2 × EP 8 × PP 4 (1F1B) × DP 8 · ")
    assert "expert 8" in candidate.layout()


def _plan(path, capsys, *flags) -> dict:
    assert plan_main([str(path), "--json", "-q", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_planner_picks_expert_parallelism_and_it_reads_back(tmp_path, capsys):
    path = tmp_path / "fine.yaml"
    path.write_text(FINE)
    searched = _plan(path, capsys)
    plan, metrics = searched["best"], searched["best_metrics"]
    assert plan["expert_parallel"] > 1 and metrics["expert_parallel"] == plan["expert_parallel"]
    assert f"EP {plan['expert_parallel']} ×" in metrics["summary"]
    without = _plan(path, capsys, "--expert-parallel", "1")
    assert "expert_parallel" not in without["best"]
    shipped = run_scenario(load_scenario(str(path)), engine="simpy", contention=True).summarize().iteration_time_s
    assert metrics["iteration_time_s"] <= without["best_metrics"]["iteration_time_s"]
    assert metrics["iteration_time_s"] <= shipped
    # the plan file round-trips: simulate --plan replays the same plan in the same time
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    assert sim_main(["simulate", str(path), "--plan", str(plan_path), "--json"]) == 0
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["iteration_time_s"] == pytest.approx(metrics["iteration_time_s"], rel=1e-12)


@pytest.mark.parametrize("flag, scenario, words", [
    ("3", FINE, "expert_parallel: 3 is not a degree for 64 routed experts on 16 devices; use a divisor of both"),
    ("2", TINY.replace("experts: {count: 8, top_k: 2, ffn_hidden: 128}", "ffn_hidden: 128").replace(
        ", expert_parallel: 4", ""), "has no experts (model.experts)"),
])
def test_an_impossible_expert_degree_is_refused_in_one_line(tmp_path, capsys, flag, scenario, words):
    path = tmp_path / "s.yaml"
    path.write_text(scenario)
    assert plan_main([str(path), "--expert-parallel", flag]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err
