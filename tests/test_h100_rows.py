"""The H100 rows of the published suite state the hardware they ran on.

torchtitan's 2024 benchmark ran on Grand Teton H100s (HBM2e, 96 GB, 2.4 TB/s) at the default 500 W
power limit, whose bf16 peak its footnote 2 places between the SXM's and the NVL's. NVIDIA gives each
at its board power (989 TFLOP/s at 700 W, 835 at 400 W: torchtitan's ``get_peak_flops``); the
scenarios take the peak linear in board power between them, written out here.
"""

from __future__ import annotations

import pytest

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
