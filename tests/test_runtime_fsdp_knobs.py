"""The runtime honours the plan's FSDP knobs (``plan.fsdp``, issue 34) or refuses them in one line.

``reduce_every_microbatch`` (each micro-batch's reduce-scatter, or the last's), ``unit_layers``
(consecutive blocks one ``fully_shard`` unit) and ``reshard_after_forward`` run with FSDP2 and train
like the unsplit model (gradients within 1e-5, fp32); ``fp32_shards`` of a bf16 model runs as FSDP2's
``MixedPrecisionPolicy`` on fp32 shards; ``path: flat``, ``max_live_parameters``, ``max_reuse_distance``
and ``reduce_scatter: false`` are DeepSpeed's: refused before launch; ``prefetch: false`` only times the
run otherwise: a realisation note.
"""

from __future__ import annotations

import pytest

from conftest import SCENARIOS, assert_matches_unsplit, kinds_beside_prediction, spawn_checked
from runtime.model.config import load_runnable
from runtime.model.realisation import realisation_notes
from sim.core.errors import DappleError

GPT = str(SCENARIOS / "gpt_tiny_cpu.yaml")
ONE_STAGE_2 = "[{layers: [0, 6], devices: [0, 1]}]"  # data parallelism 2; 16 / (4 × 2): 2 micro-batches
FULL = {"plan.sharding": "full", "plan.stages": ONE_STAGE_2}
BF16_SHARDS = {**FULL, "model.dtype": "bf16", "plan.fsdp.fp32_shards": "true"}
SLOW_TWO_RANKS = {
    "full-each": FULL,
    "full-accumulate": {**FULL, "plan.fsdp.reduce_every_microbatch": "false"},
    "zero2-accumulate": {**FULL, "plan.sharding": "gradients", "plan.fsdp.reduce_every_microbatch": "false"},
    "full-units-of-3": {**FULL, "plan.fsdp.unit_layers": "3"},
    "full-kept-gathered": {**FULL, "plan.fsdp.reshard_after_forward": "false", "plan.fsdp.unit_layers": "2"},
}


@pytest.mark.parametrize(("key", "value"), [("plan.fsdp.path", "flat"),
                                            ("plan.fsdp.max_live_parameters", "100000"),
                                            ("plan.fsdp.max_reuse_distance", "100000"),
                                            ("plan.fsdp.reduce_scatter", "false")])
def test_deepspeeds_zero3_knobs_are_refused_in_one_line(key, value):
    with pytest.raises(DappleError) as info:
        load_runnable(GPT, {**FULL, key: value})
    assert f"{key}: not supported by the runtime" in str(info.value) and "\n" not in str(info.value)
    load_runnable(GPT, {"plan.stages": ONE_STAGE_2, key: value})  # no FSDP: the knob does nothing


def test_fp32_shards_of_a_16_bit_model_need_no_note():
    # FSDP2's fp32 shards hold fp32 gradients, as the simulator counts them (sim.cost.memory.model_state_bytes)
    plan = load_runnable(GPT, {**FULL, "plan.fsdp.fp32_shards": "true", "model.dtype": "bf16"}).plan
    assert realisation_notes(plan, num_microbatches=2) == ()


def test_no_prefetch_is_a_timing_note_and_the_other_knobs_need_none():
    (note,) = realisation_notes(load_runnable(GPT, {**FULL, "plan.fsdp.prefetch": "false"}).plan, num_microbatches=2)
    assert note.startswith("plan.fsdp.prefetch: false") and "time only" in note and "\n" not in note
    for key, value in [("unit_layers", "2"), ("reshard_after_forward", "false"), ("reduce_every_microbatch", "true")]:
        plan = load_runnable(GPT, {**FULL, f"plan.fsdp.{key}": value}).plan
        assert realisation_notes(plan, num_microbatches=2) == ()


