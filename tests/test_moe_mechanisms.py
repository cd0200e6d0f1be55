"""Closed forms of the DeepSeek-V3 mechanisms: FP8 GEMMs, multi-head latent attention, node-limited routing."""

from dataclasses import replace

import pytest

from conftest import REPO
from sim.core.errors import ScenarioError, SpecError
from sim.core.experts import ExpertSpec
from sim.core.mla import MlaSpec
from sim.core.parallelism import Shard
from sim.core.specs import DeviceSpec
from sim.cost.comm import all_to_all, node_limited_fraction
from sim.cost.compute import kernel_time_s, layer_times_s
from sim.cost.kernels import KernelSpec
from sim.input.presets import (
    CUTLASS36_H800_FP8_TFLOPS,
    DEEPGEMM_H800_FP8_TFLOPS,
    DEVICE_PRESETS,
    H100_EFFICIENCY,
    H100_FP8_EFFICIENCY,
    measured_fp8_efficiency,
)
from sim.input.scenario import load_scenario, parse_scenario
from sim.models import build_model, shard_model
from sim.models.mla import mla_attention_flop, mla_stash_bytes
from sim.models.precision import FP8_A2A_SCALE

DEVICE = DeviceSpec(name="h", memory_bytes=80e9, peak_flop_per_s=989e12, peak_fp32_flop_per_s=67e12,
                    memory_bandwidth_bytes_per_s=3.35e12, efficiency=0.7, peak_fp8_flop_per_s=1979e12)
V3_MLA = MlaSpec(q_lora_rank=1536, kv_lora_rank=512, rope_head_dim=64, nope_head_dim=128, v_head_dim=128)
SMALL = dict(layers=2, hidden=1024, heads=8, kv_heads=8, ffn_hidden=2048, vocab=1000, seq_len=256, attention="flash")


def test_an_fp8_gemm_takes_its_flops_over_the_fp8_peak_times_the_efficiency():
    gemm = KernelSpec(name="g", flop=2 * 8192 * 8192 * 8192, rows=8192, cols=8192, inner=8192, weights=True)
    layer = build_model("llama", **SMALL).layers[1]
    one = replace(layer, kernels=(replace(gemm, fp8=True),))
    fwd, bwd, _ = layer_times_s(one, DEVICE, "bf16", 1)
    assert fwd == pytest.approx(gemm.flop / (1979e12 * 0.7), rel=1e-12)
    assert bwd == pytest.approx(2 * gemm.flop / (1979e12 * 0.7), rel=1e-12)  # Dgrad and Wgrad in FP8 too
    bf16 = layer_times_s(replace(layer, kernels=(gemm,)), DEVICE, "bf16", 1)[0]
    assert bf16 == pytest.approx(gemm.flop / (989e12 * 0.7), rel=1e-12)


def test_a_device_without_an_fp8_peak_refuses_fp8():
    with pytest.raises(SpecError, match="no FP8 peak"):
        replace(DEVICE, peak_fp8_flop_per_s=None).peak_flop_per_s_for("fp8")


def test_the_hopper_presets_have_the_h100_sxm_dense_fp8_peak():
    for name in ("H100-80GB", "H800-80GB"):
        assert DEVICE_PRESETS[name]["peak_fp8_flops"] == "1979TFLOP/s"


def test_fp8_marks_the_blocks_weighted_products_but_not_the_router_attention_or_head():
    experts = ExpertSpec(count=4, top_k=2, ffn_hidden=512)
    model = build_model("llama", **SMALL, experts=experts, gemm_dtype="fp8")
    block = model.layers[1]
    marked = sorted(k.name for k in block.kernels if k.fp8)
    assert marked == ["experts_down", "experts_up", "proj", "qkv"]
    assert not any(k.fp8 for k in model.layers[-1].kernels + model.layers[0].kernels)
    plain = build_model("llama", **SMALL, experts=experts)
    assert block.a2a_bytes == pytest.approx(plain.layers[1].a2a_bytes * (1 + 4 / 128 + 2) / 4)
    assert FP8_A2A_SCALE == pytest.approx(0.7578125)
    assert block.fwd_flop == plain.layers[1].fwd_flop  # the model's FLOPs are the same


def test_mla_projection_parameters_of_deepseek_v3_written_out():
    # q_a 7168x1536, q_b 1536x128x192, kv_a 7168x576, kv_b 512x128x256, o 16384x7168
    expected = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    assert V3_MLA.projection_params(7168, 128) == expected == 187_105_280


