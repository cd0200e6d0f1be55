"""Closed forms, written out here, against the contention-free fast path and sim.cost.closed_forms."""

from __future__ import annotations

import pytest

from sim.core.errors import DappleError, ScheduleError
from sim.cost.closed_forms import bubble_fraction, dapple_latency_s, makespan_s, peak_inflight_microbatches
from sim.engine.fastpath import time_schedule
from sim.schedule import generate, lower

F_S, B_S = 1.0, 2.0
GRID = [(s, m) for s in (1, 2, 4, 8) for m in sorted({1, s, 4 * s})]


def _uniform(schedule, fwd=F_S, bwd=B_S, **kw):
    n = schedule.num_stages
    return time_schedule(schedule, [fwd] * n, [bwd] * n, **kw)


@pytest.mark.parametrize(("s", "m"), GRID)
@pytest.mark.parametrize("name", ["gpipe", "dapple", "1f1b"])
def test_gpipe_and_1f1b_makespan_is_m_plus_s_minus_1_times_f_plus_b(name, s, m) -> None:
    expected = (m + s - 1) * (F_S + B_S)  # GPipe; DAPPLE §3
    timing = _uniform(generate(name, s, m))
    assert timing.makespan_s == expected
    assert makespan_s(name, s, m, F_S, B_S) == expected
    assert _uniform(lower(generate(name, s, m))).makespan_s == expected


@pytest.mark.parametrize(("s", "m"), GRID)
def test_bubble_fraction_is_s_minus_1_over_m_plus_s_minus_1(s, m) -> None:
    expected = (s - 1) / (m + s - 1)
    for name in ("gpipe", "dapple"):
        assert bubble_fraction(name, s, m, F_S, B_S) == pytest.approx(expected)
        assert _uniform(generate(name, s, m)).bubble_fraction == pytest.approx(expected)


@pytest.mark.parametrize(("s", "m"), GRID)
def test_peak_inflight_gpipe_m_dapple_k_i(s, m) -> None:
    gpipe = _uniform(generate("gpipe", s, m)).peak_inflight_microbatches
    dapple = _uniform(generate("dapple", s, m)).peak_inflight_microbatches
    heavy = _uniform(generate("dapple", s, m, policy="2(s-i)-1")).peak_inflight_microbatches
    assert gpipe == tuple(m for _ in range(s))
    assert dapple == tuple(min(s - i, m) for i in range(s))
    assert heavy == tuple(min(2 * (s - i) - 1, m) for i in range(s))
    for i in range(s):
        assert peak_inflight_microbatches("gpipe", s, m, i) == m
        assert peak_inflight_microbatches("dapple", s, m, i) == min(s - i, m)
        assert peak_inflight_microbatches("dapple", s, m, i, policy="2(s-i)-1") == min(
            2 * (s - i) - 1, m
        )


@pytest.mark.parametrize("s", [1, 2, 3, 4])
@pytest.mark.parametrize("chunks", [1, 2, 3])
@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_interleaved_makespan_is_m_f_plus_b_plus_bubble_over_v(s, chunks, rounds) -> None:
    m = rounds * s
    # Per-rank F and B of one micro-batch; each chunk takes 1/v of it (Narayanan et al. §2.2).
    expected = m * (F_S + B_S) + (s - 1) * (F_S + B_S) / chunks
    schedule = generate("interleaved", s, m, chunks=chunks)
    timing = _uniform(schedule, fwd=F_S / chunks, bwd=B_S / chunks)
    assert timing.makespan_s == pytest.approx(expected)
    assert makespan_s("interleaved", s, m, F_S, B_S, chunks=chunks) == pytest.approx(expected)


@pytest.mark.parametrize(("s", "m"), [(2, 2), (4, 4), (4, 16), (8, 8), (8, 32)])
def test_zb_h1_beats_1f1b_when_f_equals_i_equals_w(s, m) -> None:
    f = i = w = 1.0
    zb = _uniform(generate("zb-h1", s, m), fwd=f, bwd=i + w, wgrad_s=[w] * s).makespan_s
    dapple = _uniform(generate("dapple", s, m), fwd=f, bwd=i + w).makespan_s
    assert dapple == (m + s - 1) * (f + i + w)
    assert zb == m * (f + i + w) + (s - 1) * (f + i - w)  # Qi et al. §2.1: bubble 1/3 of 1F1B's
    if s > 1:
        assert zb < dapple
    assert makespan_s("zb-h1", s, m, f, i + w, wgrad_s=w) == zb
    assert _uniform(generate("zb-h1", s, m)).peak_inflight_microbatches == (min(s, m),) * s


