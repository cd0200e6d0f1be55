"""FP8 products in the runtime (``model.gemm_dtype: fp8``, ``runtime.model.fp8``): the quantiser
against its closed form (a tile's scale max|x|/448, a round trip within half an E4M3 step, exact
E4M3 values multiplied exactly), the three GEMMs against the dequantised products written out,
tiles that never straddle a tensor-parallel shard, FP8 where the simulator prices it and nowhere
else, a loss that FP8 moves and gradients that an ulp of the loss gradient moves by rounding
steps, and split runs against the unsplit FP8 model: pipeline (with split
backward and recompute), data (ZeRO-3 too), expert and expert-tensor parallelism within 1e-5
(fp32); tensor parallelism within FP8's rounding of a gradient whose last bits the split backward
changes (``test_tensor_parallelism_...``).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import SCENARIOS, assert_matches_unsplit, spawn_checked  # noqa: E402
from sim.core.errors import DappleError  # noqa: E402

GPT = str(SCENARIOS / "gpt_tiny_cpu.yaml")  # 4 blocks, hidden 64, ffn 256, seq 32; PP 2 on 2 devices
MOE = str(SCENARIOS / "moe_tiny_cpu.yaml")  # llama, 2 blocks of 4 routed experts and a shared one; EP 2
FP8 = {"model.gemm_dtype": "fp8", "cluster.device.peak_fp8_flops": "100GFLOP/s"}
TIED = {**FP8, "model.tied_embeddings": "true"}  # the gpt preset as shipped
ONE_STAGE = "[{layers: [0, 6], devices: [0, 1]}]"


def test_a_tiles_scale_is_its_max_over_448_and_values_round_trip_within_half_an_e4m3_step():
    from runtime.model.fp8 import dequantize_rows, quantize_blocks, quantize_rows, tile_bounds

    g = torch.Generator().manual_seed(0)
    x = (torch.rand(3, 200, generator=g) + 0.5) * torch.sign(torch.randn(3, 200, generator=g))  # |x| in [0.5, 1.5)
    x[1, 150] = -9.0  # one outlier spoils its own tile (row 1, columns 128-199) only
    cols = tile_bounds(200, 200)
    assert cols == ((0, 128), (128, 200))
    q, scales = quantize_rows(x, cols)
    assert q.dtype == torch.float8_e4m3fn and scales.shape == (3, 2)
    for m in range(3):
        for j, (c0, c1) in enumerate(cols):
            assert scales[m, j] == x[m, c0:c1].abs().max() / 448
    assert scales[1, 1] == 9.0 / 448 and q[1, 150].float() == -448.0  # the tile's max maps to E4M3's largest
    back = dequantize_rows(q, scales, cols)
    normal = x.abs() / scales.repeat_interleave(torch.tensor([128, 72]), dim=1) >= 2.0 ** -6  # E4M3's normal range
    assert ((back - x).abs() <= 2.0 ** -4 * x.abs())[normal].all()  # 3 mantissa bits: half of a 2^-3 step
    w = torch.zeros(4, 6)
    w[0, 0], w[3, 5] = 2.0, -5.0
    _, blocks = quantize_blocks(w, ((0, 2), (2, 4)), ((0, 3), (3, 6)))
    expected = torch.tensor([[2.0 / 448, 1.0], [1.0, 5.0 / 448]])  # a zero block keeps scale 1
    assert torch.equal(blocks, expected)  # fp32 division, as the quantiser's


def test_exact_e4m3_values_multiply_exactly():
    from runtime.model.fp8 import Fp8Product

    # integers in [-7, 7] with a 7 in every tile: scale 7/448 = 2^-6, 64·x an E4M3 value, sums exact in fp32
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-7, 8, (5, 256), generator=g).float()
    w = torch.randint(-7, 8, (130, 256), generator=g).float()
    x[:, 0], x[:, 128] = 7.0, -7.0
    for r in (0, 128):
        w[r, 0], w[r, 128] = 7.0, 7.0
    assert torch.equal(Fp8Product.apply(x, w, 130, 256), x @ w.T)


def _blocks(w, rows, cols):
    """Each element of ``w`` quantised by its block's max/448, dequantised, written out block by block."""
    out = torch.empty_like(w)
    for r0, r1 in rows:
        for c0, c1 in cols:
            s = w[r0:r1, c0:c1].abs().max() / 448
            out[r0:r1, c0:c1] = (w[r0:r1, c0:c1] / s).to(torch.float8_e4m3fn).float() * s
    return out


