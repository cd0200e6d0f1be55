"""Passes over the gradients around the optimizer step (``model.optimizer.grad_passes``).

Megatron-LM at cfd2e21 (the code of Korthikanti et al. 2022's runs) zeroes its fp32 gradient
buffer (a write), divides it by the data-parallel size before the all-reduce (read, write),
unscales it and checks it for inf under fp16 (read, write) and takes its L2 norm for clipping
(read): six passes of the gradients' 4 bytes per parameter besides the fused Adam's 28 and the
master weights' copy back (6), all memory-bound.
"""

from __future__ import annotations

import pytest

from sim.app.cli import main
from sim.core.errors import DappleError
from sim.cost.optimizer import optimizer_step_kernels
from sim.input.scenario import parse_scenario

SCENARIO = """
cluster: {preset: a100-nvlink-8, nodes: 1, device: {kernel_overhead: 0s}}  # bytes alone, no launch gaps
model: {preset: gpt, layers: 4, hidden: 2048, heads: 16, seq_len: 1024, vocab: 8192, dtype: fp16,
        optimizer: {name: adam, implementation: fused, grad_dtype: fp32PASSES}}
training: {global_batch_size: 8, microbatch_size: 8}
plan: {schedule: 1f1b, tensor_parallel: 1, pipeline_parallel: 1, data_parallel: 1}
"""
MEGATRON = ", grad_passes: [zero, divide, unscale, norm]"


def _step_s(passes: str) -> tuple[float, float, float]:
    scenario = parse_scenario(SCENARIO.replace("PASSES", passes))
    cost = scenario.resolved.stage_costs[0]
    device = scenario.cluster.device
    return cost.optimizer_s, cost.param_bytes / 2, device.memory_bandwidth_bytes_per_s * device.memory_efficiency


def test_megatrons_four_passes_add_six_fp32_passes_of_the_gradients_to_the_step():
    plain_s, params, rate = _step_s("")
    megatron_s, _, _ = _step_s(MEGATRON)
    assert plain_s == pytest.approx((28 + 6) * params / rate, rel=1e-12)  # fused Adam, fp32 master copied back
    assert megatron_s - plain_s == pytest.approx((1 + 2 + 2 + 1) * 4 * params / rate, rel=1e-9)


def test_pass_counts_and_launches():
    nbytes, launches = optimizer_step_kernels("adam", "fp16", 2e6, 10, implementation="fused", grad_dtype="fp32",
                                              grad_passes=("zero", "norm"))
    plain_bytes, plain_launches = optimizer_step_kernels("adam", "fp16", 2e6, 10, implementation="fused",
                                                         grad_dtype="fp32")
    assert nbytes - plain_bytes == (1 + 1) * 4 * 1e6
    assert launches - plain_launches == 1 + 1  # the buffer's one zero_, one multi-tensor l2norm launch


def test_under_zero1_the_buffers_passes_run_over_the_whole_buffer_and_the_norm_over_the_shard():
    """Megatron-Core's distributed optimizer keeps the DDP gradient buffer whole: it zeroes it, scales
    and NaN-checks every bucket before the reduce-scatter (4 + 8 + 4 bytes per fp32 gradient), while
    the clipping norm reads only the device's 1/d shard of main gradients (4/d bytes)."""
    def step(passes: str, d: int) -> tuple[float, float, float]:
        text = SCENARIO.replace("PASSES", passes).replace("data_parallel: 1}", f"data_parallel: {d}, sharding: optimizer}}")
        scenario = parse_scenario(text)
        cost, device = scenario.resolved.stage_costs[0], scenario.cluster.device
        return cost.optimizer_s, cost.param_bytes / 2, device.memory_bandwidth_bytes_per_s * device.memory_efficiency
    plain_s, params, rate = step("", 8)
    megatron_s, _, _ = step(", grad_passes: [zero, divide, nan_check, norm]", 8)
    assert megatron_s - plain_s == pytest.approx((1 + 2 + 1) * 4 * params / rate + 4 * params / 8 / rate, rel=1e-9)
    # the same passes without sharding all run over the (whole) buffer
    unsharded_plain, _, _ = _step_s("")
    unsharded, _, _ = _step_s(", grad_passes: [zero, divide, nan_check, norm]")
    assert unsharded - unsharded_plain == pytest.approx((1 + 2 + 1 + 1) * 4 * params / rate, rel=1e-9)


def test_an_unknown_pass_is_refused_by_name():
    with pytest.raises(DappleError, match="grad_passes"):
        parse_scenario(SCENARIO.replace("PASSES", ", grad_passes: [zero, clip]"))


def test_a_pass_named_twice_is_one_line_naming_the_file_and_key(tmp_path, capsys):
    path = tmp_path / "twice.yaml"
    path.write_text(SCENARIO.replace("PASSES", ", grad_passes: [nan_check, nan_check]"))
    assert main(["check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "twice.yaml: model.optimizer.grad_passes" in err and "at most once" in err
