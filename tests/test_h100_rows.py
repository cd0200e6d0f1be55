"""The H100 rows of the published suite state the hardware they ran on.

torchtitan's 2024 benchmark ran on Grand Teton H100s (HBM2e, 96 GB, 2.4 TB/s) at the default 500 W
power limit, whose bf16 peak its footnote 2 places between the SXM's and the NVL's. NVIDIA gives each
at its board power (989 TFLOP/s at 700 W, 835 at 400 W: torchtitan's ``get_peak_flops``); the
scenarios take the peak linear in board power between them, written out here.
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
