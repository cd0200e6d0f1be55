"""The cost model's form, term by term: issue-bound kernels, the optimizer step by implementation,
collective efficiency on links, tied embeddings across stages, fp32 gradients."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from sim.core.errors import ScenarioError
from sim.core.parallelism import Shard
from sim.cost.comm import hierarchical_allreduce_s, ring_s, tied_allreduce_s
from sim.cost.compute import kernel_time_s, layer_times_s, stage_cost
from sim.cost.links import embedding_group_link
from sim.cost.memory import static_bytes
from sim.cost.optimizer import multi_tensor_launches, optimizer_step_kernels, optimizer_step_s
from sim.input.scenario import parse_scenario
from sim.models import build_model, shard_model

BASE = """
cluster: {preset: a100-nvlink-8, nodes: 2}
model: {preset: gpt, layers: 4, hidden: 256, heads: 4, seq_len: 128, vocab: 1024}
training: {global_batch_size: 8, microbatch_size: 2}
plan: {pipeline_parallel: 2, data_parallel: 1}
"""
DEVICE = parse_scenario(BASE).cluster.device


# -- kernels: the larger of device time and issue time ------------------------------------------

def test_a_kernel_takes_the_larger_of_its_device_time_and_its_issue_time_not_their_sum():
    issue = DEVICE.kernel_issue_s
    gap = DEVICE.kernel_overhead_s
    assert issue == pytest.approx(10e-6) and gap == pytest.approx(2e-6)  # the GPU presets
    bw = DEVICE.memory_bandwidth_bytes_per_s * DEVICE.memory_efficiency
    assert kernel_time_s(0.0, 1000.0, DEVICE, "fp16") == pytest.approx(issue)  # tiny: issue-bound, the gap hidden
    assert kernel_time_s(0.0, 1e9, DEVICE, "fp16") == pytest.approx(1e9 / bw + gap)  # large: its work and the gap
    # between the two: the device's work plus its gap, once they outlast the issue
    work = 9e-6 * bw
    assert kernel_time_s(0.0, work, DEVICE, "fp16") == pytest.approx(9e-6 + gap)
    # a host that runs kernels itself (no issue floor) pays its overhead on every kernel
    cpu = replace(DEVICE, kernel_overhead_s=3e-6, kernel_issue_s=0.0)
    assert kernel_time_s(0.0, 1000.0, cpu, "fp16") == pytest.approx(1000.0 / bw + 3e-6)


def test_a_layer_of_tiny_kernels_costs_its_kernel_count_times_the_issue_time_whatever_its_size():
    model = build_model("gpt", layers=1, hidden=64, heads=4, seq_len=8, vocab=128)
    block = model.layers[1]
    fwd, bwd, _ = layer_times_s(block, DEVICE, "fp16", 1)
    products = sum(1 for k in block.kernels if k.flop > 0)
    assert fwd == pytest.approx(len(block.kernels) * DEVICE.kernel_issue_s)
    # the backward runs each product twice and each element-wise kernel once
    assert bwd == pytest.approx((len(block.kernels) + products) * DEVICE.kernel_issue_s)
    half = layer_times_s(build_model("gpt", layers=1, hidden=32, heads=4, seq_len=8, vocab=128).layers[1],
                         DEVICE, "fp16", 1)[0]
    assert half == pytest.approx(fwd)  # half the width: the same floor


def test_a_short_reduction_dimension_costs_efficiency_as_m_and_n_do():
    """Each output tile pays a fixed prologue and epilogue that only its K mainloop amortizes: at the
    same M and N a product of reduction dimension K runs at (1 + D/K) less than the curve's limit."""
    nogap = replace(DEVICE, kernel_overhead_s=0.0)
    d, peak = nogap.matmul_half_dim, nogap.peak_flop_per_s * nogap.efficiency
    m = n = 8192
    for k in (512, 2048, 16384):
        flop = 2.0 * m * n * k
        assert kernel_time_s(flop, 0.0, nogap, "fp16", (m, n, k)) == pytest.approx(
            flop / peak * (1 + d / m) * (1 + d / n) * (1 + d / k), rel=1e-12)
    short = kernel_time_s(2.0 * m * n * 512, 0.0, nogap, "fp16", (m, n, 512)) / 512
    long = kernel_time_s(2.0 * m * n * 16384, 0.0, nogap, "fp16", (m, n, 16384)) / 16384
    assert short / long == pytest.approx((1 + d / 512) / (1 + d / 16384), rel=1e-12)


