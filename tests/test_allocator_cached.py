"""Eager cross-entropy's freed 16-bit logits stay reserved at the head backward's peak
(``sim.cost.reserved.eager_logits_cached_bytes``, ``LayerSpec.allocator_cached_bytes``).

torchtitan's step frees the head's bf16 logits before the backward (``del pred``); the backward's
first requests are fp32 logit tensors twice their size, which PyTorch's best-fit allocator cannot
serve from that block, so it stays reserved beside them. The published suite's ``peak_memory``
(reserved bytes) adds it: ``peak · (1 + FRAGMENTATION_FRACTION) + tokens · V · 2``.
"""

from __future__ import annotations

import pytest

from sim.app.published import read_suite, run_suite
from sim.cost.reserved import FRAGMENTATION_FRACTION, eager_logits_cached_bytes
from sim.engine.run import run_scenario
from sim.input.scenario import load_scenario
from sim.models import build_model

LLAMA = dict(layers=2, hidden=256, heads=8, kv_heads=2, seq_len=128, vocab=512, dtype="bf16")

SCENARIO = """
cluster: {preset: dgx-h100, nodes: 1}
model: {preset: llama, layers: 2, hidden: 256, heads: 8, kv_heads: 2, seq_len: 128, vocab: 512, dtype: bf16,
        kernels: KERNELS, attention: sdpa}
training: {global_batch_size: 16, microbatch_size: 16}
plan: {schedule: 1f1b, sharding: full, pipeline_parallel: 1, data_parallel: 8}
"""


def test_the_cached_block_is_the_16_bit_logits():
    # torchtitan's Table 1 run: 2 x 8192 tokens, vocabulary 128,256, bf16
    assert eager_logits_cached_bytes(2 * 8192, 128_256, 2) == 4_202_692_608
    eager = build_model("llama", attention="flash", kernels="eager", **LLAMA)
    fused = build_model("llama", attention="flash", kernels="fused", **LLAMA)
    assert eager.layers[-1].allocator_cached_bytes == 128 * 512 * 2  # per sample
    assert fused.layers[-1].allocator_cached_bytes == 0.0
    assert all(layer.allocator_cached_bytes == 0.0 for layer in eager.layers[:-1])


@pytest.mark.parametrize("kernels", ["eager", "fused"])
def test_the_reserved_peak_adds_the_block_on_the_device_holding_the_eager_head(tmp_path, kernels):
    scenario_file = tmp_path / "s.yaml"
    scenario_file.write_text(SCENARIO.replace("KERNELS", kernels))
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"""
sources: {{t: 'torchtitan'}}
rows:
  - {{scenario: {scenario_file}, metric: peak_memory, published: 1GiB, source: t, table: T, row: r}}
""")
    (result,) = run_suite(read_suite(suite))
    peak = run_scenario(load_scenario(scenario_file), engine="fast").summarize().peak_memory_bytes
    samples = 16 // 8  # each of the 8 replicas' slice of the micro-batch
    cached = 128 * 512 * 2 * samples if kernels == "eager" else 0.0
    assert result.predicted == pytest.approx(peak * (1 + FRAGMENTATION_FRACTION) + cached, rel=1e-12)