def _tokens(x, cols):
    """``x`` quantised per token and per column tile, dequantised."""
    return torch.cat([(x[:, c0:c1] / (s := x[:, c0:c1].abs().amax(1, keepdim=True) / 448)).to(torch.float8_e4m3fn)
                      .float() * s for c0, c1 in cols], dim=1)


def test_the_three_gemms_are_the_dequantised_products_written_out():
    from runtime.model.fp8 import Fp8Product

    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 200, generator=g, requires_grad=True)
    w = (0.05 * torch.randn(72, 200, generator=g)).requires_grad_()
    k_tiles, n_tiles = ((0, 100), (100, 200)), ((0, 36), (36, 72))  # K in 2 parts of 100, N in 2 of 36
    y = Fp8Product.apply(x, w, 36, 100)
    xd, wd = _tokens(x.detach(), k_tiles), _blocks(w.detach(), n_tiles, k_tiles)
    assert torch.allclose(y, xd @ wd.T, rtol=1e-5, atol=1e-6)                  # Fprop
    assert not torch.allclose(y, x @ w.T, rtol=1e-3)                           # and it is not the fp32 product
    dy = torch.randn(6, 72, generator=g)
    y.backward(dy)
    dyd = _tokens(dy, n_tiles)
    assert torch.allclose(x.grad, dyd @ wd, rtol=1e-5, atol=1e-6)             # Dgrad: dy 1×128, W's blocks
    assert torch.allclose(w.grad, dyd.T @ xd, rtol=1e-5, atol=1e-6)           # Wgrad: the same per-token operands


def test_tiles_never_straddle_a_tensor_parallel_shard():
    from runtime.model.fp8 import Fp8Linear, use_fp8
    from runtime.model.layers import TransformerBlock

    block = TransformerBlock(64, 4, 256)
    use_fp8(block, tensor_parallel=2)
    q, out, w1 = block.attention.q, block.attention.out, block.mlp.w1
    assert all(isinstance(m, Fp8Linear) for m in (q, out, w1, block.attention.k, block.attention.v, block.mlp.w2))
    assert (q.out_segment, q.in_segment, out.out_segment, out.in_segment, w1.out_segment) == (32, 64, 64, 32, 128)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 64, generator=g)
    with torch.no_grad():
        for m in (q, out):
            m.weight.normal_(0, 0.02, generator=g)
            m.bias.normal_(0, 0.02, generator=g)
        # column-parallel: each shard's outputs are the unsplit layer's, bit for bit
        shards = []
        for half in (slice(0, 32), slice(32, 64)):
            shard = Fp8Linear(64, 32, bias=True)
            shard.weight.copy_(q.weight[half])
            shard.bias.copy_(q.bias[half])
            shards.append(shard(x))
        assert torch.equal(torch.cat(shards, dim=-1), q(x))
        # row-parallel: the two shards' partial products sum to the unsplit product, bit for bit
        parts = []
        for half in (slice(0, 32), slice(32, 64)):
            shard = Fp8Linear(32, 64, bias=False)
            shard.weight.copy_(out.weight[:, half])
            parts.append(shard(x[..., half].contiguous()))
        assert torch.equal(parts[0] + parts[1] + out.bias, out(x))
        whole = TransformerBlock(64, 4, 256)
        use_fp8(whole)  # tiled as one part (64 wide): another quantisation than the shards'
        whole.attention.q.load_state_dict(q.state_dict())
        assert not torch.equal(whole.attention.q(x), q(x))


def test_fp8_runs_where_the_simulator_prices_it_and_nowhere_else():
    from runtime.model.config import load_runnable
    from runtime.model.fp8 import Fp8Linear
    from runtime.model.models import build_layers

    def fp8_names(path, overrides):
        layers = build_layers(load_runnable(path, overrides).model)
        return sorted(f"{k}.{name}" for k, layer in layers.items() for name, m in layer.named_modules()
                      if isinstance(m, Fp8Linear))

    gpt = fp8_names(GPT, TIED)
    assert gpt == sorted(f"{k}.{name}" for k in range(1, 5) for name in
                         ("attention.q", "attention.k", "attention.v", "attention.out", "mlp.w1", "mlp.w2"))
    moe = fp8_names(MOE, FP8)  # the experts (routed and shared) but not the router (§3.3.1's gating)
    assert "1.mlp.experts.3.w3" in moe and "1.mlp.shared.w2" in moe and not any("router" in n for n in moe)
    # the MTP module's block, not its projection
    mtp = fp8_names(GPT, {**TIED, "model.mtp_depth": "1",
                          "plan.stages": "[{layers: [0, 3], devices: [0]}, {layers: [3, 7], devices: [1]}]"})
    assert "5.depths.0.block.mlp.w1" in mtp and not any("proj" in n for n in mtp)
    assert fp8_names(GPT, {}) == []


