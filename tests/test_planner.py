"""Planners: placement policies, DAPPLE against the exhaustive optimum, baselines, the CLI."""

from __future__ import annotations

import json
import random

import pytest

from conftest import SCENARIOS
from planner.planners.baselines import dp_planner, even_planner
from planner.planners.dapple import dapple_planner
from planner.planners.exhaustive import exhaustive_planner, lower_bound_s
from planner.planners.pipedream import pipedream_planner
from planner.search.costs import CostTables
from planner.search.evaluation import evaluate
from planner.search.space import Candidate, PlannerOptions, place
from sim.core.model_spec import LayerSpec, ModelSpec
from sim.core.parallelism import Sharding
from sim.core.specs import ClusterSpec, DeviceSpec, LinkSpec
from sim.core.training import TrainingSpec
from sim.input.scenario import Scenario, load_scenario


def _cluster(nodes, per_node, memory=2.0**40, inter=2e9, intra=2e10):
    device = DeviceSpec(name="gpu", memory_bytes=memory, peak_flop_per_s=1e14, peak_fp32_flop_per_s=1e13,
                        memory_bandwidth_bytes_per_s=1e12)
    return ClusterSpec(nodes=nodes, devices_per_node=per_node, device=device,
                       intra_node=LinkSpec(bandwidth_bytes_per_s=intra, latency_s=5e-6),
                       inter_node=LinkSpec(bandwidth_bytes_per_s=inter, latency_s=2e-5))


def test_placement_policies():
    cluster = _cluster(3, 4)
    assert place((3, 2, 3), cluster, "append") == ((0, 1, 2), (3, 4), (5, 6, 7))
    # Fresh First: each stage starts on an unused server while there is one
    assert place((3, 2, 3), cluster, "fresh") == ((0, 1, 2), (4, 5), (8, 9, 10))
    # Scatter First: one device per server in turn
    assert place((3, 2, 3), cluster, "scatter") == ((0, 4, 8), (1, 5), (2, 6, 9))


def _random_instance(seed: int) -> Scenario:
    rng = random.Random(seed)
    per_node = rng.choice([1, 2, 4])
    nodes = rng.choice([n for n in (1, 2, 4, 8) if 4 <= n * per_node <= 8])
    num_layers = rng.randint(6, 12) if nodes * per_node < 8 else rng.randint(6, 10)
    layers = tuple(
        LayerSpec(name=f"l{i}", param_bytes=rng.choice([0.0, 1e6, 2e7, 1e8]), output_bytes=0.0,
                  stash_bytes=rng.uniform(1e5, 1e7), fwd_s=rng.uniform(1e-4, 3e-3), bwd_s=rng.uniform(2e-4, 6e-3))
        for i in range(num_layers)
    )
    boundary = (0.0,) + tuple(rng.choice([1e4, 1e5, 1e6]) for _ in range(num_layers - 1)) + (0.0,)
    model = ModelSpec(name=f"random-{seed}", layers=layers, boundary_bytes=boundary, dtype="fp32", optimizer="sgd")
    gbs = rng.choice([8, 16])
    # memory from plenty to less than any plan needs: a share of the whole model's states and
    # of four samples' activations on one device
    whole = 2 * sum(layer.param_bytes for layer in layers) + 4 * sum(layer.stash_bytes for layer in layers)
    memory = whole * rng.choice([1e3, 1.0, 0.6, 0.4, 0.25, 0.02])
    return Scenario(name=f"random-{seed}", cluster=_cluster(nodes, per_node, memory=memory), model=model,
                    training=TrainingSpec(global_batch_size=gbs, microbatch_size=gbs), plan=None)


SMALL = PlannerOptions(schedules=(("dapple", ()),), placements=("append", "scatter"), recompute=(False,),
                       sharding=(Sharding.NONE,), microbatch_sizes=(2, 4), interleaved=False)


# 12 seeds in the default suite, all 30 under -m slow (each an exhaustive search: up to 6 s)
@pytest.mark.parametrize("seed", [s if s < 12 else pytest.param(s, marks=pytest.mark.slow) for s in range(30)])
def test_dapple_is_within_two_percent_of_the_exhaustive_optimum(seed):
    """4-8 devices on 1-8 servers, random layer costs and memory: DAPPLE's planner finds a plan
    whenever one fits, never 2% slower than the engine's optimum, and says why when none does."""
    scenario = _random_instance(seed)
    exhaustive = exhaustive_planner(scenario, SMALL)
    dapple = dapple_planner(scenario, SMALL)
    if exhaustive.best is None:
        assert dapple.best is None and dapple.note.startswith("no plan fits: the smallest peak found is ")
        return
    assert dapple.best is not None, dapple.note
    assert dapple.best.engine == exhaustive.best.engine == "simpy"
    assert dapple.best.peak_memory_bytes <= scenario.cluster.device.memory_bytes
    assert dapple.best.iteration_time_s <= 1.02 * exhaustive.best.iteration_time_s


