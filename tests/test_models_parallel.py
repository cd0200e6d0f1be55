"""Models as one device of a tensor- and context-parallel group holds them, and the Llama preset."""

from __future__ import annotations

import pytest

from sim.core.errors import SpecError
from sim.core.parallelism import Shard
from sim.models import build_model, shard_model

GPT = dict(layers=4, hidden=1024, heads=16, seq_len=2048, vocab=51200, dtype="fp16")
LLAMA3_8B = dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256, seq_len=8192)


def _params(model, prefix="block_"):
    return sum(layer.param_bytes for layer in model.layers if layer.name.startswith(prefix))


@pytest.mark.parametrize("t", [2, 4, 8])
def test_block_parameters_fall_by_t_apart_from_the_replicated_biases_and_norms(t):
    whole = build_model("gpt", **GPT)
    part = shard_model(whole, Shard(tensor=t))
    h, d = GPT["hidden"], 2
    replicated = (2 * h + 4 * h) * d  # row-parallel biases (projection, second MLP linear), two LayerNorms
    per_block = (12 * h * h + 13 * h) * d  # Narayanan et al. SC'21, §5.1
    assert whole.layers[1].param_bytes == per_block
    assert part.layers[1].param_bytes == pytest.approx((per_block - replicated) / t + replicated)
    assert _params(part) == pytest.approx((_params(whole) - GPT["layers"] * replicated) / t + GPT["layers"] * replicated)
    # the vocabulary splits over t; the position table is replicated
    assert part.layers[0].param_bytes == pytest.approx((GPT["vocab"] * h / t + GPT["seq_len"] * h) * d)
    assert part.shard == Shard(tensor=t) and whole.shard is None


def test_activations_and_collectives_of_a_sharded_block_are_korthikantis_and_megatrons():
    s, h, a, t = GPT["seq_len"], GPT["hidden"], GPT["heads"], 8
    tp = shard_model(build_model("gpt", **GPT), Shard(tensor=t))
    sp = shard_model(build_model("gpt", **GPT), Shard(tensor=t, sequence_parallel=True))
    # Korthikanti et al. 2022, Table 2, per sample
    assert tp.layers[1].stash_bytes == pytest.approx(s * h * (10 + 24 / t + 5 * a * s / (h * t)))
    assert sp.layers[1].stash_bytes == pytest.approx(s * h / t * (34 + 5 * a * s / h))
    assert sp.layers[1].selective_stash == pytest.approx(34 * s * h / t)
    # Megatron-LM: 4 collectives per block and micro-batch without recompute, each of the s·h activation
    assert [c.kind for c in tp.layers[1].tp_collectives] == ["all-reduce"] * 4
    assert all(c.bytes == 2 * s * h for c in tp.layers[1].tp_collectives)
    # each device does 1/t of the block's products, and sends 1/t of its output to the next stage
    whole = build_model("gpt", **GPT)
    assert tp.layers[1].fwd_flop == pytest.approx(whole.layers[1].fwd_flop / t)
    assert sp.layers[1].output_bytes == pytest.approx(whole.layers[1].output_bytes / t)


def test_context_parallelism_splits_the_sequence_and_passes_key_value_blocks_around_the_ring():
    whole = build_model("gpt", **GPT)
    cp = shard_model(whole, Shard(context=4))
    assert cp.layers[1].stash_bytes == pytest.approx(whole.layers[1].stash_bytes / 4)
    assert cp.layers[1].fwd_flop == pytest.approx(whole.layers[1].fwd_flop / 4)
    s, h = GPT["seq_len"], GPT["hidden"]
    assert cp.layers[1].cp_ring_bytes == pytest.approx(3 * 2 * 2 * (s / 4) * h)  # K and V, c − 1 steps
    assert whole.layers[1].cp_ring_bytes == 0


def test_llama_preset_counts_its_parameters_as_llama_3_is_built():
    model = build_model("llama", **LLAMA3_8B)
    h, f, v, kv, a, layers = 4096, 14336, 128256, 8, 32, 32
    h_kv = kv * h // a
    # Dubey et al. 2024, Table 3 (8B): untied embedding and head, GQA, SwiGLU, RMSNorm, no biases
    per_block = h * (h + 2 * h_kv) + h * h + 3 * h * f + 2 * h
    expected = v * h + layers * per_block + h + h * v
    assert sum(layer.param_bytes for layer in model.layers) == 2 * expected  # bf16 by default
    assert model.preset.values["kv_heads"] == 8 and model.dtype == "bf16"
    assert build_model("llama", **{**LLAMA3_8B, "ffn_hidden": None}).preset.values["ffn_hidden"] == 11008


@pytest.mark.parametrize("change, shard, key", [
    ({}, Shard(tensor=3), "tensor_parallel"),          # 16 heads
    ({"seq_len": 2047}, Shard(context=2), "context_parallel"),
])
def test_parallel_degrees_that_do_not_divide_the_model_are_rejected(change, shard, key):
    with pytest.raises(SpecError) as info:
        shard_model(build_model("gpt", **{**GPT, **change}), shard)
    assert info.value.key == key


def test_models_without_a_sharded_form_say_so():
    with pytest.raises(SpecError, match="modelled whole"):
        shard_model(build_model("vgg", depth=11), Shard(tensor=2))
