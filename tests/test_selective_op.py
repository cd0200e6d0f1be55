"""torchtitan's op-level selective activation checkpointing (``recompute: selective-op``).

The policy (torchtitan 9dec370, ``parallelize_llama.py`` ``_save_list``): per block, keep the
input, the outputs of the 1st, 3rd, 5th and 7th ``aten.mm`` (wq, wv, w1, w2) and of the fused
attention (output and fp32 log-sum-exp); run everything else again in the backward. The stash
below is written out from those tensors' shapes; the extra backward time is the forward time of
the kernels the policy does not save, each written out as its own kernel.
"""

from __future__ import annotations

import pytest

from planner.search.costs import CostTables
from sim.app.cli import main
from sim.core.parallelism import Recompute, Shard
from sim.core.specs import DeviceSpec
from sim.cost import kernels as K
from sim.cost.action_memory import compute_memory
from sim.cost.compute import kernel_forward_s, kernel_time_s, op_recompute_s, stage_cost, stage_time_s
from sim.cost.memory import layer_stash_bytes, op_sac_stash_bytes
from sim.input.scenario import parse_scenario
from sim.models import build_model, shard_model
from sim.schedule.ir import ActionKind

PEAK = 1.0e15
GPU = DeviceSpec(name="gpu", memory_bytes=80e9, peak_flop_per_s=PEAK, peak_fp32_flop_per_s=PEAK / 16,
                 memory_bandwidth_bytes_per_s=3.0e12, efficiency=0.7, matmul_half_dim=64,
                 kernel_issue_s=10e-6, memory_efficiency=0.8, attention_efficiency=0.6,
                 attention_backward_efficiency=0.5, sdpa_efficiency=0.3, sdpa_backward_efficiency=0.25)
S, H, A, KV, F, E = 2048, 1024, 16, 4, 2816, 2  # sequence, hidden, heads, kv heads, SwiGLU width, bf16
H_KV = KV * H // A
LLAMA = dict(layers=2, hidden=H, heads=A, kv_heads=KV, ffn_hidden=F, seq_len=S, vocab=4096, dtype="bf16")


def _llama(**shard):
    model = build_model("llama", attention="sdpa", **LLAMA)
    return shard_model(model, Shard(**shard)) if shard else model


def _kernel(layer, name: str) -> K.KernelSpec:
    return next(k for k in layer.kernels if k.name == name)


def test_a_llama_block_keeps_its_input_wq_wv_w1_w2_and_the_attentions_output_and_lse():
    block = _llama().layers[1]
    saved = {
        "input": E * S * H, "wq": E * S * H, "wv": E * S * H_KV, "attention output": E * S * H,
        "log-sum-exp (fp32)": 4 * A * S, "w1": E * S * F, "w2": E * S * H,
    }
    assert op_sac_stash_bytes(block) == sum(saved.values())
    assert layer_stash_bytes(block, Recompute.SELECTIVE_OP) == E * S * (4 * H + H_KV + F) + 4 * A * S
    assert layer_stash_bytes(block, Recompute.SELECTIVE_OP) < layer_stash_bytes(block, Recompute.SELECTIVE)


def test_with_tensor_and_sequence_parallelism_the_shards_and_the_reduce_scatters_outputs_are_kept():
    t = 2
    block = _llama(tensor=t, sequence_parallel=True).layers[1]
    kept = (E * S * H / t + E * S * H / t + E * S * H_KV / t + E * S * H / t + 4 * A * S / t
            + E * S * F / t + E * S * H  # w2's row-parallel partial sum, whole
            + 2 * E * S * H / t)  # the outputs of wo's and w2's reduce-scatters
    assert op_sac_stash_bytes(block) == pytest.approx(kept)


def test_a_block_with_biases_saves_no_product():
    s, h, a = 1024, 512, 8
    block = build_model("gpt", attention="flash", layers=2, hidden=h, heads=a, seq_len=s, vocab=1000,
                        dtype="bf16").layers[1]
    assert op_sac_stash_bytes(block) == E * s * h + E * s * h + 4 * a * s  # input, attention output, lse
    assert all(k.sac_recompute is None for k in block.kernels if k.flop > 0 and not k.fused_attention)