def test_exhaustive_lower_bound_never_exceeds_the_engine():
    scenario = _random_instance(3)
    tables = CostTables(scenario)
    layers = scenario.model.num_layers
    for bounds, replicas in (((0, layers), (2,)), ((0, 1, layers), (1, 1)), ((0, 2, layers), (1, 2))):
        candidate = Candidate(bounds=bounds, replicas=replicas, microbatch_size=2)
        bound = lower_bound_s(tables, candidate, scenario.training.global_batch_size // 2, scenario.cluster)
        assert bound <= evaluate(scenario, candidate, engine="simpy").iteration_time_s * (1 + 1e-12)


def test_memory_is_checked_and_the_reason_kept():
    scenario = _random_instance(5)
    tiny = Scenario(name="tiny", cluster=_cluster(1, 2, memory=1e6), model=scenario.model,
                    training=scenario.training, plan=None)
    candidate = Candidate(bounds=(0, scenario.model.num_layers), replicas=(2,), microbatch_size=2)
    evaluation = evaluate(tiny, candidate)
    assert not evaluation.ok and "runs out of memory" in evaluation.rejected
    result = dp_planner(tiny, SMALL)
    assert result.best is None and "no plan fits" in result.note


def test_baselines_follow_their_rules():
    scenario = _random_instance(7)
    n, layers = scenario.cluster.num_devices, scenario.model.num_layers
    even = even_planner(scenario, SMALL).best
    if even is not None:
        sizes = [b - a for a, b in zip(even.candidate.bounds, even.candidate.bounds[1:])]
        assert max(sizes) - min(sizes) <= 1 and set(even.candidate.replicas) == {n // len(sizes)}
        assert even.candidate.schedule == "gpipe"
    assert dp_planner(scenario, SMALL).best.candidate.replicas == (n,)
    pipedream = pipedream_planner(scenario, SMALL).best.candidate
    assert pipedream.bounds[0] == 0 and pipedream.bounds[-1] == layers and sum(pipedream.replicas) <= n


def test_plan_command_json_and_plan_file_round_trip(tmp_path, capsys):
    from planner.cli import main as plan_main
    from sim.app.cli import main as sim_main

    scenario = str(SCENARIOS / "bert48_v100_2x8.yaml")
    assert plan_main([scenario, "--planner", "dapple", "--planner", "dp", "--microbatch-size", "16", "--json",
                      "--out", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) >= {"best", "planners", "search_time_s"}
    assert set(report["planners"]) == {"dapple", "dp"}
    # the plan alone under best, its metrics beside it (best_metrics; planners' plan and metrics)
    best, metrics = report["best"], report["best_metrics"]
    assert metrics["planner"] == "dapple" and best["microbatch_size"] == 16
    assert metrics["iteration_time_s"] <= report["planners"]["dp"]["metrics"]["iteration_time_s"]
    assert report["planners"]["dapple"]["plan"] == best
    assert json.loads((tmp_path / "best_plan.json").read_text()) == best
    assert json.loads((tmp_path / "best_plan_metrics.json").read_text()) == metrics
    for kind in ("gantt", "memory"):  # the all-forwards-first order and the best plan's own
        assert len([p for p in tmp_path.glob(f"{kind}_*.png") if p.stat().st_size > 0]) == 2
    assert sim_main(["simulate", scenario, "--plan", str(tmp_path / "best_plan.json"), "--json"]) == 0
    simulated = json.loads(capsys.readouterr().out)
    assert simulated["iteration_time_s"] == pytest.approx(metrics["iteration_time_s"], rel=1e-9)


def test_plan_command_rejects_unknown_planner(capsys):
    from planner.cli import main as plan_main

    with pytest.raises(SystemExit) as info:
        plan_main([str(SCENARIOS / "bert48_v100_2x8.yaml"), "--planner", "magic"])
    assert info.value.code == 2


def test_exhaustive_refuses_large_cases():
    from sim.core.errors import DappleError

    with pytest.raises(DappleError, match="exhaustive search is for at most 8 devices"):
        exhaustive_planner(load_scenario(SCENARIOS / "bert48_v100_2x8.yaml"), SMALL)


def test_interleaved_candidates_reuse_device_sets_and_run():
    from planner.planners.dapple import _interleaved
    from planner.search.space import to_scenario

    scenario = load_scenario(SCENARIOS / "gpt1.3b_h100_interleaved.yaml")
    base = Candidate(bounds=(0, 13, 26), replicas=(4, 4), microbatch_size=4)
    variants = _interleaved([base], 64, PlannerOptions(placements=("append",), chunks=(2,)))
    assert len(variants) == 1
    candidate = variants[0]
    assert candidate.bounds == (0, 6, 13, 19, 26) and candidate.chunks == 2
    assert candidate.devices(scenario.cluster) == ((0, 1, 2, 3), (4, 5, 6, 7), (0, 1, 2, 3), (4, 5, 6, 7))
    planned = to_scenario(scenario, candidate)
    assert planned.plan.schedule == "interleaved" and planned.plan.stage_ranks == (0, 1, 0, 1)
    assert evaluate(scenario, candidate).ok