def test_a_layer_of_long_kernels_pays_one_launch_gap_per_kernel():
    """Every kernel that outlasts the host's issue time is followed by the device's launch gap
    (``kernel_overhead``, 2 µs on the GPU presets): a block's forward is its kernels' work plus
    one gap each, its backward one per kernel it runs (each product twice)."""
    model = build_model("gpt", layers=1, hidden=2048, heads=16, seq_len=2048, vocab=1024)
    block = model.layers[1]
    nogap = replace(DEVICE, kernel_overhead_s=0.0)
    fwd, bwd, _ = layer_times_s(block, DEVICE, "fp16", 8)
    fwd0, bwd0, _ = layer_times_s(block, nogap, "fp16", 8)
    assert all(kernel_time_s(k.flop * 8, k.bytes * 8, nogap, "fp16") > DEVICE.kernel_issue_s for k in block.kernels)
    products = sum(1 for k in block.kernels if k.flop > 0)
    assert fwd - fwd0 == pytest.approx(len(block.kernels) * 2e-6, rel=1e-9)
    assert bwd - bwd0 == pytest.approx((len(block.kernels) + products) * 2e-6, rel=1e-9)


def test_the_attention_dropout_is_a_kernel_of_gpt_and_of_what_selective_recompute_reruns():
    from sim.cost.kernels import ATTENTION_CORE

    gpt = build_model("gpt", layers=1, hidden=256, heads=4, seq_len=128, vocab=128)
    llama = build_model("llama", layers=1, hidden=256, heads=4, seq_len=128, vocab=128)
    drop = [k for k in gpt.layers[1].kernels if k.name == "attention_dropout"]
    assert len(drop) == 1 and "attention_dropout" in ATTENTION_CORE
    # reads the fp16 probabilities, writes them and a 1-byte mask (a·s² each per sample); the
    # backward reads the gradient and the mask and writes a gradient: the same bytes
    assert drop[0].bytes == drop[0].bwd_bytes == (2 + 2 + 1) * 4 * 128 * 128
    assert not any(k.name == "attention_dropout" for k in llama.layers[1].kernels)  # Llama has no dropout


# -- the optimizer step by implementation -------------------------------------------------------

def test_fused_adam_moves_one_pass_over_params_grads_and_both_moments():
    elements = 1e6
    # fp32: read p, g, m, v; write p, m, v: 7 × 4 bytes
    assert optimizer_step_kernels("adam", "fp32", 4 * elements, 10, implementation="fused")[0] == 28 * elements
    # 16-bit weights with fp32 gradients (Megatron's main_grad): + the master weights' copy back (4 + 2)
    assert optimizer_step_kernels("adam", "fp16", 2 * elements, 10, implementation="fused",
                                  grad_dtype="fp32")[0] == (28 + 6) * elements
    # 16-bit gradients: + their copy into fp32 (2 + 4)
    assert optimizer_step_kernels("adam", "bf16", 2 * elements, 10, implementation="fused")[0] == (28 + 12) * elements
    # for-loop and foreach run the same 18 passes; foreach in multi-tensor launches
    loop, loop_launches = optimizer_step_kernels("adam", "fp32", 4 * elements, 100, implementation="for-loop")
    each, each_launches = optimizer_step_kernels("adam", "fp32", 4 * elements, 100, implementation="foreach")
    assert loop == each == 18 * 4 * elements
    assert loop_launches == 8 * 100 and each_launches == 8 * math.ceil(100 / 48)
    assert optimizer_step_kernels("adam", "fp32", 4 * elements, 100, implementation="fused")[1] == math.ceil(100 / 36)


def test_a_multi_tensor_launch_takes_at_most_its_tensors_and_blocks():
    assert multi_tensor_launches(36, 1e3, 4) == 1 and multi_tensor_launches(37, 1e3, 4) == 2
    assert multi_tensor_launches(1, 320 * 65536 + 1, 4) == 2  # 320 blocks of 65 536 elements
    assert multi_tensor_launches(0, 0, 4) == 0


def test_the_step_is_memory_bound_or_issue_bound_whichever_is_longer():
    bw = DEVICE.memory_bandwidth_bytes_per_s * DEVICE.memory_efficiency
    big = 4e9  # a billion fp32 parameters in 400 tensors
    launches = optimizer_step_kernels("adam", "fp32", big, 400, implementation="fused")[1]
    assert optimizer_step_s(DEVICE, "adam", "fp32", big, 400, implementation="fused") == pytest.approx(
        28e9 / bw + launches * DEVICE.kernel_overhead_s)
    # 400 tensors of 10 parameters: 3 200 for-loop launches of 10 µs dwarf the bytes
    assert optimizer_step_s(DEVICE, "adam", "fp32", 16e3, 400, implementation="for-loop") == pytest.approx(
        8 * 400 * DEVICE.kernel_issue_s)
    nogap = replace(DEVICE, kernel_overhead_s=0.0)  # the bytes alone
    fused = optimizer_step_s(nogap, "adam", "fp16", big / 2, 400, implementation="fused")
    loop = optimizer_step_s(nogap, "adam", "fp16", big / 2, 400, implementation="for-loop")
    assert 2.0 < loop / fused < 2.2  # (72 + 12) / (28 + 12) bytes per element


