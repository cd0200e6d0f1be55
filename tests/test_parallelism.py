"""Golden tests of the 4D closed forms, each formula written out from its paper."""

from __future__ import annotations

import pytest

from sim.core.parallelism import Recompute, Sharding
from sim.cost.memory import BlockShape, block_activation_bytes, model_state_bytes
from sim.cost.tensor_comm import tensor_parallel_collectives

# GPT-3 175B's block (Brown et al. 2020, Table 2.1): s = 2048, h = 12288, a = 96
S, H, A = 2048, 12288, 96
GPT = BlockShape(seq_len=S, hidden=H, heads=A, ffn_hidden=4 * H)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_activations_per_block_follow_korthikanti_table_2(t):
    sbh, as_h = S * H, A * S / H
    # Korthikanti et al. 2022, Table 2 (per sample, b = 1)
    assert block_activation_bytes(GPT) == pytest.approx(sbh * (34 + 5 * as_h))
    assert block_activation_bytes(GPT, tensor_parallel=t) == pytest.approx(sbh * (10 + 24 / t + 5 * as_h / t))
    assert block_activation_bytes(GPT, tensor_parallel=t, sequence_parallel=True) == pytest.approx(
        sbh / t * (34 + 5 * as_h))
    assert block_activation_bytes(GPT, tensor_parallel=t, recompute=Recompute.SELECTIVE) == pytest.approx(
        sbh * (10 + 24 / t))
    assert block_activation_bytes(GPT, tensor_parallel=t, sequence_parallel=True,
                                  recompute=Recompute.SELECTIVE) == pytest.approx(sbh / t * 34)
    assert block_activation_bytes(GPT, tensor_parallel=t, recompute=Recompute.FULL) == pytest.approx(2 * sbh)
    assert block_activation_bytes(GPT, tensor_parallel=t, sequence_parallel=True,
                                  recompute=Recompute.FULL) == pytest.approx(2 * sbh / t)


def test_grouped_query_attention_gated_mlp_and_context_parallelism():
    # Llama-3-70B-like: h 8192, 64 heads, 8 kv heads, SwiGLU of width 28672, no dropout, s 8192
    s, h, a, kv, f = 8192, 8192, 64, 8, 28672
    llama = BlockShape(seq_len=s, hidden=h, heads=a, ffn_hidden=f, kv_heads=kv, dropout=False, gated=True)
    h_kv = kv * h // a
    # terms of Korthikanti et al. §4.1 with K, V of width h_kv, three MLP tensors of width f, no masks:
    # QKV input, MLP input, two norm inputs, Q K V, output projection input, gate up and down inputs
    linear = 2 * (s * h) + 2 * (s * h) + 2 * 2 * (s * h) + 2 * (s * h + 2 * s * h_kv) + 2 * (s * h) + 3 * 2 * (s * f)
    assert block_activation_bytes(llama) == pytest.approx(linear + 2 * a * s * s)
    assert block_activation_bytes(llama, context_parallel=4) == pytest.approx((linear + 2 * a * s * s) / 4)
    assert block_activation_bytes(llama, tensor_parallel=8, sequence_parallel=True, context_parallel=2,
                                  recompute=Recompute.SELECTIVE) == pytest.approx(linear / 8 / 2)


@pytest.mark.parametrize("d", [1, 4, 64])
def test_model_states_follow_zero(d):
    psi = 1.0e9  # parameters; 2-byte weights, mixed-precision Adam holds 12 bytes of state each
    states = {mode: model_state_bytes(2 * psi, optimizer_bytes_per_param_byte=6.0, data_parallel=d, sharding=mode)
              for mode in Sharding}
    # Rajbhandari et al. 2020, Figure 1: 16Ψ, 4Ψ + 12Ψ/d, 2Ψ + 14Ψ/d, 16Ψ/d
    assert states[Sharding.NONE].total == pytest.approx(16 * psi)
    assert states[Sharding.OPTIMIZER].total == pytest.approx(4 * psi + 12 * psi / d)
    assert states[Sharding.GRADIENTS].total == pytest.approx(2 * psi + 14 * psi / d)
    assert states[Sharding.FULL].total == pytest.approx(16 * psi / d)
    assert states[Sharding.OPTIMIZER].optimizer == pytest.approx(states[Sharding.NONE].optimizer / d)


def test_tensor_parallel_collectives_per_block_are_megatrons():
    assert tensor_parallel_collectives(GPT, tensor_parallel=1) == ()
    plain = tensor_parallel_collectives(GPT, tensor_parallel=8)
    # Shoeybi et al. 2019, §3: 2 all-reduces forward (g), 2 backward (f), each of s·h 2-byte elements
    assert [(c.kind, c.phase) for c in plain] == [("all-reduce", "forward")] * 2 + [("all-reduce", "backward")] * 2
    assert {c.bytes for c in plain} == {2.0 * S * H}
    sp = tensor_parallel_collectives(GPT, tensor_parallel=8, sequence_parallel=True)
    assert [c.kind for c in sp if c.phase != "regather"] == ["all-gather", "reduce-scatter"] * 4
    # Megatron-LM 2022 gathers a column-parallel linear's sequence-parallel input again for its weight gradient
    assert [(c.kind, c.beside) for c in sp if c.phase == "regather"] == [("all-gather", True)] * 2
    full = tensor_parallel_collectives(GPT, tensor_parallel=8, recompute=Recompute.FULL)
    assert [c.phase for c in full] == ["forward"] * 2 + ["recompute"] * 2 + ["backward"] * 2