@pytest.mark.parametrize(("f", "i", "w"), [(1.0, 2.0, 0.5), (2.0, 1.0, 1.0), (1.5, 1.5, 1.5)])
def test_zb_h1_formula_holds_when_w_at_most_f_and_i(f, i, w) -> None:
    s, m = 4, 12
    timing = _uniform(generate("zb-h1", s, m), fwd=f, bwd=i + w, wgrad_s=[w] * s)
    assert timing.makespan_s == pytest.approx(m * (f + i + w) + (s - 1) * (f + i - w))


def test_zb_h1_formula_refuses_outside_its_assumption() -> None:
    with pytest.raises(ScheduleError, match=r"W <= min\(F, I\)"):
        makespan_s("zb-h1", 4, 8, 1.0, 3.0, wgrad_s=2.0)  # W=2 > F=1
    with pytest.raises(ScheduleError, match=r"M >= S"):
        makespan_s("zb-h1", 4, 2, 1.0, 2.0, wgrad_s=1.0)


@pytest.mark.parametrize(("s", "m"), [(1, 1), (2, 2), (4, 1), (4, 4), (4, 16), (8, 32)])
def test_dapple_latency_model_is_exact_for_uniform_stages(s, m) -> None:
    model = dapple_latency_s([F_S] * s, [B_S] * s, [0.0] * s, m)
    assert model.total_s == (m + s - 1) * (F_S + B_S)
    assert model.pivot_stage == s - 1  # ties go to the last stage
    assert model.warmup_s == (s - 1) * F_S
    assert model.steady_s == m * (F_S + B_S)
    assert model.ending_s == (s - 1) * B_S