def _step(overrides, nudge):
    """The loss and every gradient of the unsplit gpt (tied) on 2 samples, the logits' gradient
    times (1 + ``nudge``·noise)."""
    from runtime.model.config import load_runnable
    from runtime.model.models import synthetic_batch, whole_model

    config = load_runnable(GPT, {"model.tied_embeddings": "true", **overrides}).model
    model, (x, labels) = whole_model(config), synthetic_batch(config, 2, step=0)
    head, noise = model.layers["5"], torch.Generator().manual_seed(5)
    logits = head.logits

    def nudged(z):
        out = logits(z)
        out.register_hook(lambda g: g * (1 + nudge * torch.randn(g.shape, generator=noise)))
        return out

    head.logits = nudged
    loss = model(x, labels)
    loss.backward()
    return float(loss.detach()), {name: p.grad for name, p in model.named_parameters()}


def _moved(a: dict, b: dict) -> float:
    """The largest max|a - b| of a tensor over its max|a| (at least 1e-3 of the largest: grad_check's floor)."""
    floor = 1e-3 * max(float(g.abs().max()) for g in a.values())
    return max(float((a[n] - b[n]).abs().max()) / max(float(a[n].abs().max()), floor) for n in a)


@pytest.mark.slow
def test_fp8_moves_the_loss_and_turns_an_ulp_of_the_loss_gradient_into_rounding_steps():
    (fp32_loss, fp32), (_, fp32_nudged) = _step({}, 0.0), _step({}, 2.0 ** -23)
    (fp8_loss, fp8), (_, fp8_nudged) = _step(FP8, 0.0), _step(FP8, 2.0 ** -23)
    assert fp8_loss != pytest.approx(fp32_loss, rel=1e-6)  # FP8 is on: the products' rounding shows
    assert fp8_loss == pytest.approx(fp32_loss, rel=1e-2)  # and it is rounding, not another model
    assert 1e-4 < _moved(fp32, fp8) < 0.2
    # why tensor parallelism matches only within FP8's rounding: its backward differs from the unsplit
    # one in the last bits (vocabulary-parallel cross-entropy, partial sums), and E4M3's rounding of dy
    # turns that into whole steps: an ulp of noise on the logits' gradient moves fp32's gradients by
    # about 1e-6 of a tensor's largest, FP8's by about 1e-2
    assert _moved(fp32, fp32_nudged) < 1e-5
    assert _moved(fp8, fp8_nudged) > 1e-4


def test_fp8_activations_are_refused_in_one_line_naming_the_missing_dtype():
    from runtime.model.config import load_runnable

    with pytest.raises(DappleError) as caught:
        load_runnable(GPT, {**FP8, "model.fp8_activations": "true"})
    assert "torch has no E5M6 dtype" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.dist
def test_pipeline_parallelism_with_fp8_matches_the_unsplit_fp8_model():
    # gpt tied (as shipped), PP 2: the embedding's and the head's copies on two stages
    assert_matches_unsplit(spawn_checked(GPT, 2, {"pp2": TIED})["pp2"])