def test_mla_block_flops_per_token_written_out():
    s, h, a = 256, 1024, 8
    mla = MlaSpec(q_lora_rank=384, kv_lora_rank=128, rope_head_dim=32, nope_head_dim=64, v_head_dim=64)
    dense = build_model("llama", **SMALL).layers[1]
    latent = build_model("llama", **SMALL, mla=mla).layers[1]
    projections = h * 384 + 384 * a * 96 + h * 160 + 128 * a * 128 + a * 64 * h
    mha = 2 * s * (h * 3 * h + h * h) + 4 * s * s * h
    new = 2 * s * projections + 2 * s * s * a * (96 + 64)
    assert mla_attention_flop(mla, s, a) == 2 * s * s * a * (96 + 64)
    assert latent.fwd_flop - dense.fwd_flop == pytest.approx(new - mha, rel=1e-12)
    assert latent.bwd_flop - dense.bwd_flop == pytest.approx(2 * (new - mha), rel=1e-12)
    assert latent.param_bytes - dense.param_bytes == pytest.approx(2 * (projections + 384 + 128 - 4 * h * h))
    names = [k.name for k in latent.kernels]
    assert "qkv" not in names and names.count("attention") == 1 and "mla_kv_up" in names


def test_mla_assembles_its_queries_and_keys_in_four_memory_bound_passes_written_out():
    # DeepSeek-V3's block (s 4096, a 128, d_h 128, d_h^R 64, d_v 128, bf16): rotary on q's rope part
    # and on the shared key part, torch.cat of q (128 + 64 -> 192 a head) and of k (the shared part
    # broadcast to every head); MLA.forward in deepseek-ai/DeepSeek-V3 inference/model.py
    s, a, e = 4096, 128, 2
    block = shard_model(build_model("llama", **dict(SMALL, hidden=7168, heads=a, kv_heads=a, seq_len=s),
                                    mla=V3_MLA), Shard()).layers[1]
    kernels = {k.name: k for k in block.kernels if k.name.startswith(("mla_rope", "mla_q_cat", "mla_k_cat"))}
    expected = {  # name: (forward bytes, backward bytes)
        "mla_rope_q": (2 * e * s * a * 64, 2 * e * s * a * 64),
        "mla_rope_k": (2 * e * s * 64, e * s * a * 64 + 3 * e * s * 64),  # the broadcast's gradient summed over heads
        "mla_q_cat": (e * s * a * 192 + e * s * a * 192, 2 * e * s * a * 192),
        "mla_k_cat": (e * s * (a * 128 + 64) + e * s * a * 192, 2 * e * s * a * (128 + 128)),  # kv's split joined back
    }
    assert {n: (k.bytes, k.bwd_bytes) for n, k in kernels.items()} == expected
    assert all(k.recomputed and k.flop == 0 for k in kernels.values())  # after the unstashed up-projections
    names = [k.name for k in block.kernels]
    assert names.index("mla_kv_up") < names.index("mla_rope_q") < names.index("mla_k_cat") < names.index("attention")
    # each a roofline pass at the memory bandwidth: forward, again before its backward, then the backward
    bandwidth = DEVICE.memory_bandwidth_bytes_per_s * DEVICE.memory_efficiency
    only = replace(block, kernels=tuple(kernels.values()))
    fwd, bwd, wgrad = layer_times_s(only, DEVICE, "bf16", 1)
    assert fwd == pytest.approx(sum(f for f, _ in expected.values()) / bandwidth, rel=1e-12)
    assert bwd == pytest.approx(sum(f + b for f, b in expected.values()) / bandwidth, rel=1e-12)
    assert wgrad == 0


def test_mla_stashes_the_latents_instead_of_queries_keys_and_values():
    s, h, a, e = 4096, 7168, 128, 2
    latent = e * s * (h + 1536 + 512 + 64 + a * 128) + 4 * a * s
    assert mla_stash_bytes(V3_MLA, s, h, a, e) == latent
    small = MlaSpec(q_lora_rank=384, kv_lora_rank=128, rope_head_dim=32, nope_head_dim=64, v_head_dim=64)
    dense = build_model("llama", **SMALL).layers[1]
    mla = build_model("llama", **SMALL, mla=small).layers[1]
    s, h, a = 256, 1024, 8
    removed = e * s * 5 * h  # QKV input, Q, K, V, output of multi-head attention (kv_heads = heads)
    added = e * s * (h + 384 + 128 + 32 + a * 64)
    assert mla.stash_bytes - dense.stash_bytes == pytest.approx(added - removed, rel=1e-12)


