"""benchmarks/ptd_decomposition.py's arithmetic: the line through SC21's PTD runs and the time a rate stands for."""

from __future__ import annotations

import pytest

from conftest import load_benchmark
from sim.app.published import narayanan_flops


def test_fit_line_recovers_a_line_and_its_least_squares_fit():
    bench = load_benchmark("ptd_decomposition")
    a, b = bench.fit_line([(96.0, 2.0 + 0.19 * 96), (192.0, 2.0 + 0.19 * 192), (384.0, 2.0 + 0.19 * 384)])
    assert (a, b) == (pytest.approx(2.0), pytest.approx(0.19))
    # (0, 0), (1, 1), (2, 3): mean x 1, mean y 4/3, Sxy = (-1)(-4/3) + (1)(5/3) = 3, Sxx = 2
    a, b = bench.fit_line([(0.0, 0.0), (1.0, 1.0), (2.0, 3.0)])
    assert b == pytest.approx(1.5) and a == pytest.approx(4 / 3 - 1.5)


def test_measured_time_is_the_runs_flops_over_rate_and_gpus():
    bench = load_benchmark("ptd_decomposition")
    # SC21 Table 2, 174.6B on 1,536 GPUs: batch 1536, 96 layers, hidden 12288, sequence 2048, 141 TFLOP/s
    flops = narayanan_flops(batch=1536, seq_len=2048, layers=96, hidden=12288, vocab=51200)
    closed = 96 * 1536 * 2048 * 96 * 12288**2 * (1 + 2048 / (6 * 12288) + 51200 / (16 * 96 * 12288))
    assert flops == pytest.approx(closed)
    assert bench.measured_time_s(flops, 141e12, 1536) == pytest.approx(closed / (141e12 * 1536))
    assert bench.measured_time_s(flops, 141e12, 1536) == pytest.approx(20.83, abs=0.01)
    assert bench.HALF_UNIT == 0.5e12
