"""4D plans on real gloo ranks: tensor (and sequence) parallelism, ZeRO-1, ZeRO-2 (FSDP2 without
resharding after the forward) and FSDP2 train one
step exactly like the unsplit model in one process (rtol 1e-5, fp32), and a sharded optimizer
steps to the same weights as an unsharded one.

All cases of one world size share one set of processes (one spawn per world size).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.tensor.parallel")

from conftest import SCENARIOS, kinds_beside_prediction, spawn_checked

pytestmark = pytest.mark.dist

GPT = str(SCENARIOS / "gpt_tiny_cpu.yaml")
TP2_PP2 = "[{layers: [0, 3], devices: [0, 1]}, {layers: [3, 6], devices: [2, 3]}]"
ONE_STAGE_4 = "[{layers: [0, 6], devices: [0, 1, 2, 3]}]"
ONE_STAGE_2 = "[{layers: [0, 6], devices: [0, 1]}]"
DP2_PP2 = TP2_PP2  # the same layout without tensor parallelism: two replicas per stage
FOUR = {"cluster.devices_per_node": "4"}

FOUR_RANKS = {
    "tp2-pp2": {**FOUR, "plan.tensor_parallel": "2", "plan.stages": TP2_PP2},
    "tp2-pp2-sp": {**FOUR, "plan.tensor_parallel": "2", "plan.sequence_parallel": "true", "plan.stages": TP2_PP2},
    "tp2-dp2-zero1": {**FOUR, "plan.tensor_parallel": "2", "plan.sharding": "optimizer", "plan.stages": ONE_STAGE_4},
    "dp2-pp2-zero2": {**FOUR, "plan.sharding": "gradients", "plan.stages": DP2_PP2},
}
TWO_RANKS = {
    "dp2": {"plan.stages": ONE_STAGE_2},
    "dp2-fsdp": {"plan.sharding": "full", "plan.stages": ONE_STAGE_2},
    "dp2-fsdp-accumulate": {"plan.sharding": "full", "plan.fsdp.reduce_every_microbatch": "false",  # the last reduces
                            "plan.stages": ONE_STAGE_2},
    "dp2-zero2": {"plan.sharding": "gradients", "plan.stages": ONE_STAGE_2},
    "pp2-selective": {"plan.recompute": "selective"},  # the shipped two-stage plan
    "llama-tp2-selective": {"model.preset": "llama", "model.kv_heads": "2", "plan.tensor_parallel": "2",
                            "plan.recompute": "selective", "plan.stages": ONE_STAGE_2},
    "llama-pp2-selective-op": {"model.preset": "llama", "model.kv_heads": "2", "plan.recompute": "selective-op"},
    "llama-tp2": {"model.preset": "llama", "model.kv_heads": "2", "plan.tensor_parallel": "2",
                  "plan.stages": ONE_STAGE_2},
}
SLOW_FOUR_RANKS = {  # schedules with split backwards, chunks and recompute under tensor parallelism; 2D FSDP
    "tp2-dp2-fsdp-sp": {**FOUR, "plan.tensor_parallel": "2", "plan.sequence_parallel": "true", "plan.sharding": "full",
                        "plan.stages": ONE_STAGE_4},  # FSDP2 over the data dimension of tensor-parallel DTensors
    "tp2-pp2-zb-h1-sp": {**FOUR, "plan.tensor_parallel": "2", "plan.sequence_parallel": "true",
                         "plan.schedule": "zb-h1", "plan.stages": TP2_PP2},
    "tp2-pp2-recompute": {**FOUR, "plan.tensor_parallel": "2", "plan.recompute": "true", "plan.stages": TP2_PP2},
    "tp2-interleaved": {**FOUR, "plan.tensor_parallel": "2", "plan.schedule": "interleaved",
                        "plan.stages": "[{layers: [0, 2], devices: [0, 1]}, {layers: [2, 3], devices: [2, 3]},"
                                       " {layers: [3, 4], devices: [0, 1]}, {layers: [4, 6], devices: [2, 3]}]"},
    "llama-tp2-sp-dp2-zero1": {**FOUR, "model.preset": "llama", "plan.tensor_parallel": "2",
                               "plan.sequence_parallel": "true", "plan.sharding": "optimizer",
                               "plan.stages": ONE_STAGE_4},
}
SLOW_TWO_RANKS = {
    "dp2": {"plan.stages": ONE_STAGE_2},
    "dp2-fsdp-recompute": {"plan.sharding": "full", "plan.recompute": "true", "plan.stages": ONE_STAGE_2},
}
SIX_RANKS = {  # DAPPLE's uneven plan: 2 replicas (tensor 2 each) feeding 1
    "tp2-2:1": {"cluster.devices_per_node": "6", "plan.tensor_parallel": "2", "training.microbatch_size": "3",
                "training.global_batch_size": "12",
                "plan.stages": "[{layers: [0, 3], devices: [0, 1, 2, 3]}, {layers: [3, 6], devices: [4, 5]}]"},
    "tp2-sp-2:1-gpipe": {"cluster.devices_per_node": "6", "plan.tensor_parallel": "2", "plan.sequence_parallel": "true",
                         "plan.schedule": "gpipe", "training.microbatch_size": "3", "training.global_batch_size": "12",
                         "plan.stages": "[{layers: [0, 3], devices: [0, 1, 2, 3]}, {layers: [3, 6], devices: [4, 5]}]"},
}



def _spawn(nproc: int, cases: dict):
    return spawn_checked(GPT, nproc, cases)


@pytest.fixture(scope="module")
def four_ranks():
    return _spawn(4, FOUR_RANKS)


@pytest.fixture(scope="module")
def two_ranks():
    return _spawn(2, TWO_RANKS)


def _assert_matches(summary):
    assert summary["check_passed"], (summary["max_rel_grad_diff"], summary["worst_grad"])
    assert summary["loss"] == pytest.approx(summary["reference_loss"], rel=1e-5)


@pytest.mark.parametrize("name", sorted(FOUR_RANKS))
def test_four_rank_4d_plans_match_the_unsplit_model(four_ranks, name):
    _assert_matches(four_ranks[name])


@pytest.mark.parametrize("name", sorted(TWO_RANKS))
def test_two_rank_plans_match_the_unsplit_model(two_ranks, name):
    _assert_matches(two_ranks[name])


def test_sharded_optimizers_step_to_the_same_weights(four_ranks, two_ranks):
    # step 1's loss is computed with the weights after step 0's optimizer step: ZeRO-1 over
    # tensor-parallel shards, FSDP2 and Adam on DTensor shards step to the 2D run's weights
    expected = two_ranks["dp2"]["losses"][1]
    assert four_ranks["tp2-dp2-zero1"]["losses"][1] == pytest.approx(expected, rel=1e-5)
    assert two_ranks["dp2-fsdp"]["losses"][1] == pytest.approx(expected, rel=1e-5)
    assert two_ranks["dp2-fsdp-accumulate"]["losses"][1] == pytest.approx(expected, rel=1e-5)
    assert two_ranks["dp2-zero2"]["losses"][1] == pytest.approx(expected, rel=1e-5)
    assert four_ranks["dp2-pp2-zero2"]["losses"][1] == pytest.approx(expected, rel=1e-5)
    assert four_ranks["tp2-pp2-sp"]["losses"][1] == pytest.approx(expected, rel=1e-5)


def test_model_states_are_counted_by_kind_as_the_simulator_predicts(four_ranks, two_ranks):
    for summary, overrides in [(four_ranks["tp2-pp2"], FOUR_RANKS["tp2-pp2"]),
                               (four_ranks["tp2-dp2-zero1"], FOUR_RANKS["tp2-dp2-zero1"]),
                               (two_ranks["dp2-fsdp"], TWO_RANKS["dp2-fsdp"])]:
        for kinds, expected in kinds_beside_prediction(GPT, overrides, summary):
            assert kinds["parameters"] == pytest.approx(expected.parameters, rel=0.02)
            assert kinds["gradients"] == pytest.approx(expected.gradients, rel=0.02)
            # ZeRO-1 shards by whole tensors (torch's greedy partition), not exactly 1/d of the bytes
            rel = 0.25 if overrides.get("plan.sharding") == "optimizer" else 0.02
            assert kinds["optimizer"] == pytest.approx(expected.optimizer, rel=rel)


def test_zero2_holds_sharded_gradients_and_state_and_at_the_peak_whole_parameters_beside_a_shard(four_ranks,
                                                                                                   two_ranks):
    # FSDP2 with reshard_after_forward=False: gradients and optimizer state 1/d as ZeRO-2 (the
    # prediction); at the peak the parameters gathered whole (ZeRO-2's, the prediction) beside
    # FSDP2's 1/d shard at rest: P (1 + 1/d), d = 2
    from runtime.model.config import load_runnable
    from runtime.model.realisation import realisation_notes
    from sim.engine.run import run_scenario

    for summary, overrides in [(two_ranks["dp2-zero2"], TWO_RANKS["dp2-zero2"]),
                               (four_ranks["dp2-pp2-zero2"], FOUR_RANKS["dp2-pp2-zero2"])]:
        runnable = load_runnable(GPT, overrides)
        predicted = run_scenario(runnable.scenario, engine="fast").summarize()
        whole = {d["device"]: d["memory_breakdown_bytes"] for d in two_ranks["dp2"]["devices"]}
        for measured, device in zip(summary["devices"], predicted.devices):
            kinds, expected = measured["memory_breakdown_bytes"], device.memory_breakdown
            assert kinds["gradients"] == pytest.approx(expected.gradients, rel=0.02)
            assert kinds["optimizer"] == pytest.approx(expected.optimizer, rel=0.02)
            assert kinds["parameters"] == pytest.approx(expected.parameters * (1 + 1 / 2), rel=0.02)
        if summary is two_ranks["dp2-zero2"]:  # one stage of the whole model: 1.5 times the unsharded run's
            assert all(measured["memory_breakdown_bytes"]["parameters"] == whole[measured["device"]]["parameters"] * 1.5
                       for measured in summary["devices"])
        (note,) = realisation_notes(runnable.plan)
        assert "reshard_after_forward=False" in note and "(1 + 1/d) of its parameters" in note


@pytest.mark.slow
def test_more_4d_plans_match_the_unsplit_model():
    results = {**_spawn(4, SLOW_FOUR_RANKS), **_spawn(2, SLOW_TWO_RANKS)}
    for name in [*SLOW_FOUR_RANKS, *SLOW_TWO_RANKS]:
        _assert_matches(results[name])
    # 2D FSDP steps to the weights of the plain data-parallel run
    assert results["tp2-dp2-fsdp-sp"]["losses"][1] == pytest.approx(results["dp2"]["losses"][1], rel=1e-5)


@pytest.mark.slow
def test_an_uneven_dapple_plan_with_tensor_parallelism_matches_the_unsplit_model():
    results = _spawn(6, SIX_RANKS)
    for name in SIX_RANKS:
        _assert_matches(results[name])


@pytest.mark.parametrize(("overrides", "message"), [
    ({"plan.sharding": "full", "plan.schedule": "zb-h1", "plan.stages": ONE_STAGE_2},
     "plan.sharding: not supported by the runtime"),
    ({"plan.sharding": "gradients", "plan.schedule": "zb-h1", "plan.stages": ONE_STAGE_2},
     "plan.sharding: not supported by the runtime"),
    ({"plan.recompute": "selective", "plan.schedule": "zb-h1"}, "plan.recompute: not supported by the runtime"),
], ids=["fsdp-zb", "zero2-zb", "selective-zb"])
def test_what_the_runtime_cannot_run_is_one_line_before_launch(overrides, message):
    from runtime.model.config import load_runnable
    from sim.core.errors import DappleError

    with pytest.raises(DappleError) as info:
        load_runnable(GPT, overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_each_tensor_rank_talks_to_the_same_tensor_rank_of_the_next_stage():
    from runtime.execution.comm import message_orders
    from runtime.model.config import load_runnable
    from sim.schedule.passes import lower
    from sim.schedule.plan_schedule import schedule_for_plan

    runnable = load_runnable(GPT, {**SIX_RANKS["tp2-2:1"], "plan.schedule": "gpipe"})
    lowered = lower(schedule_for_plan(runnable.plan, runnable.scenario.training.num_microbatches))
    pairs = sorted(message_orders(runnable.plan, lowered, runnable.scenario.training.microbatch_size))
    # replicas (0, 1) and (2, 3) feed (4, 5): tensor rank 0 to 4, tensor rank 1 to 5, and back
    assert pairs == [(0, 4), (1, 5), (2, 4), (3, 5), (4, 0), (4, 2), (5, 1), (5, 3)]


def test_a_collapsed_plan_has_one_device_per_tensor_group_and_expands_back():
    from runtime.model.config import load_runnable
    from runtime.validation.collapse import collapsed_stages, expand_view

    plan = load_runnable(GPT, SIX_RANKS["tp2-2:1"]).plan
    assert collapsed_stages(plan) == [{"layers": [0, 3], "devices": [0, 1]}, {"layers": [3, 6], "devices": [2]}]
    from sim.core.events import EventRow
    from sim.core.validation_sides import DeviceSide
    from sim.report.analysis.validation import run_side

    view = run_side(iteration_time_s=1.0, events=[EventRow(device=2, stage=1, kind="F", microbatch=0, action="1F0",
                                                           stream="compute", start_s=0.0, end_s=1.0)],
                    devices=[DeviceSide(device=g, stages=None, peak_memory_bytes=10.0 * g, peak_activation_bytes=None,
                                        memory_breakdown_bytes=None) for g in range(3)])
    expanded = expand_view(view, plan)
    assert [(d.device, d.peak_memory_bytes) for d in expanded.devices] == \
        [(0, 0.0), (1, 0.0), (2, 10.0), (3, 10.0), (4, 20.0), (5, 20.0)]
    assert [e.device for e in expanded.events] == [4, 5]
    # each device of the group runs the group's actions: its compute is theirs
    assert [d.compute_s for d in expanded.devices] == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]


def test_fsdp_gathered_parameters_are_not_counted_as_activations(two_ranks):
    # a layer saves its gathered weight for the backward: a parameter (a buffer to the simulator), not an activation
    for sharded, whole in zip(two_ranks["dp2-fsdp"]["devices"], two_ranks["dp2"]["devices"]):
        assert sharded["memory_breakdown_bytes"]["activations"] == whole["memory_breakdown_bytes"]["activations"]


def test_uniform_plans_are_one_4d_mesh_and_uneven_ones_a_mesh_per_device_set():
    from runtime.model.config import load_runnable
    from runtime.model.tensor_parallel import set_layout, uniform_layout

    assert uniform_layout(load_runnable(GPT, FOUR_RANKS["tp2-pp2"]).plan)
    uneven = load_runnable(GPT, SIX_RANKS["tp2-2:1"]).plan
    assert not uniform_layout(uneven)
    assert [set_layout(uneven, g) for g in range(2)] == [[0, 1, 2, 3], [4, 5]]