def test_mla_is_refused_under_tensor_parallelism():
    model = build_model("llama", **SMALL, mla=V3_MLA)
    with pytest.raises(SpecError, match="without tensor or context"):
        shard_model(model, Shard(tensor=2))


def test_node_limited_routing_sends_min_m_n_k_over_k_of_the_across_bytes():
    v3 = ExpertSpec(count=256, top_k=8, ffn_hidden=2048, node_limit=4)
    assert node_limited_fraction(v3, 8) == 4 / 8
    assert node_limited_fraction(v3, 2) == 2 / 8  # two servers: at most two server copies
    assert node_limited_fraction(replace(v3, node_limit=None), 8) == 1.0
    assert node_limited_fraction(None, 8) == 1.0
    assert node_limited_fraction(ExpertSpec(count=8, top_k=2, ffn_hidden=64, node_limit=4), 8) == 1.0


def _scenario(extra: str = "", experts: str = "node_limit: 4"):
    text = f"""
name: v3-tiny
cluster: {{preset: dgx-h800, nodes: 8}}
model: {{preset: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 4, seq_len: 32, vocab: 128, attention: flash,
         experts: {{count: 64, top_k: 8, ffn_hidden: 128, {experts}}}{extra}}}
training: {{global_batch_size: 64, microbatch_size: 64}}
plan: {{pipeline_parallel: 1, data_parallel: 64, expert_parallel: 64}}
"""
    return parse_scenario(text, source="v3-tiny.yaml")


def test_node_limited_all_to_all_across_bytes_written_out():
    cluster = _scenario().cluster
    nbytes = 1e9
    plain = all_to_all([8] * 8, nbytes, cluster)
    limited = all_to_all([8] * 8, nbytes, cluster, across_fraction=0.5)
    assert plain[0].bytes_per_device == limited[0].bytes_per_device == 7 / 64 * nbytes  # NVLink phase unchanged
    assert plain[1].bytes_per_device == 56 / 64 * nbytes
    assert limited[1].bytes_per_device == 56 / 64 * nbytes * 0.5


def test_the_scenario_keys_reach_the_model():
    scenario = _scenario(", gemm_dtype: fp8, mla: {q_lora_rank: 32, kv_lora_rank: 16, rope_head_dim: 8, "
                         "nope_head_dim: 16, v_head_dim: 16}")
    model = scenario.model
    assert model.experts.node_limit == 4 and model.gemm_dtype == "fp8" and model.mla.kv_lora_rank == 16
    assert any(k.fp8 for k in model.layers[1].kernels)
    with pytest.raises(ScenarioError, match="node_limit"):
        _scenario(experts="node_limit: 0")
    with pytest.raises(ScenarioError, match="gemm_dtype"):
        _scenario(", gemm_dtype: fp4")


def test_a_v_schedule_grid_places_stage_s_and_2p_minus_1_minus_s_on_device_set_s():
    text = """
name: v-grid
cluster: {preset: dgx-h100, nodes: 1}
model: {preset: llama, layers: 6, hidden: 64, heads: 4, kv_heads: 4, seq_len: 32, vocab: 128}
training: {global_batch_size: 16, microbatch_size: 2}
plan: {schedule: {name: dualpipe-v, chunks: 2}, pipeline_parallel: 4, data_parallel: 2}
"""
    stages = parse_scenario(text, source="v-grid.yaml").plan.stages
    sets = [stage.devices for stage in stages]
    assert len(stages) == 8  # 2p stages
    assert sets == [(0, 1), (2, 3), (4, 5), (6, 7), (6, 7), (4, 5), (2, 3), (0, 1)]


