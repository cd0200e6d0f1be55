"""FSDP2's fp32 shards (``plan.fsdp.fp32_shards``): the sharded parameters are the master weights.

FSDP2's ``MixedPrecisionPolicy`` keeps the sharded parameters in their original dtype (fp32) and
gathers a 16-bit copy only to compute: "FSDP does not require any extra memory to keep a
high-precision copy of the parameters for the optimizer step". With bf16 weights, fp32 gradients
and Adam a device holds (4 + 4 + 8)Ψ/d, not ZeRO-3's (2 + 4 + 12)Ψ/d, and its step runs in fp32.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.core.parallelism import Sharding
from sim.cost.compute import stage_optimizer_step_s
from sim.cost.memory import stage_state_bytes
from sim.cost.optimizer import optimizer_step_s
from sim.input.scenario import parse_scenario

SCENARIO = """
STACK
cluster: {preset: dgx-h100, nodes: 1}
model: {preset: llama, layers: 2, hidden: 256, heads: 8, kv_heads: 2, seq_len: 128, vocab: 512, dtype: bf16,
        optimizer: {name: adamw, implementation: foreach, grad_dtype: fp32}}
training: {global_batch_size: 16, microbatch_size: 16}
plan: {schedule: 1f1b, sharding: SHARDING, pipeline_parallel: 1, data_parallel: 8, fsdp: FSDP}
"""


def _scenario(sharding="full", fsdp="{}", stack=""):
    return parse_scenario(SCENARIO.replace("STACK", stack).replace("SHARDING", sharding).replace("FSDP", fsdp))


def test_states_are_4_plus_4_plus_8_bytes_a_parameter_over_d():
    model = _scenario().model
    psi, d = 1e9, 8
    params = 2 * psi  # bf16 bytes
    ours = stage_state_bytes(model, params, data_parallel=d, sharding=Sharding.FULL, fp32_shards=True)
    assert (ours.parameters, ours.gradients, ours.optimizer) == pytest.approx((4 * psi / d, 4 * psi / d, 8 * psi / d))
    zero3 = stage_state_bytes(model, params, data_parallel=d, sharding=Sharding.FULL)
    assert (zero3.parameters, zero3.gradients, zero3.optimizer) == pytest.approx((2 * psi / d, 4 * psi / d, 12 * psi / d))
    # only under full sharding: ZeRO-1 keeps its 16-bit parameters whole either way
    assert stage_state_bytes(model, params, data_parallel=d, sharding=Sharding.OPTIMIZER, fp32_shards=True) == \
        stage_state_bytes(model, params, data_parallel=d, sharding=Sharding.OPTIMIZER)


def test_the_step_runs_on_fp32_weights_with_no_copy_back():
    s = _scenario()
    model, device = s.model, s.cluster.device
    step = stage_optimizer_step_s(model, device, 2e9, 100, data_parallel=8, sharding=Sharding.FULL, fp32_shards=True)
    assert step == optimizer_step_s(device, "adamw", "fp32", 4e9 / 8, 100, implementation="foreach", grad_dtype="fp32")
    assert step < stage_optimizer_step_s(model, device, 2e9, 100, data_parallel=8, sharding=Sharding.FULL)


def test_a_replay_holds_the_shards_and_torchtitan_sets_them():
    ours, zero3 = _scenario(fsdp="{fp32_shards: true}"), _scenario()
    a, b = ours.resolved.stage_costs[0].states, zero3.resolved.stage_costs[0].states
    assert a.parameters == pytest.approx(2 * b.parameters) and a.gradients == b.gradients
    assert a.optimizer == pytest.approx(b.optimizer - 2 * b.parameters)
    assert a.total == pytest.approx(b.total * 16 / 18)
    assert ours.plan.fsdp.to_json()["fp32_shards"] is True and "fp32_shards" not in zero3.plan.fsdp.to_json()
    titan = _scenario(fsdp="{}", stack="stack: torchtitan")
    assert titan.plan.fsdp.fp32_shards is True


def test_a_16_bit_gradients_shard_is_held_in_fp32_as_the_shard_it_belongs_to():
    # without grad_dtype fp32, ZeRO-3 counts bf16 gradient shards (2ψ/d); FSDP2's fp32 shards get
    # fp32 gradients (its reduce-scatter output cast to the sharded parameter's dtype): 4ψ/d
    model = replace(_scenario().model, grad_dtype=None)
    psi, d = 1e9, 8
    ours = stage_state_bytes(model, 2 * psi, data_parallel=d, sharding=Sharding.FULL, fp32_shards=True)
    zero3 = stage_state_bytes(model, 2 * psi, data_parallel=d, sharding=Sharding.FULL)
    assert (zero3.gradients, ours.gradients) == pytest.approx((2 * psi / d, 4 * psi / d))
    # gradients kept whole over the micro-batches stay in the compute dtype until the last reduce
    whole = stage_state_bytes(model, 2 * psi, data_parallel=d, sharding=Sharding.FULL, fp32_shards=True,
                              accumulate_unsharded=True)
    assert whole.gradients == pytest.approx(2 * psi)
