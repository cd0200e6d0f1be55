"""Eager element-wise kernels (``model.kernels: eager``, ``sim.cost.kernels.eager_elementwise``): torchtitan's
Llama without ``torch.compile``, its RMSNorm, rotary embeddings, ``repeat_kv`` and SwiGLU as separate kernels.

The eager RMSNorm's bytes are written out pass by pass; an eager block is slower than a fused one by
exactly the extra kernels' roofline times (the products unchanged); the key on a measured profile or
a gpt is one line and exit 2; ``stack: torchtitan`` sets it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.app.cli import main
from sim.core.specs import DeviceSpec
from sim.cost import kernels as K
from sim.cost.compute import layer_times_s
from sim.input.scenario import parse_scenario
from sim.models import build_model

LLAMA = dict(layers=2, hidden=256, heads=8, kv_heads=2, seq_len=128, vocab=512, dtype="bf16")
GPU = DeviceSpec(name="gpu", memory_bytes=80e9, peak_flop_per_s=1e15, peak_fp32_flop_per_s=1e15 / 16,
                 memory_bandwidth_bytes_per_s=3e12, efficiency=0.7, matmul_half_dim=64,
                 kernel_issue_s=2e-6, memory_efficiency=0.8)


def test_eager_rmsnorm_bytes_pass_by_pass():
    n, rows, h, d = 128 * 256, 128, 256, 2  # 128 tokens of 256 in bf16
    ks = {k.name.removeprefix("n_"): k for k in K.eager_rmsnorm("n", n, rows, h, d)}
    assert ks["float"].bytes == 2 * n + 4 * n  # x.float(): read bf16, write fp32
    assert ks["pow"].bytes == 4 * n + 4 * n
    assert ks["mean"].bytes == 4 * n + 4 * rows  # to one fp32 per row
    assert ks["eps"].bytes == ks["rsqrt"].bytes == 8 * rows
    assert ks["scale"].bytes == 4 * n + 4 * rows + 4 * n
    assert ks["cast"].bytes == 4 * n + 2 * n  # type_as(x)
    assert ks["weight"].bytes == 2 * n + 2 * n and ks["weight"].fixed_bytes == 2 * h
    assert sum(k.bytes for k in ks.values()) == 36 * n + 24 * rows  # 9× the fused norm's 2·d·n
    assert ks["pow"].bwd_bytes == 12 * n  # gradient and saved x read, one gradient written


def _block(kernels: str):
    return build_model("llama", attention="flash", kernels=kernels, **LLAMA).layers[1]


def test_an_eager_block_costs_the_fused_one_plus_its_extra_kernels():
    device, samples = GPU, 4
    fused, eager = _block("fused"), _block("eager")
    assert [k for k in fused.kernels if k.flop] == [k for k in eager.kernels if k.flop]  # products unchanged
    fused_names = {k.name for k in fused.kernels}
    extra = [k for k in eager.kernels if k.name not in fused_names]
    gone = [k for k in fused.kernels if k.name not in {k.name for k in eager.kernels}]
    assert [k.name for k in gone] == ["ln1", "rope_q", "rope_k", "ln2", "swiglu"]  # the fused rotary too
    assert len(extra) == 8 + 6 + 2 + 8 + 2  # two norms, rotary on q and k, K and V copies (4 ≠ 1), silu and product

    def one(k):
        return layer_times_s(replace(fused, kernels=(k,)), device, "bf16", samples)

    for part in range(3):  # forward, backward, weight gradient
        delta = sum(one(k)[part] for k in extra) - sum(one(k)[part] for k in gone)
        got = layer_times_s(eager, device, "bf16", samples)[part] - layer_times_s(fused, device, "bf16", samples)[part]
        assert got == pytest.approx(delta, rel=1e-9)
    assert layer_times_s(eager, device, "bf16", samples)[0] > layer_times_s(fused, device, "bf16", samples)[0]


def test_a_fused_llama_block_rotates_q_and_k_in_one_pass_each_way():
    # Megatron-Core (core_v0.9.0 attention.py, rotary_pos_embedding.py): fused_apply_rotary_pos_emb on
    # the query and on the key after the QKV product, reading and writing each; its backward the same
    block = _block("fused")
    names = [k.name for k in block.kernels]
    assert names[names.index("qkv") + 1:names.index("qkv") + 3] == ["rope_q", "rope_k"]
    q, k = (next(x for x in block.kernels if x.name == name) for name in ("rope_q", "rope_k"))
    s, h, h_kv, d = 128, 256, 2 * 256 // 8, 2
    assert (q.bytes, q.bwd_bytes, q.flop) == (2 * d * s * h, 2 * d * s * h, 0.0)
    assert (k.bytes, k.bwd_bytes) == (2 * d * s * h_kv, 2 * d * s * h_kv)
    gpt = build_model("gpt", attention="flash", **{key: v for key, v in LLAMA.items() if key != "kv_heads"})
    assert not any(x.name.startswith("rope") for x in gpt.layers[1].kernels)  # a learned position table


def test_megatron_cross_entropy_pass_by_pass():
    # megatron/core/tensor_parallel/cross_entropy.py at core_v0.9.0: .float() (read d, write 4), max (4),
    # -= max (8), exp in place (8), sum (4), div_ (8); backward mul_ in place (8), the cast back (4 + d)
    s, v, d = 128, 512, 2
    fused, eager = (build_model("llama", attention="flash", kernels=k, **LLAMA).layers[-1] for k in ("fused", "eager"))
    loss = next(k for k in fused.kernels if k.name == "loss")
    assert (loss.bytes, loss.bwd_bytes) == ((d + 4 + 4 + 8 + 8 + 4 + 8) * s * v, (8 + 4 + d) * s * v)
    assert next(k for k in eager.kernels if k.name == "loss").bytes == 3 * 4 * s * v  # torchtitan's unchanged


def test_repeat_kv_copies_k_and_v_to_every_head():
    eager = _block("eager")
    copy = next(k for k in eager.kernels if k.name == "repeat_k")
    assert copy.bytes == (1 + 4) * 2 * 128 * (2 * 256 // 8)  # read h_kv wide, write 4× that, bf16


@pytest.mark.parametrize("model, words", [
    ("{profile: profiles/dapple-v100/bert-48-pbs-2.txt, profile_batch_size: 2, kernels: eager}",
     "model.kernels"),
    ("{preset: gpt, layers: 2, hidden: 256, heads: 8, seq_len: 128, vocab: 512, kernels: eager}",
     "model.kernels"),
])
def test_eager_on_a_profile_or_a_gpt_is_one_line_and_exit_2(tmp_path, capsys, model, words):
    path = tmp_path / "s.yaml"
    path.write_text(f"cluster: {{preset: dgx-h100, nodes: 1}}\nmodel: {model}\n"
                    "training: {global_batch_size: 8, microbatch_size: 8}\n")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err


def test_torchtitan_sets_eager_and_megatron_fused():
    base = ("cluster: {preset: dgx-h100, nodes: 1}\n"
            "model: {preset: llama, layers: 2, hidden: 256, heads: 8, seq_len: 128, vocab: 512}\n"
            "training: {global_batch_size: 8, microbatch_size: 8}\n"
            "plan: {pipeline_parallel: 1, data_parallel: 8}\n")
    assert parse_scenario("stack: torchtitan\n" + base).model.kernels == "eager"
    assert parse_scenario("stack: megatron-core\n" + base).model.kernels == "fused"
    assert parse_scenario(base).model.kernels == "fused"
