"""ZeRO-3/FSDP by unit: a device holds its shards plus at most two units' gathered parameters
and one unit's unsharded gradient, not its stage's whole parameters.

A small Llama (embedding, four blocks, head) trains under ``sharding: full`` over four devices
with GPipe and two micro-batches. Its peak, written out here, is the shards at rest
(parameters, gradients and optimizer state over d), both micro-batches' stashed activations
(GPipe keeps them all until the backwards), and what the backward of the largest unit pair
holds: the unit computing p_i, the one prefetched p_(i−1) and the unit's gradient g·p_i. The
engine (SimPy and the fast path), ``dapple-sim check`` and the planner's count before a replay
must give that number to the byte.
"""

from __future__ import annotations

import pytest

from planner.search.memory import plan_peak_bytes
from sim.app.check import describe
from sim.core.parallelism import Sharding
from sim.cost.memory import fsdp_unit_param_bytes, stage_held_bytes, unit_peak_bytes
from sim.engine.run import run_scenario
from sim.input.scenario import parse_scenario

D = 4  # data-parallel devices


def _scenario(fsdp: str = "{}", sharding: str = "full", batch: int = 8):
    text = f"""
name: fsdp-units
cluster: {{preset: a100-nvlink-8, nodes: 1, devices_per_node: {D}, nics_per_node: 1}}
model: {{preset: llama, layers: 4, hidden: 64, heads: 4, kv_heads: 2, ffn_hidden: 128, vocab: 256,
         seq_len: 32, dtype: bf16, optimizer: adam}}
training: {{global_batch_size: {batch}, microbatch_size: {D}}}
plan: {{schedule: gpipe, sharding: {sharding}, data_parallel: {D}, fsdp: {fsdp}}}
"""
    return parse_scenario(text, source="fsdp-units.yaml")


def _layers(scenario):
    """Parameter bytes of the embedding, the four blocks and the head, one device's."""
    layers = scenario.resolved.model.layers
    assert [layer.name for layer in layers] == ["embedding", "block_0", "block_1", "block_2", "block_3", "head"]
    return [layer.param_bytes for layer in layers]


def _peaks(scenario) -> dict[str, float]:
    simpy = run_scenario(scenario, engine="simpy").summarize().peak_memory_bytes
    fast = run_scenario(scenario, engine="fast").summarize().peak_memory_bytes
    return {"simpy": simpy, "fast": fast, "planner": plan_peak_bytes(scenario.resolved).peak_bytes}


def test_units_are_blocks_with_the_embedding_and_the_head_alone():
    scenario = _scenario()
    emb, b0, b1, b2, b3, head = _layers(scenario)
    model = scenario.resolved.model
    assert fsdp_unit_param_bytes(model, 0, 6) == (emb, b0, b1, b2, b3, head)
    assert fsdp_unit_param_bytes(model, 0, 6, unit_layers=2) == (emb, b0 + b1, b2 + b3, head)
    assert fsdp_unit_param_bytes(model, 0, 6, unit_layers=3) == (emb, b0 + b1 + b2, b3, head)


def test_unit_peak_closed_form():
    p, g = (3.0, 5.0, 7.0, 2.0), 2.0
    held = unit_peak_bytes(p, grad_bytes_per_param_byte=g, gather_parameters=True)
    assert held.forward_bytes == 5.0 + 7.0  # the largest neighbouring pair: 3+5, 5+7, 7+2, 2
    assert held.backward_bytes == 7.0 + 5.0 + g * 7.0  # unit 2, unit 1 prefetched, unit 2's gradient
    kept = unit_peak_bytes(p, grad_bytes_per_param_byte=g, gather_parameters=True, reshard_after_forward=False)
    assert kept.forward_bytes == 17.0  # every unit gathered by the forward's end
    # unit i's backward: units 0..i still gathered, its gradient: max(3+6, 8+10, 15+14, 17+4)
    assert kept.backward_bytes == 15.0 + g * 7.0
    zero2 = unit_peak_bytes(p, grad_bytes_per_param_byte=g, gather_parameters=False)
    assert (zero2.forward_bytes, zero2.backward_bytes) == (0.0, g * 7.0)


