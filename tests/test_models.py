"""Built-in model generators: published parameter counts, closed-form FLOPs and bytes, errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.errors import SpecError
from sim.core.specs import DTYPE_BYTES
from sim.models import MODEL_PRESETS, PRESET_PARAMS, REQUIRED, build_model, model_flop_per_sample

GPT2_SMALL = dict(layers=12, hidden=768, heads=12, seq_len=1024, vocab=50257, tied_embeddings=True)
BERT_LARGE = dict(layers=24, hidden=1024, heads=16, seq_len=512, vocab=30522)


def _param_count(model) -> float:
    return model.param_bytes() / DTYPE_BYTES[model.dtype]


def _layer(model, name):
    return next(layer for layer in model.layers if layer.name == name)


# --- published parameter counts -----------------------------------------------------------


def test_gpt2_small_has_124m_parameters():
    count = _param_count(build_model("gpt", **GPT2_SMALL))
    assert count == pytest.approx(124e6, rel=0.01)
    # HF GPT2Model's 124,439,808 (position embeddings included, head tied) plus the 47 rows that
    # pad 50,257 to 50,304, a multiple of 128 (Megatron-LM's --make-vocab-size-divisible-by)
    assert count == 124_439_808 + 768 * (50_304 - 50_257)


def test_untied_gpt_head_holds_the_vocabulary_projection():
    tied = _param_count(build_model("gpt", **GPT2_SMALL))
    untied = _param_count(build_model("gpt", **{**GPT2_SMALL, "tied_embeddings": False}))
    assert untied - tied == 768 * 50304  # the padded vocabulary (sim.models.vocab)


def test_bert_large_has_335m_parameters():
    assert _param_count(build_model("bert", **BERT_LARGE)) == pytest.approx(335e6, rel=0.02)


def test_vgg16_and_vgg19_parameter_counts_are_exact():
    assert _param_count(build_model("vgg", depth=16)) == 138_357_544
    assert _param_count(build_model("vgg", depth=19)) == 143_667_240
    assert _param_count(build_model("vgg", depth=16, batch_norm=True)) == 138_365_992  # torchvision vgg16_bn


def test_vgg16_layer_order_follows_configuration_d():
    names = [layer.name for layer in build_model("vgg").layers]
    assert names[:3] == ["conv1_1", "conv1_2", "pool1"]
    assert names[-4:] == ["pool5", "fc6", "fc7", "fc8"]
    assert sum(name.startswith("conv") for name in names) == 13
    assert sum(name.startswith("fc") for name in names) == 3


# --- closed forms ------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["gpt", "bert"])
def test_block_flops_and_activation_bytes_match_the_papers(preset):
    s, h, a = 512, 1024, 16
    model = build_model(preset, layers=2, hidden=h, heads=a, seq_len=s, vocab=1000, dtype="fp16")
    block = _layer(model, "block_1")
    assert block.fwd_flop == 24 * s * h**2 + 4 * s**2 * h  # Narayanan et al. SC'21 §5.1
    assert block.bwd_flop == 2 * block.fwd_flop
    assert block.stash_bytes == pytest.approx(s * h * (34 + 5 * a * s / h), rel=1e-12)  # Korthikanti Eq. 1
    assert block.param_bytes == 2 * (12 * h**2 + 13 * h)
    assert block.output_bytes == s * h * 2
    assert block.wgrad_fraction == 0.5


def test_block_generalises_to_ffn_width_and_fp32():
    s, h, a, f, d = 128, 256, 4, 1000, 4
    model = build_model("gpt", layers=1, hidden=h, heads=a, seq_len=s, vocab=100, ffn_hidden=f, dtype="fp32")
    block = _layer(model, "block_0")
    assert block.fwd_flop == 8 * s * h**2 + 4 * s**2 * h + 4 * s * h * f
    assert block.param_bytes == d * (4 * h**2 + 4 * h + 2 * h * f + f + h + 4 * h)
    assert block.stash_bytes == (8 * d + 2) * s * h + 2 * d * s * f + (2 * d + 1) * a * s**2


def test_gpt_model_flops_match_narayanan_total():
    s, h, n, v = 1024, 2048, 24, 50000
    model = build_model("gpt", layers=n, hidden=h, heads=16, seq_len=s, vocab=v)
    padded = 50048  # 50,000 padded to a multiple of 128 (sim.models.vocab)
    expected = 72 * s * n * h**2 * (1 + s / (6 * h) + padded / (12 * h * n))  # §5.1, B = 1, no recompute
    embedding = _layer(model, "embedding")
    assert model_flop_per_sample(model) - embedding.fwd_flop - embedding.bwd_flop == pytest.approx(expected, rel=1e-12)


def test_gpt_head_stashes_fp32_logits():
    s, h, v = 256, 512, 1000
    head = _layer(build_model("gpt", layers=1, hidden=h, heads=8, seq_len=s, vocab=v), "head")
    v = 1024  # 1,000 padded to a multiple of 128 (sim.models.vocab)
    assert head.fwd_flop == 2 * s * h * v
    assert head.stash_bytes == 4 * s * h * (1 + v / h)  # Korthikanti §4.3 output layer
    assert head.output_bytes == 0


def test_vgg_conv_and_pool_closed_forms():
    model = build_model("vgg", depth=16, image_size=224, dtype="fp32")
    conv = _layer(model, "conv1_2")  # 64 -> 64 channels at 224×224
    assert conv.fwd_flop == 2 * 9 * 64 * 64 * 224 * 224
    assert conv.bwd_flop == 2 * conv.fwd_flop
    assert conv.param_bytes == 4 * (9 * 64 * 64 + 64)
    assert conv.output_bytes == 4 * 64 * 224 * 224
    assert conv.stash_bytes == 4 * 64 * 224 * 224 + 1 * 64 * 224 * 224  # input + ReLU mask
    pool = _layer(model, "pool1")
    assert pool.param_bytes == 0 and pool.bwd_flop == pool.fwd_flop
    assert pool.output_bytes == 4 * 64 * 112 * 112
    assert _layer(model, "fc6").fwd_flop == 2 * 512 * 7 * 7 * 4096
    assert model.boundary_bytes[0] == 3 * 224 * 224 * 4


def test_vgg16_forward_is_about_15_5_gmacs():
    forward = sum(layer.fwd_flop for layer in build_model("vgg").layers)
    assert forward / 2 == pytest.approx(15.5e9, rel=0.01)  # the commonly quoted 15.5 GMAC


def test_mlp_closed_forms():
    model = build_model("mlp", layers=3, hidden=64, input_size=20, num_classes=5)
    assert [layer.name for layer in model.layers] == ["linear_0", "linear_1", "linear_2", "head"]
    first, head = model.layers[0], model.layers[-1]
    assert first.fwd_flop == 2 * 20 * 64 and first.bwd_flop == 2 * first.fwd_flop
    assert first.param_bytes == 4 * (20 * 64 + 64)
    assert first.stash_bytes == 4 * 20 + 64
    assert first.output_bytes == 4 * 64
    assert head.param_bytes == 4 * (64 * 5 + 5)
    assert model.boundary_bytes[0] == 4 * 20


def test_model_flop_per_sample_sums_forward_and_backward():
    model = build_model("mlp", layers=2, hidden=8)
    assert model_flop_per_sample(model) == sum(3 * 2 * a * b for a, b in [(8, 8), (8, 8), (8, 10)])


# --- structure of every preset ------------------------------------------------------------

SMALL = {
    "gpt": dict(layers=3, hidden=64, heads=4, seq_len=32, vocab=100),
    "bert": dict(layers=3, hidden=64, heads=4, seq_len=32, vocab=100),
    "llama": dict(layers=2, hidden=64, heads=4, kv_heads=2, seq_len=32, vocab=100),
    "vgg": dict(depth=11, image_size=64, num_classes=10),
    "mlp": dict(layers=3, hidden=16),
}


def _check_chain(model):
    bounds = model.boundary_bytes
    assert len(bounds) == model.num_layers + 1
    assert bounds[-1] == 0
    for k in range(1, model.num_layers):
        assert bounds[k] == model.layers[k - 1].output_bytes
    for layer in model.layers:
        assert layer.fwd_s is None and layer.bwd_s is None
        assert layer.fwd_flop > 0 and layer.bwd_flop > 0


@pytest.mark.parametrize("preset", sorted(MODEL_PRESETS))
def test_boundaries_form_a_chain(preset):
    _check_chain(build_model(preset, **SMALL[preset]))


def test_transformer_input_boundary_is_token_ids():
    assert build_model("gpt", **SMALL["gpt"]).boundary_bytes[0] == 32 * 8  # int64 ids
    assert build_model("bert", **SMALL["bert"]).boundary_bytes[0] == 2 * 32 * 8  # ids + token types


@pytest.mark.parametrize("preset", sorted(MODEL_PRESETS))
def test_required_params_alone_build_and_defaults_apply(preset):
    required = {k: SMALL[preset][k] for k, v in PRESET_PARAMS[preset].items() if v is REQUIRED}
    model = build_model(preset, **required)
    assert model.dtype == PRESET_PARAMS[preset]["dtype"]
    assert model.optimizer == PRESET_PARAMS[preset]["optimizer"]
    assert model.source.startswith(f"preset {preset} (")
    assert build_model(preset, **required) == model  # deterministic


def test_names_and_sources():
    model = build_model("gpt", layers=48, hidden=1024, heads=16, seq_len=512, vocab=30522)
    assert model.name == "gpt-48x1024"
    assert model.source.startswith(
        "preset gpt (layers=48, hidden=1024, heads=16, seq_len=512, vocab=30522, ffn_hidden=4096"
    )
    assert [layer.name for layer in model.layers][:2] == ["embedding", "block_0"]
    assert model.layers[-1].name == "head"
    assert build_model("vgg", depth=19).name == "vgg-19"


def test_default_dtypes_and_optimizers():
    assert build_model("gpt", **SMALL["gpt"]).dtype == "fp16"
    assert build_model("vgg").optimizer == "momentum"
    assert build_model("mlp", **SMALL["mlp"]).optimizer == "adam"


@settings(max_examples=40, deadline=None)
@given(
    layers=st.integers(1, 4),
    head_dim=st.integers(1, 16),
    heads=st.integers(1, 8),
    seq_len=st.integers(1, 64),
    vocab=st.integers(1, 500),
    dtype=st.sampled_from(sorted(DTYPE_BYTES)),
    preset=st.sampled_from(["gpt", "bert"]),
)
def test_any_valid_transformer_is_a_consistent_chain(layers, head_dim, heads, seq_len, vocab, dtype, preset):
    model = build_model(
        preset, layers=layers, hidden=head_dim * heads, heads=heads, seq_len=seq_len, vocab=vocab, dtype=dtype
    )
    assert model.num_layers == layers + 2
    _check_chain(model)


# --- errors -------------------------------------------------------------------------------


def _error(preset, **params) -> SpecError:
    with pytest.raises(SpecError) as info:
        build_model(preset, **params)
    return info.value


def test_unknown_preset_lists_valid_names():
    error = _error("resnet")
    assert error.key == "preset"
    assert "bert, gpt, llama, mlp, vgg" in error.problem


def test_unknown_param_is_named_with_the_valid_ones():
    error = _error("gpt", **SMALL["gpt"], hiden=4)
    assert error.key == "hiden"
    assert "hidden" in error.problem and "seq_len" in error.problem


def test_missing_required_param_is_named():
    params = dict(SMALL["gpt"])
    del params["vocab"]
    assert _error("gpt", **params).key == "vocab"


def test_heads_must_divide_hidden():
    error = _error("bert", **{**SMALL["bert"], "hidden": 1000, "heads": 12})
    assert error.key == "heads"
    assert "12 does not divide hidden 1000" in error.problem


@pytest.mark.parametrize(
    "key,value", [("layers", 0), ("hidden", -8), ("seq_len", 2.5), ("vocab", True), ("layers", None)]
)
def test_non_positive_or_non_integer_sizes_are_rejected(key, value):
    error = _error("gpt", **{**SMALL["gpt"], key: value})
    assert error.key == key


@pytest.mark.parametrize(
    "preset,key,value",
    [
        ("vgg", "depth", 17),
        ("vgg", "image_size", 100),
        ("vgg", "num_classes", 0),
        ("vgg", "batch_norm", "no"),
        ("mlp", "dtype", "fp8"),
        ("mlp", "optimizer", "lamb"),
        ("gpt", "ffn_hidden", 0),
    ],
)
def test_invalid_values_name_their_key(preset, key, value):
    assert _error(preset, **{**SMALL[preset], key: value}).key == key


def test_errors_are_value_errors():
    with pytest.raises(ValueError):
        build_model("vgg", depth=17)


def test_core_module_imports_neither_simpy_nor_torch():
    import sim.models

    source = open(sim.models.__file__, encoding="utf-8").read()
    assert "import simpy" not in source and "import torch" not in source