def test_accumulating_unsharded_names_the_gradients_a_cpu_run_does_not_count():
    plan = load_runnable(GPT, {**FULL, "plan.fsdp.reduce_every_microbatch": "false"}).plan
    (note,) = realisation_notes(plan, num_microbatches=2)
    assert "set_requires_gradient_sync(False)" in note and "whole gradients, as predicted" in note
    assert realisation_notes(plan, num_microbatches=1) == ()  # one micro-batch: nothing accumulates


def test_consecutive_blocks_make_one_unit_and_any_other_layer_closes_it():
    torch = pytest.importorskip("torch")
    from runtime.model.layers import TransformerBlock
    from runtime.model.models import StageModule
    from runtime.model.sharding import fsdp_units

    block = [TransformerBlock(8, 2, 16) for _ in range(4)]
    head, middle = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    module = StageModule({1: block[0], 2: block[1], 3: block[2], 4: middle, 5: block[3], 6: head}, is_last=False)
    assert fsdp_units(module, 2) == [[block[0], block[1]], [block[2]], [middle], [block[3]], [head]]
    assert fsdp_units(module, 1) == [[m] for m in (*block[:3], middle, block[3], head)]
    assert fsdp_units(module, 9) == [block[:3], [middle], [block[3]], [head]]


@pytest.mark.slow
@pytest.mark.dist
def test_fp32_shards_hold_4_bytes_a_parameter_and_step_them_in_fp32():
    # bf16 gathered, fp32 at rest: parameters 4 bytes over d and Adam's 8 with no master copy, as
    # predicted; the gradient shard fp32, as predicted (the shard's dtype). The forward
    # is the bf16 model's (the same loss); bf16's gradients differ from the unsplit run's in their last
    # bits, so no 1e-5 check; the step differs from the bf16 one by the fp32 weights it updates
    cases = {"bf16": {**FULL, "model.dtype": "bf16"}, "fp32-shards": {**BF16_SHARDS}}
    results = spawn_checked(GPT, 2, cases)
    ours, plain = results["fp32-shards"], results["bf16"]
    assert ours["loss"] == pytest.approx(ours["reference_loss"], rel=1e-5) and ours["loss"] == plain["loss"]
    assert ours["losses"][1] != plain["losses"][1]
    for measured, predicted in kinds_beside_prediction(GPT, BF16_SHARDS, ours):
        assert measured["parameters"] == pytest.approx(predicted.parameters, rel=0.02)
        assert measured["optimizer"] == pytest.approx(predicted.optimizer, rel=0.02)
        assert measured["gradients"] == pytest.approx(predicted.gradients, rel=0.02)
    for fp32, bf16 in zip(ours["devices"], plain["devices"]):  # the same shard in 4 bytes, not 2
        assert fp32["memory_breakdown_bytes"]["parameters"] == 2 * bf16["memory_breakdown_bytes"]["parameters"]


@pytest.mark.slow
@pytest.mark.dist
def test_every_fsdp_knob_the_runtime_honours_trains_like_the_unsplit_model():
    results = spawn_checked(GPT, 2, SLOW_TWO_RANKS)
    for name in SLOW_TWO_RANKS:
        assert_matches_unsplit(results[name])
    # the same step's weights whichever micro-batch reduces: the second step's loss agrees
    expected = results["full-each"]["losses"][1]
    assert all(results[name]["losses"][1] == pytest.approx(expected, rel=1e-5) for name in SLOW_TWO_RANKS)
    # reduce-scattering each micro-batch's gradients keeps 1/d of them, as predicted (d = 2)
    for measured, predicted in kinds_beside_prediction(GPT, SLOW_TWO_RANKS["full-each"], results["full-each"]):
        assert measured["gradients"] == pytest.approx(predicted.gradients, rel=0.02)
        assert measured["optimizer"] == pytest.approx(predicted.optimizer, rel=0.02)
    # accumulating unsharded holds them whole (the prediction) until the last micro-batch; the run counts
    # its shard at rest, 1/d of them (the realisation note)
    accumulate = kinds_beside_prediction(GPT, SLOW_TWO_RANKS["full-accumulate"], results["full-accumulate"])
    for measured, predicted in accumulate:
        assert measured["gradients"] == pytest.approx(predicted.gradients / 2, rel=0.02)
