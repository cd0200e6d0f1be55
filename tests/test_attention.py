"""Attention kernels: ``model.attention: flash | sdpa | cudnn | unfused``.

The contract (``sim.cost.kernels``, ``sim.cost.compute.fused_attention_s``,
``sim.cost.memory.block_activation_bytes``): a fused kernel does the same model FLOPs as the
unfused one (4·s²·h per block, causal mask not subtracted), but in time it skips the causal
half and runs at the device's measured FlashAttention rate; its backward does 2.5 times its
forward's FLOPs; what it moves is linear in s; it stashes Korthikanti et al.'s count without
the 5as/h term plus one fp32 log-sum-exp per query and head; selective recompute adds nothing
to it. Closed forms are written out below.
"""

from __future__ import annotations

import pytest

from sim.app.cli import main
from sim.core.parallelism import Recompute, Shard
from sim.core.specs import DeviceSpec
from sim.cost import kernels as K
from sim.cost.compute import attention_core_s, fused_attention_s, layer_times_s, stage_time_s
from sim.cost.memory import BlockShape, block_activation_bytes, layer_stash_bytes
from sim.input.scenario import parse_scenario
from sim.models import build_model, shard_model

PEAK = 1.0e15
BANDWIDTH = 3.0e12
GPU = DeviceSpec(name="gpu", memory_bytes=80e9, peak_flop_per_s=PEAK, peak_fp32_flop_per_s=PEAK / 16,
                 memory_bandwidth_bytes_per_s=BANDWIDTH, efficiency=0.7, matmul_half_dim=64,
                 kernel_issue_s=10e-6, memory_efficiency=0.8, attention_efficiency=0.6,
                 attention_backward_efficiency=0.5, sdpa_efficiency=0.3, sdpa_backward_efficiency=0.25,
                 cudnn_efficiency=0.4, cudnn_backward_efficiency=0.45)
GPT = dict(layers=2, hidden=2048, heads=16, seq_len=4096, vocab=1024, dtype="bf16")


def _block(attention: str, **shape):
    return build_model("gpt", attention=attention, **{**GPT, **shape}).layers[1]


def _kernel(layer, name: str) -> K.KernelSpec:
    return next(k for k in layer.kernels if k.name == name)


def test_a_flash_block_runs_one_fused_kernel_at_the_measured_rate():
    s, h, samples = GPT["seq_len"], GPT["hidden"], 8
    flash = _kernel(_block("flash"), "attention")
    assert flash.flop == 4 * s * s * h / 2  # QK^T and PV, the causal half skipped
    fwd, bwd = fused_attention_s(flash, GPU, "bf16", samples)
    assert fwd == pytest.approx(samples * 4 * s * s * h / 2 / (PEAK * 0.6))  # compute-bound
    assert bwd == pytest.approx(2.5 * samples * 4 * s * s * h / 2 / (PEAK * 0.5))  # scores recomputed
    sdpa_fwd, sdpa_bwd = fused_attention_s(_kernel(_block("sdpa"), "attention"), GPU, "bf16", samples)
    assert (sdpa_fwd, sdpa_bwd) == pytest.approx((fwd * 0.6 / 0.3, bwd * 0.5 / 0.25))
    cudnn = _kernel(_block("cudnn"), "attention")
    assert (cudnn.flop, cudnn.bytes) == (flash.flop, flash.bytes)  # the same fused kernel, at its own rate
    cudnn_fwd, cudnn_bwd = fused_attention_s(cudnn, GPU, "bf16", samples)
    assert (cudnn_fwd, cudnn_bwd) == pytest.approx((fwd * 0.6 / 0.4, bwd * 0.5 / 0.45))


def test_the_block_swaps_four_kernels_for_one_and_keeps_its_model_flops():
    unfused, flash = _block("unfused"), _block("flash")
    assert [k.name for k in unfused.kernels if k.name in K.ATTENTION_CORE] == \
        ["scores", "softmax", "attention_dropout", "attend"]
    assert not any(k.name in K.ATTENTION_CORE for k in flash.kernels)
    assert flash.fwd_flop == unfused.fwd_flop and flash.bwd_flop == unfused.bwd_flop  # MFU's count
    core_fwd = attention_core_s(unfused, GPU, "bf16", 4)
    fused_fwd, _ = fused_attention_s(_kernel(flash, "attention"), GPU, "bf16", 4)
    assert layer_times_s(flash, GPU, "bf16", 4)[0] == pytest.approx(
        layer_times_s(unfused, GPU, "bf16", 4)[0] - core_fwd + fused_fwd)


