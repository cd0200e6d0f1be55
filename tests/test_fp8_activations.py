"""DeepSeek-V3's FP8-cached stash (``model.fp8_activations``, ``sim.models.precision``; arXiv
2412.19437 §3.3.3 and §3.2.3): the norms' outputs recomputed, the output-projection input in E5M6,
the experts' inputs and SwiGLU inputs in FP8 (one fp32 scale per 128), their SwiGLU outputs recomputed
and the routed experts' outputs not kept."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.core.errors import SpecError
from sim.core.experts import ExpertSpec
from sim.core.mla import MlaSpec
from sim.core.parallelism import Shard
from sim.core.specs import DeviceSpec
from sim.cost.compute import kernel_forward_s, layer_times_s
from sim.models import build_model, shard_model
from sim.models.precision import fp8_stash_saving_bytes

SMALL = dict(layers=2, hidden=1024, heads=8, kv_heads=8, ffn_hidden=2048, vocab=1000, seq_len=256, attention="flash",
             dtype="bf16")
MLA = MlaSpec(q_lora_rank=384, kv_lora_rank=128, rope_head_dim=32, nope_head_dim=64, v_head_dim=64)


def test_a_dense_block_loses_its_norm_outputs_and_half_its_down_projection_input():
    s, h, f = 256, 1024, 2048
    q8, e5m6 = 1 + 4 / 128, 1.5 + 4 / 128
    # norm outputs 2·s·h·2 bytes; the output-projection input 2 -> 1.53 bytes; the down input 2 -> 1.03
    expected = 2 * s * h * 2 + s * h * (2 - e5m6) + s * f * (2 - q8)
    got = fp8_stash_saving_bytes(seq_len=s, hidden=h, attention_out=h, ffn_hidden=f, gated=True, d=2, moe=False)
    assert got == pytest.approx(expected, rel=1e-12)
    base = build_model("llama", gemm_dtype="fp8", **SMALL)
    cached = build_model("llama", gemm_dtype="fp8", fp8_activations=True, **SMALL)
    assert base.layers[1].stash_bytes - cached.layers[1].stash_bytes == pytest.approx(expected, rel=1e-12)
    assert cached.layers[-1].stash_bytes == base.layers[-1].stash_bytes  # the head keeps its stash


def test_an_moe_block_with_mla_caches_its_experts_swiglu_inputs_in_fp8():
    experts = ExpertSpec(count=8, top_k=2, ffn_hidden=512, shared=1)
    s, h, fe, ep = 256, 1024, 512, 4
    q8, e5m6 = 1 + 4 / 128, 1.5 + 4 / 128
    shard = Shard(expert=ep)
    base = shard_model(build_model("llama", gemm_dtype="fp8", experts=experts, mla=MLA, **SMALL), shard)
    cached = shard_model(build_model("llama", gemm_dtype="fp8", experts=experts, mla=MLA, fp8_activations=True,
                                     **SMALL), shard)
    rows = (8 // ep) * s * 2 * ep / 8  # two local experts, s·top_k·EP/count rows each
    expected = (2 * s * h * 2 + s * 8 * 64 * (2 - e5m6)  # norm outputs; MLA's 8 heads × 64 values in E5M6
                + s * fe * (2 * (2 - q8) + 2)  # the shared expert: its SwiGLU's two inputs in FP8, its output recomputed
                # the routed rows alike, their inputs in FP8, and their outputs not kept (weighted before
                # the combine, on the experts' side: DeepEP's dispatch carries the top-k weights)
                + rows * (h * (2 - q8) + 2 * fe * (2 - q8) + fe * 2 + h * 2))
    assert base.layers[1].stash_bytes - cached.layers[1].stash_bytes == pytest.approx(expected, rel=1e-12)
    assert cached.layers[1].selective_stash == cached.layers[1].stash_bytes


def test_fp8_activations_need_fp8_products():
    with pytest.raises(SpecError, match="fp8_activations"):
        build_model("llama", fp8_activations=True, **SMALL)


def test_what_the_recipe_does_not_stash_runs_again_in_the_backward():
    # §3.2.3: "we recompute all RMSNorm operations and MLA up-projections during back-propagation";
    # §3.3.3: the MoE SwiGLUs' outputs recomputed. Each adds its forward time to the backward.
    experts = ExpertSpec(count=8, top_k=2, ffn_hidden=512, shared=1)
    model = shard_model(build_model("llama", gemm_dtype="fp8", experts=experts, mla=MLA, fp8_activations=True,
                                    **SMALL), Shard(expert=4))
    device = DeviceSpec(name="gpu", memory_bytes=80e9, peak_flop_per_s=1e15, peak_fp32_flop_per_s=6e13,
                        memory_bandwidth_bytes_per_s=3e12, peak_fp8_flop_per_s=2e15, kernel_issue_s=0.0)
    block = model.layers[1]
    again = {"ln1", "ln2", "mla_q_norm", "mla_kv_norm", "mla_q_up", "mla_kv_up", "mla_rope_q", "mla_rope_k",
             "mla_q_cat", "mla_k_cat", "swiglu", "experts_act"}
    assert {k.name for k in block.kernels if k.recomputed} == again
    kept = replace(block, kernels=tuple(replace(k, recomputed=False) for k in block.kernels))
    expected = sum(kernel_forward_s(k, device, "bf16", 2) for k in block.kernels if k.name in again)
    fwd, bwd, wgrad = layer_times_s(block, device, "bf16", 2)
    fwd0, bwd0, wgrad0 = layer_times_s(kept, device, "bf16", 2)
    assert (fwd, wgrad) == (fwd0, wgrad0)  # the forward and the weight gradients unchanged
    assert bwd - bwd0 == pytest.approx(expected, rel=1e-12) and expected > 0
    # a dense block of the recipe keeps its SwiGLU's output (the down-projection's FP8 input)
    dense = shard_model(build_model("llama", gemm_dtype="fp8", fp8_activations=True, **SMALL), Shard())
    assert {k.name for k in dense.layers[1].kernels if k.recomputed} == {"ln1", "ln2"}


def test_an_fp8_block_casts_each_products_operands_once_a_pass():
    # forward: each FP8 product's input (M × K) cast to FP8, 2 + 1 + 4/128 bytes an element;
    # backward: the output gradient (M × N) for Dgrad, input and gradient again for Wgrad
    cast = 2 + 1 + 4 / 128
    experts = ExpertSpec(count=8, top_k=2, ffn_hidden=512, shared=1)
    block = shard_model(build_model("llama", gemm_dtype="fp8", experts=experts, mla=MLA, **SMALL),
                        Shard(expert=4)).layers[1]
    (kernel,) = [k for k in block.kernels if k.name == "fp8_cast"]
    s, h, fe, rows = 256, 1024, 512, 2 * 256 * 2 * 4 / 8  # two local experts of s·top_k·EP/count rows
    shapes = [(s, 384, h), (s, 8 * 96, 384), (s, 128 + 32, h), (s, 8 * 128, 128), (s, h, 8 * 64),  # MLA (M, N, K)
              (s, 2 * fe, h), (s, h, fe), (rows, 2 * fe, h), (rows, h, fe)]  # shared and routed experts
    inputs, outputs = sum(m * k for m, _, k in shapes), sum(m * n for m, n, _ in shapes)
    assert kernel.bytes == pytest.approx(cast * inputs, rel=1e-12)
    assert kernel.bwd_bytes == pytest.approx(cast * (inputs + 2 * outputs), rel=1e-12)
    assert not any(k.name == "fp8_cast" for k in build_model("llama", **SMALL).layers[1].kernels)  # bf16: none