def test_a_scenario_names_the_implementation_and_gets_fused_by_default_on_a_gpu_preset():
    assert parse_scenario(BASE).model.optimizer_implementation == "fused"
    named = parse_scenario(BASE, overrides={"model.optimizer": "{name: adamw, implementation: foreach}"})
    assert (named.model.optimizer, named.model.optimizer_implementation) == ("adamw", "foreach")
    assert parse_scenario(BASE, overrides={"model.optimizer": "sgd"}).model.optimizer == "sgd"  # the plain form
    # --set into a plain name keeps it, as for plan.schedule and cluster.device
    kept = parse_scenario(BASE.replace("vocab: 1024}", "vocab: 1024, optimizer: adamw}"),
                          overrides={"model.optimizer.implementation": "foreach"}).model
    assert (kept.optimizer, kept.optimizer_implementation) == ("adamw", "foreach")
    custom = parse_scenario(BASE, overrides={"cluster.device": "{name: cpu, memory: 8GiB, peak_flops: 1TFLOP/s}"})
    assert custom.model.optimizer_implementation == "for-loop"  # what torch runs on a CPU
    # the stage's step uses it
    cost = lambda sc: stage_cost(shard_model(sc.model, sc.plan.shard), sc.cluster.device, 1, 3, 1).optimizer_s
    loop = parse_scenario(BASE, overrides={"model.optimizer": "{name: adam, implementation: for-loop}"})
    assert cost(loop) > 3 * cost(parse_scenario(BASE))


@pytest.mark.parametrize(("value", "message"), [
    ("{name: adam, implementation: fast}", "model.optimizer.implementation: unknown value 'fast'"),
    ("{name: adam, impl: fused}", "model.optimizer.impl: unknown key"),
    ("{name: adagrad}", "model.optimizer.name: unknown value 'adagrad'"),
    ("{name: adam, grad_dtype: fp8}", "model.optimizer.grad_dtype: unknown value 'fp8'"),
    ("{name: adam, moment_dtype: fp8}", "model.optimizer.moment_dtype: unknown value 'fp8'"),
    ("5", "model.optimizer: must be a mapping"),
])
def test_a_bad_optimizer_is_one_line_naming_the_key(value, message):
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        parse_scenario(BASE, overrides={"model.optimizer": value})
    assert "\n" not in str(info.value)


def test_fp32_gradients_of_16_bit_weights_hold_megatrons_18_bytes_per_parameter():
    scenario = parse_scenario(BASE, overrides={"model.optimizer": "{name: adam, grad_dtype: fp32}"})
    model = scenario.model
    params = model.param_bytes(1, 3) / 2  # fp16
    assert static_bytes(model, 1, 3) == pytest.approx(18 * params)  # 2 + 4 + 12 (Megatron-LM's table)
    assert static_bytes(parse_scenario(BASE).model, 1, 3) == pytest.approx(16 * params)  # ZeRO's 2 + 2 + 12


def test_bf16_moments_with_fp32_gradients_hold_deepseek_v3s_14_bytes_per_parameter():
    # DeepSeek-V3 §3.3.3: AdamW's moments in BF16, master weights and gradients in FP32:
    # 2 (weights) + 4 (gradients) + 4 (master) + 2 + 2 (moments)
    scenario = parse_scenario(BASE, overrides={"model.optimizer": "{name: adamw, grad_dtype: fp32, moment_dtype: bf16}"})
    model = scenario.model
    assert model.moment_dtype == "bf16"
    params = model.param_bytes(1, 3) / 2  # fp16
    assert static_bytes(model, 1, 3) == pytest.approx(14 * params)
    assert model.optimizer_state_bytes_per_param_byte == (4 + 2 * 2) / 2


# -- collective efficiency ----------------------------------------------------------------------

def test_collectives_move_at_the_links_collective_bandwidth():
    cluster = parse_scenario(BASE).cluster
    assert cluster.intra_node.collective_efficiency == 0.77  # nccl-tests: ~230 of 300 GB/s on 8 A100
    assert cluster.intra_node.collective_bandwidth_bytes_per_s == pytest.approx(0.77 * 300e9)
    full = replace(cluster, intra_node=replace(cluster.intra_node, collective_efficiency=1.0, latency_s=0.0))
    half = replace(full, intra_node=replace(full.intra_node, collective_efficiency=0.5))
    assert hierarchical_allreduce_s(1e9, 8, 1, half) == pytest.approx(2 * hierarchical_allreduce_s(1e9, 8, 1, full))
    assert hierarchical_allreduce_s(1e9, 8, 1, full) == pytest.approx(2 * 7 / 8 * 1e9 / 300e9)