def test_bert_attends_both_ways_and_is_not_halved():
    bert = build_model("bert", attention="flash", layers=1, hidden=1024, heads=16, seq_len=512, vocab=1024)
    assert _kernel(bert.layers[1], "attention").flop == 4 * 512 * 512 * 1024


def test_flash_traffic_is_linear_in_s_and_unfused_s2_traffic_quadratic():
    flash_s, unfused_s = _block("flash", seq_len=1024), _block("unfused", seq_len=1024)
    flash_2s, unfused_2s = _block("flash", seq_len=2048), _block("unfused", seq_len=2048)
    s, h, a, d = 1024, GPT["hidden"], GPT["heads"], 2
    # reads Q, K, V, writes O (d·s·h each) and the fp32 log-sum-exp (4·a·s)
    assert _kernel(flash_s, "attention").bytes == 4 * d * s * h + 4 * a * s
    assert _kernel(flash_2s, "attention").bytes == 2 * _kernel(flash_s, "attention").bytes
    assert _kernel(flash_2s, "attention").bwd_bytes == 2 * _kernel(flash_s, "attention").bwd_bytes
    for name in ("softmax", "attention_dropout"):
        assert _kernel(unfused_2s, name).bytes == 4 * _kernel(unfused_s, name).bytes


@pytest.mark.parametrize(("t", "sequence_parallel"), [(1, False), (4, True)])
def test_flash_stash_is_korthikanti_without_5as_over_h_plus_the_lse(t, sequence_parallel):
    s, h, a = 2048, 1024, 16
    shape = BlockShape(seq_len=s, hidden=h, heads=a, ffn_hidden=4 * h)
    kept = dict(tensor_parallel=t, sequence_parallel=sequence_parallel)
    # Korthikanti et al. 2022, Table 2: sh(34 + 5as/h)/t with sequence parallelism
    assert block_activation_bytes(shape) == pytest.approx(s * h * (34 + 5 * a * s / h))
    expected = (34 * s * h + 4 * a * s) / t
    assert block_activation_bytes(shape, attention="flash", **kept) == pytest.approx(expected)
    assert block_activation_bytes(shape, attention="flash", recompute=Recompute.SELECTIVE, **kept) == \
        pytest.approx(expected)


def test_selective_recompute_under_flash_adds_nothing_and_drops_nothing():
    model = build_model("gpt", attention="flash", **GPT)
    block = model.layers[1]
    assert attention_core_s(block, GPU, "bf16", 4) == 0.0
    assert layer_stash_bytes(block, Recompute.SELECTIVE) == layer_stash_bytes(block, Recompute.NONE)
    none = stage_time_s(model, GPU, 0, 4, 4, Recompute.NONE)
    assert stage_time_s(model, GPU, 0, 4, 4, Recompute.SELECTIVE) == none
    unfused = build_model("gpt", **GPT)
    assert stage_time_s(unfused, GPU, 0, 4, 4, Recompute.SELECTIVE).bwd_s > \
        stage_time_s(unfused, GPU, 0, 4, 4, Recompute.NONE).bwd_s


def test_a_shard_keeps_the_kernel_of_its_model():
    model = build_model("llama", attention="flash", layers=1, hidden=1024, heads=16, kv_heads=4, seq_len=2048,
                        vocab=1024)
    part = shard_model(model, Shard(tensor=4, context=2, sequence_parallel=True))
    assert part.attention == "flash"
    kernel = _kernel(part.layers[1], "attention")
    q, s, h, h_kv = 1024, 2048, 1024, 256  # s/c queries over all s keys, K and V of 4 of 16 heads
    assert kernel.flop == 4 * q * s * h / 4 / 2
    assert kernel.bytes == 2 * (2 * q * h / 4 + 2 * s * h_kv / 4) + 4 * q * 16 / 4


SCENARIO = """
cluster: {{preset: dgx-h100, nodes: 1}}
model: {{preset: gpt, layers: 2, hidden: 256, heads: 4, seq_len: 128, vocab: 1000{extra}}}
training: {{global_batch_size: 8, microbatch_size: 8}}
plan:
  stages:
  - {{layers: [0, 4], devices: [0]}}
"""