def test_the_extra_backward_is_the_forward_of_every_kernel_it_does_not_save():
    model, n = _llama(), 2
    block = model.layers[1]
    again = sum(kernel_forward_s(_kernel(block, name), GPU, "bf16", n)
                for name in ("ln1", "rope_q", "rope_k", "proj", "residual1", "ln2", "swiglu", "residual2"))
    # the unsaved parts of the fused products, as torchtitan runs them: wk (h -> h_kv) and w3 (h -> f)
    again += kernel_time_s(2 * S * H * H_KV * n, E * (S * H + S * H_KV) * n + E * H * H_KV, GPU, "bf16",
                           (S * n, H_KV, H))
    again += kernel_time_s(2 * S * H * F * n, E * (S * H + S * F) * n + E * H * F, GPU, "bf16", (S * n, F, H))
    assert op_recompute_s(block, GPU, "bf16", n) == pytest.approx(again)
    none = stage_time_s(model, GPU, 1, 2, n, Recompute.NONE)
    op = stage_time_s(model, GPU, 1, 2, n, Recompute.SELECTIVE_OP)
    assert op.fwd_s == none.fwd_s and op.bwd_s - none.bwd_s == pytest.approx(again)


def test_layers_outside_the_blocks_are_not_checkpointed():
    model = _llama()
    for layer in (model.layers[0], model.layers[-1]):  # embedding and head
        assert layer_stash_bytes(layer, Recompute.SELECTIVE_OP) == layer.stash_bytes
        assert op_recompute_s(layer, GPU, "bf16", 2) == 0.0


def test_the_backward_rebuilds_the_rest_of_one_blocks_stash_and_frees_it_all():
    model, n = _llama(), 2
    block = model.layers[1]
    cost = stage_cost(model, GPU, 0, 4, n, recompute=Recompute.SELECTIVE_OP)
    kept = sum(layer_stash_bytes(layer, Recompute.SELECTIVE_OP) for layer in model.layers) * n
    assert cost.stash_bytes == pytest.approx(kept)
    assert cost.rebuilt_bytes == pytest.approx((block.stash_bytes - op_sac_stash_bytes(block)) * n)
    assert compute_memory(ActionKind.F, cost, False) == (cost.stash_bytes, 0.0)
    assert compute_memory(ActionKind.B, cost, False) == pytest.approx(
        (cost.rebuilt_bytes, cost.stash_bytes + cost.rebuilt_bytes))


SCENARIO = """
cluster: {{preset: dgx-h100, nodes: 1}}
model: {{preset: llama, layers: 2, hidden: 256, heads: 4, seq_len: 128, vocab: 1000}}
training: {{global_batch_size: 8, microbatch_size: 8}}
plan:
  recompute: {recompute}
  stages:
  - {{layers: [0, 4], devices: [0]}}
"""


def test_the_plan_key_reads_selective_op_and_the_planner_tables_agree():
    scenario = parse_scenario(SCENARIO.format(recompute="selective-op"))
    assert scenario.plan.recompute is Recompute.SELECTIVE_OP and scenario.plan.recompute.to_json() == "selective-op"
    tables = CostTables(scenario)
    model, device = shard_model(scenario.model, Shard()), scenario.cluster.device
    time = stage_time_s(model, device, 0, 4, 8, Recompute.SELECTIVE_OP)
    assert tables.compute_s(0, 4, 8, Recompute.SELECTIVE_OP) == pytest.approx((time.fwd_s, time.bwd_s))
    assert tables.stash_bytes(0, 4, 8, recompute=Recompute.SELECTIVE_OP) == pytest.approx(
        stage_cost(model, device, 0, 4, 8, recompute=Recompute.SELECTIVE_OP).stash_bytes)


def test_a_bad_recompute_is_one_line_listing_the_modes(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(SCENARIO.format(recompute="sometimes"))
    assert main(["check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "plan.recompute" in err and "none, selective, selective-op, full" in err and "'sometimes'" in err