def test_dapple_latency_model_picks_the_slow_stage_as_pivot() -> None:
    # Stage 1 is twice as slow: Q=1, T_w=F0, T_s=M(F1+B1), T_e=max(B0+AR0, AR1, AR2).
    model = dapple_latency_s([1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [0.5, 1.0, 3.0], 8)
    assert model.pivot_stage == 1
    assert model.warmup_s == 1.0
    assert model.steady_s == 8 * (2.0 + 4.0)
    assert model.ending_s == max(2.0 + 0.5, 1.0, 3.0)
    assert model.total_s == 1.0 + 48.0 + 3.0


def test_comm_delay_adds_two_hops_per_boundary_to_gpipe() -> None:
    # Forward and backward streams each cross S-1 boundaries: +2(S-1)c.
    s, m, c = 4, 8, 0.5
    timing = _uniform(generate("gpipe", s, m), comm_s=c)
    assert timing.makespan_s == (m + s - 1) * (F_S + B_S) + 2 * (s - 1) * c


@pytest.mark.parametrize(("s", "m"), [(2, 8), (4, 4), (4, 16), (8, 32)])
@pytest.mark.parametrize("c", [0.25, 0.5])
def test_dapple_2s_minus_i_policy_hides_communication(s, m, c) -> None:
    # DAPPLE §5: the longer warm-up keeps ranks busy while activations are in flight.
    bound = (m + s - 1) * (F_S + B_S) + 2 * (s - 1) * c
    heavy = _uniform(lower(generate("dapple", s, m, policy="2(s-i)-1")), comm_s=c)
    plain = _uniform(lower(generate("dapple", s, m)), comm_s=c)
    assert heavy.makespan_s == pytest.approx(bound)
    assert plain.makespan_s > bound


def test_busy_time_is_the_compute_on_each_rank() -> None:
    timing = _uniform(generate("dapple", 3, 5))
    assert timing.busy_s == (5 * (F_S + B_S),) * 3
    assert len(timing.actions) == 3 * 2 * 5
    rank, action, start, end = timing.actions[0]
    assert (rank, str(action), start, end) == (0, "0F0", 0.0, F_S)


def test_unknown_schedule_and_bad_inputs_are_errors() -> None:
    with pytest.raises(ScheduleError, match=r"'pipedream'.*gpipe"):
        makespan_s("pipedream", 4, 8, 1.0, 2.0)
    with pytest.raises(ScheduleError, match=r"multiple of num_stages=4"):
        makespan_s("interleaved", 4, 6, 1.0, 2.0, chunks=2)
    with pytest.raises(ScheduleError, match=r"chunks=2 applies only to 'interleaved'"):
        makespan_s("gpipe", 4, 8, 1.0, 2.0, chunks=2)
    with pytest.raises(DappleError, match=r"fwd_s=-1.0"):
        makespan_s("gpipe", 4, 8, -1.0, 2.0)
    with pytest.raises(DappleError, match=r"one entry per stage"):
        dapple_latency_s([1.0, 1.0], [2.0], [0.0, 0.0], 4)
    with pytest.raises(DappleError, match=r"fwd_s has 3 entries, expected one per stage \(4\)"):
        time_schedule(generate("gpipe", 4, 2), [1.0] * 3, [2.0] * 4)
    with pytest.raises(ScheduleError, match=r"no closed form"):
        peak_inflight_microbatches("interleaved", 4, 8, 0, chunks=2)


def test_fastpath_reports_a_deadlock_with_the_validator_message() -> None:
    from sim.schedule import parse_schedule

    with pytest.raises(ScheduleError, match=r"\(deadlock\)"):
        time_schedule(parse_schedule("0F0 0B0 0F1 0B1\n1F1 1B1 1F0 1B0"), [1.0] * 2, [1.0] * 2)


def test_fastpath_times_a_64_rank_512_microbatch_pipeline() -> None:
    # The O(actions) fast path takes this size in stride (speed is benchmarked, not tested).
    s, m = 64, 512
    timing = _uniform(generate("dapple", s, m))
    assert timing.makespan_s == (m + s - 1) * (F_S + B_S)


@pytest.mark.parametrize(
    ("name", "params"),
    [("gpipe", {}), ("dapple", {}), ("zb-h1", {}), ("interleaved", {"chunks": 2})],
)
def test_lowering_does_not_change_fastpath_timing(name, params) -> None:
    # Receives sit right before their consumers, so they add no waiting of their own.
    schedule = generate(name, 4, 8, **params)
    n = schedule.num_stages
    fwd = [1.0 + 0.25 * (s % 3) for s in range(n)]
    bwd = [2.0 * f for f in fwd]
    kw = {"wgrad_s": [0.5 * f for f in fwd], "comm_s": 0.3}
    plain, lowered = time_schedule(schedule, fwd, bwd, **kw), time_schedule(lower(schedule), fwd, bwd, **kw)
    assert lowered.makespan_s == plain.makespan_s
    assert lowered.busy_s == plain.busy_s
    compute = [(r, a, t0, t1) for r, a, t0, t1 in lowered.actions if a.is_compute]
    assert compute == list(plain.actions)


@pytest.mark.parametrize(("s", "m"), [(2, 4), (4, 8), (4, 13), (8, 16), (16, 120)])
def test_dualpipe_v_bubble_is_the_dualpipe_readme_s(s, m) -> None:
    # deepseek-ai/DualPipe README (3da1bbe): DualPipeV's bubble (PP/2 − 1)(F&B + B − 3W) over PP = 2S
    # chunks; a chunk F = I = W = 1 (B = 2), F&B = F + B = 3: (S − 1)(3 + 2 − 3) = 2(S − 1)
    chunk_f, chunk_b, chunk_w = 1.0, 2.0, 1.0
    expected = m * 2 * (chunk_f + chunk_b) + (s - 1) * ((chunk_f + chunk_b) + chunk_b - 3 * chunk_w)
    assert expected == 6 * m + 2 * (s - 1)
    n = 2 * s
    timing = time_schedule(generate("dualpipe-v", s, m), [chunk_f] * n, [chunk_b] * n, wgrad_s=[chunk_w] * n)
    assert timing.makespan_s == pytest.approx(expected, rel=1e-12)
    # the rank's two chunks together: F 2, B 4, W 2
    assert makespan_s("dualpipe-v", s, m, 2 * chunk_f, 2 * chunk_b, wgrad_s=2 * chunk_w) == pytest.approx(expected)


def test_dualpipe_v_closed_form_only_where_f_i_and_w_are_equal() -> None:
    with pytest.raises(ScheduleError, match="F = I = W"):
        makespan_s("dualpipe-v", 4, 8, 2.0, 4.0, wgrad_s=1.0)
    with pytest.raises(ScheduleError, match="M >= 2S"):
        makespan_s("dualpipe-v", 4, 4, 2.0, 4.0, wgrad_s=2.0)
