"""Gradient accumulation as a separate add per micro-batch (``model.optimizer.grad_accumulation``).

Without Megatron-LM's gradient-accumulation fusion (before 83b1e42, 2022), every micro-batch after
the first adds its weight gradients into their sum: ``2·g + d`` bytes per parameter, m − 1 times
an iteration (``sim.cost.optimizer``). The closed forms are written out below.
"""

from __future__ import annotations

import pytest

from sim.core.errors import DappleError
from sim.core.specs import DTYPE_BYTES
from sim.cost.optimizer import accumulation_bytes, accumulation_s
from sim.engine.run import run_scenario
from sim.input.scenario import parse_scenario

SCENARIO = """
cluster: {preset: a100-nvlink-8, nodes: 1}
model: {preset: gpt, layers: 4, hidden: 1024, heads: 16, seq_len: 1024, vocab: 4096, dtype: fp16,
        optimizer: {name: adam, implementation: fused, grad_accumulation: MODE}}
training: {global_batch_size: 16, microbatch_size: 4}
plan: {schedule: 1f1b, pipeline_parallel: 1, data_parallel: 1}
"""


def _scenario(mode: str):
    return parse_scenario(SCENARIO.replace("MODE", mode))


def test_bytes_are_the_sum_read_and_written_and_the_new_gradient_read():
    # fp16 weights: 5e8 parameters in 1e9 bytes; fp16 sum: 2 + 2 + 2 bytes each; fp32 main_grad: 4 + 4 + 2
    assert accumulation_bytes(1e9, "fp16") == pytest.approx(5e8 * 6)
    assert accumulation_bytes(1e9, "fp16", "fp32") == pytest.approx(5e8 * 10)
    assert accumulation_bytes(4e9, "fp32") == pytest.approx(1e9 * 12)


def test_each_backward_pays_m_minus_one_over_m_of_one_add():
    device = _scenario("separate").cluster.device
    rate = device.memory_bandwidth_bytes_per_s * device.memory_efficiency
    assert accumulation_s(device, 1e9, "fp16", None, tensors=10, num_microbatches=1) == 0.0
    assert accumulation_s(device, 1e9, "fp16", None, tensors=10, num_microbatches=4) == pytest.approx(
        3 / 4 * (3e9 / rate + 10 * device.kernel_overhead_s))
    # a thousand tiny tensors: one AccumulateGrad launch each, issue-bound (the issue hides each launch gap)
    assert device.kernel_issue_s > device.kernel_overhead_s > 0
    assert accumulation_s(device, 1e3, "fp16", None, tensors=1000, num_microbatches=2) == pytest.approx(
        1 / 2 * 1000 * device.kernel_issue_s)


def test_one_stage_iteration_grows_by_m_minus_one_adds_over_its_parameters():
    fused, separate = _scenario("fused"), _scenario("separate")
    m = separate.training.num_microbatches
    assert m == 4
    model = separate.resolved.model
    params = model.param_bytes()
    tensors = sum(layer.optimizer_tensors for layer in model.layers)
    device = separate.cluster.device
    one = max(params / DTYPE_BYTES["fp16"] * 6 / (device.memory_bandwidth_bytes_per_s * device.memory_efficiency)
              + tensors * device.kernel_overhead_s, tensors * device.kernel_issue_s)
    extra = run_scenario(separate, engine="fast").summarize().iteration_time_s \
        - run_scenario(fused, engine="fast").summarize().iteration_time_s
    assert extra == pytest.approx((m - 1) * one, rel=1e-9)
    assert separate.resolved.stage_costs[0].wgrad_s - fused.resolved.stage_costs[0].wgrad_s == pytest.approx(
        (m - 1) / m * one)


def test_fused_is_the_default_and_a_bad_mode_names_the_key():
    assert parse_scenario(SCENARIO.replace(", grad_accumulation: MODE", "")).model.grad_accumulation == "fused"
    with pytest.raises(DappleError, match="grad_accumulation"):
        _scenario("later")
