"""The H100's bf16 matrix efficiency, tied to the A100's by a measured ratio (issues 29 and 31).

``sim.input.presets.MAMF_BF16`` holds one benchmark's largest bf16 matmul rate on the A100 SXM and
the H100 SXM (ml-engineering's MAMF table); ``mamf_efficiency`` divides the kernel model's size
curve out of each. The H100-class presets' e_max is the A100's times their ratio, written out here.
"""

from __future__ import annotations

import pytest

from sim.cost.compute import kernel_time_s
from sim.input.presets import A100_EFFICIENCY, DEVICE_PRESETS, H100_EFFICIENCY, MAMF_BF16, mamf_efficiency
from sim.input.scenario import parse_scenario

_CLUSTER = """
cluster: {{preset: {preset}, nodes: 1}}
model: {{preset: gpt, layers: 2, hidden: 256, heads: 4, seq_len: 128, vocab: 1000}}
training: {{global_batch_size: 8, microbatch_size: 8}}
"""


def _device(preset: str):
    return parse_scenario(_CLUSTER.format(preset=preset)).cluster.device


def test_mamf_efficiency_divides_the_size_curve_out():
    # A100: 271.2 of 312 TFLOP/s at 1024 x 10240 (D = 48); H100: 794.5 of 989 at 2048 x 2048 (D = 64)
    assert mamf_efficiency("A100-80GB", half_dim=48) == pytest.approx(
        271.2 / 312 * (1 + 48 / 1024) * (1 + 48 / 10240) * (1 + 48 / 5120))  # M, N and K
    assert mamf_efficiency("A100-80GB", half_dim=48) == pytest.approx(0.9228, abs=1e-4)
    assert mamf_efficiency("H100-80GB", half_dim=64) == pytest.approx(794.5 / 989 * (1 + 64 / 2048) ** 2 * (1 + 64 / 13312))
    assert mamf_efficiency("H100-80GB", half_dim=64) == pytest.approx(0.8584, abs=1e-4)
    assert MAMF_BF16["H100-80GB"][1] == 989.0 and MAMF_BF16["A100-80GB"][1] == 312.0  # the presets' peaks
    # each measured time holds one launch gap, which kernel_time_s adds back: taken out of the work
    t = 2.0 * 2048 * 2048 * 13312 / 794.5e12
    assert mamf_efficiency("H100-80GB", half_dim=64, gap_s=2e-6) == pytest.approx(
        2.0 * 2048 * 2048 * 13312 / (989e12 * (t - 2e-6)) * (1 + 64 / 2048) ** 2 * (1 + 64 / 13312))
    assert mamf_efficiency("H100-80GB", half_dim=64, gap_s=2e-6) == pytest.approx(0.8708, abs=1e-4)
    assert mamf_efficiency("A100-80GB", half_dim=48, gap_s=2e-6) == pytest.approx(0.9275, abs=1e-4)


def test_h100_efficiency_is_the_a100s_times_the_measured_ratio():
    ratio = (794.5 / 989 * (1 + 64 / 2048) ** 2 * (1 + 64 / 13312)) / (
        271.2 / 312 * (1 + 48 / 1024) * (1 + 48 / 10240) * (1 + 48 / 5120))
    assert ratio == pytest.approx(0.9302, abs=1e-4)  # the size curve divided out, the launch gaps left in
    gapless = mamf_efficiency("H100-80GB", half_dim=64, gap_s=2e-6) / mamf_efficiency("A100-80GB", half_dim=48, gap_s=2e-6)
    assert gapless == pytest.approx(0.9389, abs=1e-4)  # the 2 µs gap is 1.4% of the H100's 141 µs, 0.5% of the A100's 396
    assert A100_EFFICIENCY * gapless == pytest.approx(0.7042, abs=1e-4)
    assert H100_EFFICIENCY == 0.70 == round(0.75 * gapless, 2)
    for name in ("H100-80GB", "H800-80GB", "H200-141GB"):
        assert DEVICE_PRESETS[name]["efficiency"] == H100_EFFICIENCY
    assert DEVICE_PRESETS["A100-80GB"]["efficiency"] == A100_EFFICIENCY == 0.75


def test_both_presets_price_their_mamf_shape_at_the_same_share():
    """Each preset's time for its own MAMF shape: the H100 over the A100 runs it at 0.7/0.75 of
    the measured rate ratio, i.e. both presets sit at the same share of what MAMF measures."""
    shares = {}
    for preset, name in (("a100-nvlink-8", "A100-80GB"), ("dgx-h100", "H100-80GB")):
        device = _device(preset)
        rate_tflops, _peak, m, n, k = MAMF_BF16[name]
        flop = 2.0 * m * n * k
        priced_tflops = flop / kernel_time_s(flop, 0.0, device, "bf16", (m, n, k)) / 1e12
        shares[name] = priced_tflops / rate_tflops
    assert shares["A100-80GB"] == pytest.approx(0.809, abs=1e-3)  # about 0.75 / 0.9275, the gap priced in
    assert shares["H100-80GB"] == pytest.approx(0.806, abs=1e-3)  # about 0.70 / 0.8708
    assert shares["H100-80GB"] == pytest.approx(shares["A100-80GB"], abs=5e-3)
