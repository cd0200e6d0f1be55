"""The H100 rows of the published suite state the hardware they ran on.

torchtitan's 2024 benchmark ran on Grand Teton H100s (HBM2e, 96 GB, 2.4 TB/s) at the default 500 W
power limit, whose bf16 peak its footnote 2 places between the SXM's and the NVL's. NVIDIA gives each
at its board power (989 TFLOP/s at 700 W, 835 at 400 W: torchtitan's ``get_peak_flops``); the
scenarios take the peak linear in board power between them, written out here. The rows no issue names
(Llama 3's Table 4, Megatron-LM's weak-scaling table) are the configurations their sources print.
"""

from __future__ import annotations

import pytest

from sim.app.published import read_suite
from sim.input.scenario import load_scenario

SXM_PEAK, SXM_W = 989e12, 700.0  # NVIDIA H100 SXM: dense bf16 peak, board power
NVL_PEAK, NVL_W = 835e12, 400.0  # NVIDIA H100 NVL: dense bf16 peak, the top of its 350-400 W
TITAN_W = 500.0  # the benchmark's "default 500W power limit"


@pytest.mark.parametrize("gpus", [8, 128])
def test_the_torchtitan_h100s_peak_is_linear_in_board_power_between_nvl_and_sxm(gpus):
    device = load_scenario(f"scenarios/published/torchtitan2024_llama3_8b_{gpus}.yaml").cluster.device
    between = NVL_PEAK + (SXM_PEAK - NVL_PEAK) * (TITAN_W - NVL_W) / (SXM_W - NVL_W)
    assert between == pytest.approx(886.33e12, rel=1e-4)
    assert device.peak_flop_per_s == pytest.approx(between, rel=1e-3)  # written 886 TFLOP/s
    assert NVL_PEAK < device.peak_flop_per_s < SXM_PEAK
    assert device.power_w == TITAN_W
    assert device.memory_bandwidth_bytes_per_s == 2.4e12 and device.memory_bytes == 96e9


def test_the_llama3_row_is_table_4s_16k_configuration_on_700w_sxm_h100s():
    # Table 4 (16,384 GPUs, TP 8, CP 1, PP 16, 16M tokens a batch, 400 TFLOP/s): DP = 16,384 / (8 x 1 x 16)
    scenario = load_scenario("scenarios/published/llama3_2024_405b_16384.yaml")
    plan, cluster = scenario.plan, scenario.cluster
    assert cluster.num_devices == 16384 == 8 * 1 * 16 * 128
    pipeline = len(set(plan.stage_ranks))  # 16 ranks of 2 interleaved chunks each
    assert (plan.shard.tensor, plan.shard.context, pipeline, plan.num_replicas(0)) == (8, 1, 16, 128)
    # "16M" tokens: 2,048 sequences of 8,192 (2**24), 16 a data-parallel replica
    tokens = scenario.training.global_batch_size * scenario.model.preset.values["seq_len"]
    assert tokens == 2**24 and scenario.training.global_batch_size // plan.num_replicas(0) == 16
    # the Llama 3.1 model card's "H100-80GB (TDP of 700W)": the SXM preset as shipped, 989 TFLOP/s
    assert cluster.device.power_w == SXM_W and cluster.device.peak_flop_per_s == SXM_PEAK
    (row,) = [r for r in read_suite() if r.scenario.name == "llama3_2024_405b_16384.yaml"]
    assert row.metric == "model_tflops_per_gpu" and row.published == 400e12 and row.table == "Table 4"
    assert 400e12 / SXM_PEAK == pytest.approx(0.404, abs=1e-3)  # the table's "BF16 MFU" of about 41%


# Megatron-LM README at f2e5db4, weak-scaling table (Megatron-Core r0.8.0): size (B), layers, hidden, TP, PP,
# GPUs, batch, TFLOP/s per GPU, MFU (%)
MCORE_H100 = [(1.7, 24, 2048, 1, 1, 48, 192, 408.8, 41), (7.1, 30, 4096, 2, 1, 96, 192, 465.9, 47),
              (16, 32, 6144, 4, 1, 192, 192, 489.1, 49), (32, 48, 7168, 8, 1, 384, 192, 459.6, 46),
              (70, 84, 8192, 8, 2, 768, 384, 419.7, 42), (119, 92, 10240, 8, 4, 1536, 768, 420.5, 43),
              (177, 96, 12288, 8, 6, 2304, 1152, 432.8, 44), (314, 96, 16384, 8, 8, 3072, 1536, 474.4, 48),
              (462, 112, 18432, 8, 16, 6144, 3072, 459.9, 47)]


def test_the_megatron_core_h100_rows_are_the_readme_table():
    rows = {r.scenario.name: r for r in read_suite() if r.source.startswith("NVIDIA/Megatron-LM, README.md at f2e5db4")}
    assert len(rows) == len(MCORE_H100)
    for size, layers, hidden, tp, pp, gpus, batch, tflops, mfu in MCORE_H100:
        (row,) = [r for r in rows.values() if r.row.startswith(f"GPT {size:g}B, {gpus} H100")]
        scenario = load_scenario(row.scenario)
        values, plan = scenario.model.preset.values, scenario.plan
        assert (values["layers"], values["hidden"], values["ffn_hidden"]) == (layers, hidden, 4 * hidden)
        assert (values["vocab"], values["seq_len"], values["tied_embeddings"]) == (131072, 4096, False)
        assert (plan.shard.tensor, len(set(plan.stage_ranks)), plan.num_replicas(0)) == (tp, pp, 48)
        assert scenario.cluster.num_devices == gpus == tp * pp * 48 and scenario.training.global_batch_size == batch
        # an untied GPT: 12 l h^2 + 2 V h parameters is the table's size to its rounding (1.7B: 1.74; 32B: 31.5)
        assert (12 * layers * hidden**2 + 2 * 131072 * hidden) / 1e9 == pytest.approx(size, rel=0.03)
        assert row.metric == "megatron_tflops_per_gpu" and row.published == pytest.approx(tflops * 1e12)
        assert tflops / 989 == pytest.approx(mfu / 100, abs=0.006)  # the table's MFU: BF16 over 989 TFLOP/s