def test_fp8_products_take_the_measured_fp8_efficiency_and_bf16_ones_keep_theirs():
    # one DeepGEMM row: 1297 TFLOP/s on 4 groups of 8192 x 4096 x 7168 is e = 1297/1979 x (1 + 64/8192)(1 + 64/4096)
    (row,) = [r for r in DEEPGEMM_H800_FP8_TFLOPS if r[:4] == (4, 8192, 4096, 7168)]
    assert measured_fp8_efficiency((row,)) == pytest.approx(1297 / 1979 * (1 + 64 / 8192) * (1 + 64 / 4096) * (1 + 64 / 7168),
                                                             rel=1e-12)
    # two rows: the FLOP-weighted harmonic mean, sum F / sum(F / e)
    rows = ((1, 4096, 4096, 4096, 990.0), (1, 4096, 4096, 8192, 1979.0 / 2))
    e = 990 / 1979 * (1 + 64 / 4096) ** 3, 0.5 * (1 + 64 / 4096) ** 2 * (1 + 64 / 8192)  # M, N and K's curve out
    f = 2 * 4096**3, 2 * 4096**2 * 8192
    assert measured_fp8_efficiency(rows) == pytest.approx((f[0] + f[1]) / (f[0] / e[0] + f[1] / e[1]), rel=1e-12)
    h800 = parse_scenario("""
name: d
cluster: {preset: dgx-h800, nodes: 1}
model: {preset: llama, layers: 2, hidden: 256, heads: 4, seq_len: 128, vocab: 512}
training: {global_batch_size: 8, microbatch_size: 8}
plan: {pipeline_parallel: 1, data_parallel: 8}
""", source="d.yaml").cluster.device
    assert h800.fp8_efficiency == H100_FP8_EFFICIENCY == pytest.approx(0.626, abs=5e-4) and h800.efficiency == H100_EFFICIENCY == 0.70
    flop = 2 * 8192.0**3
    gap = h800.kernel_overhead_s  # the launch gap after each kernel
    assert kernel_time_s(flop, 0.0, h800, "fp8") == pytest.approx(flop / (1979e12 * 0.626) + gap, rel=1e-12)
    assert kernel_time_s(flop, 0.0, h800, "bf16") == pytest.approx(flop / (989e12 * H100_EFFICIENCY) + gap, rel=1e-12)


def test_deepseek_v3_ran_its_fp8_products_at_the_pre_deepgemm_rates():
    # DeepGEMM README (a6d97a1): 1297 TFLOP/s at 1.2x over DeepSeek's CUTLASS 3.6 implementation
    assert CUTLASS36_H800_FP8_TFLOPS[6] == (4, 8192, 4096, 7168, pytest.approx(1297 / 1.2, rel=1e-12))
    assert CUTLASS36_H800_FP8_TFLOPS[2][4] == 590  # 1.0x: the same rate
    published = load_scenario(REPO / "scenarios" / "published" / "deepseek2024_v3_2048.yaml")
    assert published.cluster.device.fp8_efficiency == round(measured_fp8_efficiency(CUTLASS36_H800_FP8_TFLOPS), 3)
    assert published.cluster.device.fp8_efficiency == pytest.approx(0.538, abs=5e-4)
    assert published.cluster.device.fp8_efficiency < H100_FP8_EFFICIENCY  # DeepGEMM's own rates


def test_deepseek_v3_attention_runs_at_its_profiled_192_128_kernels():
    # deepseek-ai/profile-data train.json (4496024), four MLA blocks on the 112 SMs the all-to-all
    # leaves: compute_attn_ws<Flash_fwd_kernel_traits<192, 128, ...>> 1248 + 1199 + 1280 + 1221 us,
    # FlashAttnBwd 3583 + 3863 + 3809 + 3860 us with Preprocess 267 + 269 + 246 + 243 and
    # PostprocessConvertdQ 215 + 216 + 223 + 223; FLOPs 2·s²·(192 + 128)·128 heads, halved by the causal mask
    forward_s, backward_s = 4948e-6 / 4, (15115 + 1025 + 877) * 1e-6 / 4
    flop = 2 * 4096**2 * (192 + 128) * 128 / 2
    on_all_sms = 112 / 132  # the same kernels on the 132 SMs of a block without an all-to-all beside it
    published = load_scenario(REPO / "scenarios" / "published" / "deepseek2024_v3_2048.yaml")
    device = published.cluster.device
    assert device.attention_efficiencies("flash") == (pytest.approx(flop / (forward_s * on_all_sms) / 989e12, abs=5e-4),
                                                      pytest.approx(2.5 * flop / (backward_s * on_all_sms) / 989e12,
                                                                    abs=5e-4))
    attention = [k for k in shard_model(published.model, published.plan.shard).layers[10].kernels if k.fused_attention]
    assert attention[0].flop == flop