@pytest.mark.slow
def test_split_backward_recompute_llama_mla_and_mtp_with_fp8_match_the_unsplit_fp8_model():
    # zb-h1 runs each product's backward twice (I, then W from the kept graph); recompute runs the
    # forward again (full) or a region of it (selective, selective-op: SAC re-runs _scaled_mm)
    cases = {"zb-h1": {**TIED, "plan.schedule": "zb-h1"}, "full": {**TIED, "plan.recompute": "true"},
             "selective": {**TIED, "plan.recompute": "selective"},
             "selective-op": {**TIED, "plan.recompute": "selective-op"},
             "llama-1f1b": {**TIED, "model.preset": "llama", "plan.schedule": "1f1b"},
             # MLA's projections (under its checkpointed up-projections) and the MTP module's block
             "mla": {**TIED, "model.attention": "flash", "model.mla": "{q_lora_rank: 24, kv_lora_rank: 16, "
                     "rope_head_dim: 8, nope_head_dim: 16, v_head_dim: 12}"},
             "mtp": {**TIED, "model.mtp_depth": "1",
                     "plan.stages": "[{layers: [0, 3], devices: [0]}, {layers: [3, 7], devices: [1]}]"}}
    for summary in spawn_checked(GPT, 2, cases).values():
        assert_matches_unsplit(summary)


@pytest.mark.slow
def test_data_and_expert_parallelism_with_fp8_match_the_unsplit_fp8_model():
    # per-token tiles and a Wgrad from per-token operands: a token's contribution whatever the grouping
    for summary in spawn_checked(GPT, 2, {"dp2": {**TIED, "plan.stages": ONE_STAGE},
                                          "dp2-fsdp": {**TIED, "plan.stages": ONE_STAGE, "plan.sharding": "full"}}).values():
        assert_matches_unsplit(summary)
    for summary in spawn_checked(MOE, 2, {"ep2": FP8, "ep1-etp2": {**FP8, "plan.expert_parallel": "1",
                                                                     "plan.expert_tensor_parallel": "2"}}).values():
        assert_matches_unsplit(summary)


@pytest.mark.slow
def test_tensor_parallelism_with_fp8_matches_the_unsplit_fp8_model_within_fp8s_rounding():
    # The forward is the unsplit model's bit for bit (the loss within 1e-5; shards tile as the unsplit
    # layer: test_tiles_never_straddle_a_tensor_parallel_shard), but the backward's last bits differ
    # (the vocabulary-parallel cross-entropy, partial input gradients summed in another order), and
    # quantising dy to E4M3 turns a last-bit difference at a rounding boundary into a step of 2^-3 of
    # that element (test_fp8_moves_the_loss_and_turns_an_ulp_...): measured 1.1e-2 (gpt) and 1.3e-3
    # (llama) of a tensor's largest gradient, and 2e-6 with dy left unquantised. So the bound is FP8's.
    tp2 = {"plan.tensor_parallel": "2", "plan.stages": ONE_STAGE}
    cases = {"tp2-sp": {**TIED, **tp2, "plan.sequence_parallel": "true"}, "tp2": {**TIED, **tp2},
             "llama-tp2": {**TIED, **tp2, "model.preset": "llama", "model.kv_heads": "2"}}
    four = {"cluster.devices_per_node": "4", "plan.stages": "[{layers: [0, 6], devices: [0, 1, 2, 3]}]"}
    summaries = {**spawn_checked(GPT, 2, cases),  # and FSDP2 over TP's DTensors (2D), ZeRO-1 beside TP
                 **spawn_checked(GPT, 4, {"tp2-dp2-fsdp-sp": {**TIED, **tp2, **four, "plan.sequence_parallel": "true",
                                                              "plan.sharding": "full"},
                                          "tp2-dp2-zero1": {**TIED, **tp2, **four, "plan.sharding": "optimizer"}})}
    for name, summary in summaries.items():
        assert summary["loss"] == pytest.approx(summary["reference_loss"], rel=1e-5), name
        assert summary["max_rel_grad_diff"] <= 5e-2, (name, summary["worst_grad"])
        assert summary["grad_rtol"] == 2.0 ** -3 and summary["check_passed"], name  # --check allows one E4M3 step


def test_the_check_allows_one_e4m3_step_only_for_fp8_under_tensor_parallelism():
    from dataclasses import replace

    from runtime.model.config import load_runnable
    from runtime.model.fp8 import check_rtol

    fp8 = load_runnable(GPT, {**FP8, "plan.tensor_parallel": "2", "plan.stages": ONE_STAGE}).model
    assert check_rtol(fp8, 1e-5) == 0.125                              # 2^-3: E4M3's 3 mantissa bits
    assert check_rtol(replace(fp8, tensor_parallel=1), 1e-5) == 1e-5   # no TP: the per-token arithmetic is exact
    assert check_rtol(replace(fp8, gemm_dtype=None), 1e-5) == 1e-5     # no FP8: fp32's rounding only