def _write(tmp_path, text):
    path = tmp_path / "attention.yaml"
    path.write_text(text)
    return str(path)


def test_an_unknown_kernel_is_one_line_naming_the_key_and_the_choices(tmp_path, capsys):
    path = _write(tmp_path, SCENARIO.format(extra=", attention: fast"))
    assert main(["check", path]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "model.attention: unknown value 'fast'" in err and "valid: cudnn, flash, sdpa, unfused" in err


def test_a_profile_with_attention_is_refused(tmp_path, capsys):
    text = """
cluster: {preset: v100-nvlink-8, nodes: 1}
model: {profile: profiles/dapple-v100/bert-48-pbs-2.txt, profile_batch_size: 2, attention: flash}
training: {global_batch_size: 8, microbatch_size: 2}
"""
    assert main(["check", _write(tmp_path, text)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "model.attention: a measured profile's times already include its attention kernel" in err


def test_a_model_without_attention_blocks_refuses_the_key(tmp_path, capsys):
    text = SCENARIO.format(extra="").replace("preset: gpt, layers: 2, hidden: 256, heads: 4, seq_len: 128, vocab: 1000",
                                             "preset: mlp, layers: 2, hidden: 64, attention: flash")
    assert main(["check", _write(tmp_path, text)]) == 2
    assert "model.attention: preset mlp has no attention blocks" in capsys.readouterr().err


@pytest.mark.parametrize(("cluster", "kernel"), [
    ("{preset: dgx-h100, nodes: 1}", "flash"),
    ("{preset: a100-nvlink-8, nodes: 1}", "flash"),
    ("{preset: v100-nvlink-8, nodes: 1}", "unfused"),  # FlashAttention-2 does not run on Volta
    ("{preset: a100-nvlink-8, nodes: 1, device: {name: cpu-core, memory: 4GiB, peak_flops: 50GFLOP/s}}", "unfused"),
    ("{preset: a100-nvlink-8, nodes: 1, device: {name: my-gpu, memory: 80GiB, peak_flops: 500TFLOP/s, "
     "default_attention: flash}}", "flash"),
], ids=["h100", "a100", "v100", "custom", "custom-gpu"])
def test_the_default_kernel_is_the_devices(cluster, kernel):
    scenario = parse_scenario(SCENARIO.format(extra="").replace("{preset: dgx-h100, nodes: 1}", cluster))
    assert scenario.model.attention == kernel
    assert parse_scenario(SCENARIO.format(extra=", attention: sdpa").replace(
        "{preset: dgx-h100, nodes: 1}", cluster)).model.attention == "sdpa"  # the model's key wins


def test_the_presets_efficiencies_are_the_papers_measurements():
    h100 = parse_scenario(SCENARIO.format(extra="")).cluster.device
    # FlashAttention-3 Fig. 5(d) / Fig. 6 and their FlashAttention-2 bars, head dim 128, 4k, over 989 TFLOP/s
    assert h100.attention_efficiencies("flash") == pytest.approx((579 / 989, 542 / 989), abs=5e-4)
    assert h100.attention_efficiencies("sdpa") == pytest.approx((319 / 989, 310 / 989), abs=5e-4)
    # the same figures' cuDNN bars (Transformer Engine's fused attention on Hopper): 518 and 499
    assert h100.attention_efficiencies("cudnn") == pytest.approx((518 / 989, 499 / 989), abs=5e-4)
    a100 = parse_scenario(SCENARIO.format(extra="").replace("dgx-h100", "a100-nvlink-8")).cluster.device
    # FlashAttention-2 Fig. 4(d): forward + backward, causal, head dim 128, 4k, over 312 TFLOP/s
    assert a100.attention_efficiencies("flash") == pytest.approx((173 / 312, 173 / 312), abs=5e-4)
    # Transformer Engine runs FlashAttention-2 on Ampere: the A100's cudnn is its flash
    assert a100.attention_efficiencies("cudnn") == a100.attention_efficiencies("flash")


def test_megatron_core_runs_transformer_engines_attention():
    text = SCENARIO.format(extra="").replace("cluster:", "stack: megatron-core\ncluster:", 1)
    assert parse_scenario(text).model.attention == "cudnn"