def test_the_engine_charges_a_tensor_parallel_ring_at_the_collective_bandwidth():
    from sim.engine.run import run_scenario

    text = BASE.replace("plan: {pipeline_parallel: 2, data_parallel: 1}",
                        "plan: {pipeline_parallel: 1, data_parallel: 1, tensor_parallel: 4}")
    times = {}
    for efficiency in (1.0, 0.25):
        scenario = parse_scenario(text, overrides={"cluster.intra_node.collective_efficiency": str(efficiency)})
        times[efficiency] = run_scenario(scenario, engine="fast").summarize().iteration_time_s
    assert times[0.25] > times[1.0]
    # point-to-point transfers keep the full bandwidth (untied: no embedding all-reduce between the stages)
    p2p = {e: run_scenario(parse_scenario(BASE, overrides={"cluster.intra_node.collective_efficiency": str(e),
                                                           "model.tied_embeddings": "false"}),
                           engine="fast").summarize().iteration_time_s for e in (1.0, 0.25)}
    assert p2p[1.0] == p2p[0.25]


@pytest.mark.parametrize(("key", "value", "message"), [
    ("cluster.intra_node.collective_efficiency", "0", "must be a number in [0.01, 1]"),
    ("cluster.intra_node.collective_efficiency", "1.5", "must be a number in [0.01, 1]"),
    ("cluster.inter_node.collective_efficiency", "high", "must be a number in [0.01, 1]"),
    ("cluster.device.kernel_issue", "2s", "must be from 0s to 1s"),
    ("cluster.device.kernel_issue", "5", "kernel_issue"),
])
def test_bad_new_cluster_keys_are_one_line(key, value, message):
    with pytest.raises(ScenarioError) as info:
        parse_scenario(BASE, overrides={key: value})
    text = str(info.value)
    assert key in text and message in text and "\n" not in text


# -- tied embeddings ----------------------------------------------------------------------------

def test_gpt_ties_its_head_to_the_embedding_by_default_and_counts_the_matrix_once():
    tied = build_model("gpt", layers=2, hidden=64, heads=4, seq_len=32, vocab=128)
    untied = build_model("gpt", layers=2, hidden=64, heads=4, seq_len=32, vocab=128, tied_embeddings=False)
    assert tied.tied_layers == (0, 3) and tied.tied_bytes == 128 * 64 * 2
    assert untied.param_bytes() - tied.param_bytes() == tied.tied_bytes
    # one stage holds both ends: no copy, nothing to all-reduce
    assert tied.stage_param_bytes(0, 4) == tied.param_bytes(0, 4)
    assert tied_allreduce_s(tied, 0, 4, parse_scenario(BASE).cluster.inter_node) == 0.0


def test_across_stages_the_head_keeps_a_copy_and_both_ends_all_reduce_its_gradient():
    scenario = parse_scenario(BASE)  # two stages on one server
    model, cluster, plan = shard_model(scenario.model, scenario.plan.shard), scenario.cluster, scenario.plan
    first, last = plan.stages[0].layers, plan.stages[1].layers
    assert model.tied_copy_bytes(*first) == 0 and model.tied_copy_bytes(*last) == model.tied_bytes
    link = embedding_group_link(plan, cluster)
    assert link is cluster.intra_node
    expected = ring_s(2, model.tied_bytes, link.collective_bandwidth_bytes_per_s, link.latency_s)
    for layers in (first, last):  # both ends wait for the embedding group's all-reduce
        cost = stage_cost(model, cluster.device, *layers, 1, tied_link=link)
        assert cost.tied_allreduce_s == pytest.approx(expected) and cost.optimizer_s > expected
    head = stage_cost(model, cluster.device, *last, 1, tied_link=link)
    assert head.param_bytes == model.param_bytes(*last) + model.tied_bytes
    # the engine compiles it in: the head's device holds the copy's states
    from sim.engine.run import run_scenario

    summary = run_scenario(scenario, engine="fast").summarize()
    states = {d.device: d.memory_breakdown.parameters for d in summary.devices}
    assert states[plan.stages[1].devices[0]] == pytest.approx(head.states.parameters)


def test_a_tensor_parallel_share_ties_its_share_of_the_table():
    model = build_model("gpt", layers=2, hidden=64, heads=4, seq_len=32, vocab=128)
    assert shard_model(model, Shard(tensor=4)).tied_bytes == 512 * 64 / 4 * 2  # 128 padded to 4 x 128