def test_zero3_peak_is_shards_plus_two_units_plus_a_unit_gradient():
    scenario = _scenario()
    emb, b0, b1, b2, b3, head = _layers(scenario)
    model = scenario.resolved.model
    g = model.grad_bytes_per_param_byte
    total = emb + b0 + b1 + b2 + b3 + head
    shards = total / D + g * total / D + model.optimizer_state_bytes_per_param_byte * total / D
    cost = scenario.resolved.stage_costs[0]
    assert cost.static_bytes == pytest.approx(shards, rel=1e-15)
    # the blocks are the largest units: a block's backward, the block before prefetched
    assert b1 > max(emb, head)
    two_units_and_a_gradient = b1 + b0 + g * b1
    expected = cost.static_bytes + 2 * cost.stash_bytes + two_units_and_a_gradient
    assert _peaks(scenario) == {"simpy": expected, "fast": expected, "planner": expected}
    assert describe(scenario).plan.stages[0].held.backward_bytes == two_units_and_a_gradient
    # far below the stage's whole parameters gathered at once
    assert two_units_and_a_gradient < total


def test_reshard_after_forward_false_holds_more():
    resharded = _scenario()
    kept = _scenario("{reshard_after_forward: false}")
    emb, b0, b1, b2, b3, head = _layers(kept)
    g = kept.resolved.model.grad_bytes_per_param_byte
    cost = kept.resolved.stage_costs[0]
    # every unit stays gathered from its forward to its own backward: the head's backward holds
    # them all, the last block's all but the head, each with its own gradient
    total = emb + b0 + b1 + b2 + b3 + head
    expected = cost.static_bytes + 2 * cost.stash_bytes + max(total + g * head, total - head + g * b3)
    assert set(_peaks(kept).values()) == {expected}
    assert expected > _peaks(resharded)["simpy"]


def test_accumulating_unsharded_counts_full_gradients_at_rest():
    sharded = _scenario()
    whole = _scenario("{reduce_every_microbatch: false}")
    total = sum(_layers(whole))
    g = whole.resolved.model.grad_bytes_per_param_byte
    assert sharded.resolved.stage_costs[0].states.gradients == pytest.approx(g * total / D, rel=1e-15)
    assert whole.resolved.stage_costs[0].states.gradients == g * total
    assert describe(whole).plan.devices[0].by_kind.gradients == g * total
    # the unit's gradient accumulates into the full gradients: no extra transient
    emb, b0, b1, b2, b3, head = _layers(whole)
    assert describe(whole).plan.stages[0].held.backward_bytes == b1 + b0
    cost = whole.resolved.stage_costs[0]
    assert set(_peaks(whole).values()) == {cost.static_bytes + 2 * cost.stash_bytes + b1 + b0}


def test_one_microbatch_reduces_in_its_only_backward():
    one = _scenario("{reduce_every_microbatch: false}", batch=D)
    total = sum(_layers(one))
    g = one.resolved.model.grad_bytes_per_param_byte
    assert one.resolved.num_microbatches == 1
    assert one.resolved.stage_costs[0].states.gradients == pytest.approx(g * total / D, rel=1e-15)


@pytest.mark.parametrize("sharding", ["none", "optimizer"])
def test_unsharded_gradients_hold_nothing_more(sharding):
    scenario = _scenario(sharding=sharding)
    model = scenario.resolved.model
    held = stage_held_bytes(model, 0, 6, data_parallel=D, sharding=Sharding(sharding))
    assert (held.forward_bytes, held.backward_bytes) == (0.0, 0.0)
    # ZeRO-1 keeps full gradients (DeepSpeed reduces them only at the accumulation boundary)
    assert scenario.resolved.stage_costs[0].states.gradients == model.grad_bytes_per_param_byte * sum(_layers(scenario))


def test_zero2_holds_one_unit_gradient_in_the_backward():
    scenario = _scenario(sharding="gradients")
    emb, b0, b1, b2, b3, head = _layers(scenario)
    g = scenario.resolved.model.grad_bytes_per_param_byte
    cost = scenario.resolved.stage_costs[0]
    expected = cost.static_bytes + 2 * cost.stash_bytes + g * max(emb, b0, head)
    assert set(_peaks(scenario).values()) == {expected}
