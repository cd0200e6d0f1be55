"""Multi-head latent attention in the runtime: the layer against DeepSeek-V3's equations written
out, its parameters against the simulator's, its stash by kind against the simulator's
prediction, the simulator's refusal of tensor parallelism kept, and data and pipeline parallelism
(gpt tied, llama) training one step exactly like the unsplit model in one process (rtol 1e-5, fp32).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from conftest import SCENARIOS, assert_matches_unsplit, kinds_beside_prediction, spawn_checked  # noqa: E402
from sim.core.errors import DappleError  # noqa: E402

GPT = str(SCENARIOS / "gpt_tiny_cpu.yaml")  # 4 blocks, hidden 64, 4 heads, seq 32; PP 2 on 2 devices
MLA = {"model.attention": "flash",
       "model.mla": "{q_lora_rank: 24, kv_lora_rank: 16, rope_head_dim: 8, nope_head_dim: 16, v_head_dim: 12}"}
LLAMA = {"model.preset": "llama", "model.kv_heads": "2"}
DP2 = {"plan.stages": "[{layers: [0, 6], devices: [0, 1]}]"}
TWO_RANKS = {
    "gpt-tied-pp2": {**MLA, "model.tied_embeddings": "true"},
    "llama-dp2": {**MLA, **LLAMA, **DP2},
}


def _rotate_half(x, positions):
    """RoPE, rotate-half form (RoFormer §3.4.2, base 10000) on (..., s, d), written out."""
    d = x.shape[-1]
    inverse = 1.0 / 10000.0 ** (torch.arange(0, d, 2).float() / d)
    angles = torch.outer(positions.float(), inverse)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    return x * cos + torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1) * sin


def _equations(layer, h):
    """DeepSeek-V3 §2.1.1 eqs. 1–11 for (n, s, hidden) ``h``, head by head, with an explicit mask."""
    m, a = layer.mla, layer.heads
    n, s, _ = h.shape
    rms = lambda x, w: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w  # noqa: E731
    c_q = rms(h @ layer.wq_a.weight.T, layer.q_norm.weight)                        # eq. 6
    q = (c_q @ layer.wq_b.weight.T).view(n, s, a, m.nope_head_dim + m.rope_head_dim)  # eqs. 7-8
    down = h @ layer.wkv_a.weight.T
    c_kv, k_r = rms(down[..., :m.kv_lora_rank], layer.kv_norm.weight), down[..., m.kv_lora_rank:]  # eqs. 1, 3
    up = (c_kv @ layer.wkv_b.weight.T).view(n, s, a, m.nope_head_dim + m.v_head_dim)  # eqs. 2, 5
    k_r = _rotate_half(k_r, torch.arange(s))                                         # eq. 3
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
    heads = []
    for i in range(a):
        q_i = torch.cat([q[:, :, i, :m.nope_head_dim], _rotate_half(q[:, :, i, m.nope_head_dim:], torch.arange(s))], -1)
        k_i = torch.cat([up[:, :, i, :m.nope_head_dim], k_r], -1)                  # eqs. 4, 9
        scores = (q_i @ k_i.transpose(1, 2)) / math.sqrt(m.nope_head_dim + m.rope_head_dim)
        heads.append(torch.softmax(scores.masked_fill(mask, float("-inf")), -1) @ up[:, :, i, m.nope_head_dim:])  # eq. 10
    return torch.cat(heads, -1) @ layer.wo.weight.T                                 # eq. 11


def test_latent_attention_is_deepseek_v3s_equations():
    from runtime.model.mla import LatentAttention
    from sim.core.mla import MlaSpec

    torch.manual_seed(0)
    layer = LatentAttention(32, 4, MlaSpec(q_lora_rank=12, kv_lora_rank=10, rope_head_dim=4, nope_head_dim=6,
                                           v_head_dim=5))
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.3)
    h = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)
    got = layer(h)
    with torch.no_grad():
        expected = _equations(layer, h)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6)
    got.square().sum().backward()  # through the checkpointed up-projections: every weight a gradient
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())


@pytest.mark.parametrize("preset", [{}, LLAMA], ids=["gpt", "llama"])
def test_an_mla_block_holds_the_simulators_parameter_bytes(preset):
    from runtime.model.config import load_runnable
    from runtime.model.models import build_layers, layer_param_bytes

    runnable = load_runnable(GPT, {**MLA, **preset})
    layers = build_layers(runnable.model)
    assert [layer_param_bytes(layers[k]) for k in range(6)] == [layer.param_bytes for layer in
                                                                 runnable.scenario.model.layers]
    # wq_a 64·24, q_norm 24, wq_b 24·4·24, wkv_a 64·24, kv_norm 16, wkv_b 16·4·28, wo 48·64; 4 bytes each
    attention = layers[1].attention
    assert sum(p.numel() for p in attention.parameters()) == 64 * 24 + 24 + 24 * 96 + 64 * 24 + 16 + 16 * 112 + 48 * 64


def test_tensor_parallelism_with_mla_is_refused_in_the_simulators_words():
    from runtime.model.config import load_runnable

    with pytest.raises(DappleError) as caught:
        load_runnable(GPT, {**MLA, "plan.tensor_parallel": "2", **DP2})
    assert "model.mla is modelled without tensor or context parallelism" in str(caught.value)
    assert "\n" not in str(caught.value)



def _spawn(nproc: int, cases: dict):
    return spawn_checked(GPT, nproc, cases)


@pytest.fixture(scope="module")
def two_ranks():
    return _spawn(2, TWO_RANKS)


@pytest.mark.dist
@pytest.mark.parametrize("name", sorted(TWO_RANKS))
def test_mla_with_data_or_pipeline_parallelism_matches_the_unsplit_model(two_ranks, name):
    assert_matches_unsplit(two_ranks[name])


@pytest.mark.dist
def test_mla_states_and_stash_are_counted_by_kind_as_the_simulator_predicts(two_ranks):
    # parameters, gradients and Adam's states exactly; gpt's activations (the latents, not the
    # queries, keys and values: DeepSeek-V3 §3.2.3's recompute) within 10% (measured -4%, as its
    # multi-head attention's -3%). Llama's are not compared: with multi-head attention too the
    # runtime keeps about 38% more than the simulator counts (rotary's and SwiGLU's intermediates)
    for name, overrides in TWO_RANKS.items():
        for kinds, expected in kinds_beside_prediction(GPT, overrides, two_ranks[name]):
            assert kinds["parameters"] == pytest.approx(expected.parameters, rel=1e-6)
            assert kinds["gradients"] == pytest.approx(expected.gradients, rel=1e-6)
            assert kinds["optimizer"] == pytest.approx(expected.optimizer, rel=1e-6)
            if name.startswith("gpt"):
                assert kinds["activations"] == pytest.approx(expected.activations, rel=0.10), name


@pytest.mark.slow
def test_mla_with_sharding_and_recompute_matches_the_unsplit_model():
    four = {**MLA, **LLAMA, "cluster.devices_per_node": "4",
            "plan.stages": "[{layers: [0, 3], devices: [0, 1]}, {layers: [3, 6], devices: [2, 3]}]"}
    cases = {"llama-pp2-dp2": four, "pp2-dp2-zero1": {**four, "plan.sharding": "optimizer"}, "pp2-dp2-fsdp": {**four, "plan.sharding": "full"},
             "pp2-dp2-recompute": {**four, "plan.recompute": "true"},
             "pp2-dp2-selective": {**four, "plan.recompute": "selective"},
             "gpt-tied-dp4-fsdp": {**MLA, "model.tied_embeddings": "true", "cluster.devices_per_node": "4",
                                   "plan.stages": "[{layers: [0, 6], devices: [0, 1, 2, 3]}]",
                                   "plan.sharding": "full"}}
    for name, summary in _spawn(4, cases).items():
        assert summary["check_passed"], name
        assert_matches_unsplit(summary)
