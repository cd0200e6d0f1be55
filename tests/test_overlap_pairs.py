"""Replaying the V-shaped and zero-bubble schedules: closed forms derived here, checked on the
fast path (``time_schedule``) and on the compiled engine (SimPy and fast replay).

Notation: R ranks, M micro-batches, every chunk's F = I = W = T and B = I + W = 2T; an
overlapped pair ``(F;B)OVERLAP_F_B`` takes F&B = ``overlapped_pair_s(F, B, e)`` = F + B − e·min(F, B).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import synthetic_scenario
from sim.core.errors import DappleError, SpecError
from sim.cost.compute import overlapped_pair_s
from sim.engine.compile import compile_workload
from sim.engine.fastpath import replay, time_schedule
from sim.engine.replay import simulate
from sim.engine.workload import COMPUTE
from sim.schedule import generate
from sim.schedule.ir import OverlapFB
from sim.schedule.vshape import v_stage_ranks

T = 1.0


def _equal_costs(name: str, ranks: int, microbatches: int, efficiency: float = 0.0):
    schedule = generate(name, ranks, microbatches)
    n = schedule.num_stages
    return schedule, time_schedule(schedule, [T] * n, [2 * T] * n, wgrad_s=[T] * n,
                                   overlap_efficiency=efficiency)


@pytest.mark.parametrize("efficiency", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("ranks, microbatches", [(r, m) for r in (2, 4, 8) for m in (2 * r, 4 * r)])
def test_dualpipe_v_bubble_matches_deepseek(ranks, microbatches, efficiency) -> None:
    """DeepSeek-V3 technical report (2024), §3.2.1 Table 2: DualPipe's bubble is
    (PP/2 − 1)(F&B + B − 3W) for PP stages; DeepSeek's DualPipe repository (README, "DualPipeV")
    gives the same bubble for the V variant on PP/2 devices, i.e. with R = PP/2 ranks
    (R − 1)(F&B + B − 3W). The bubble is a device's idle time, makespan − its busy time; the
    last rank, which runs the most pairs, idles longest, and it is that formula's device
    (with e = 0 every rank idles the same)."""
    schedule, timing = _equal_costs("dualpipe-v", ranks, microbatches, efficiency)
    f_and_b = overlapped_pair_s(T, 2 * T, efficiency)
    idle = [timing.makespan_s - busy for busy in timing.busy_s]
    assert max(idle) == pytest.approx((ranks - 1) * (f_and_b + 2 * T - 3 * T))
    assert any(type(step) is OverlapFB for step in schedule.ranks[0])


@pytest.mark.parametrize("ranks, microbatches", [(r, m) for r in (2, 4, 8) for m in (2 * r - 1, 2 * r, 4 * r)])
def test_zb_v_makespan_with_equal_f_i_w(ranks, microbatches) -> None:
    """Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §6: ZB-V has no bubble in its
    steady phase when T_F = T_B = T_W (their B is our I). What is left is the fill, which no
    schedule avoids: each rank runs 2M chunks of F, I and W, 6M·T of work, and rank R−1 cannot
    start before micro-batch 0's forward has crossed stages 0..R−2, (R−1)·T. So the makespan is
    at least 6M·T + (R−1)·T, and ZB-V reaches that bound once M ≥ 2R − 1, the warm-up its
    first rank runs (with fewer micro-batches the V cannot fill; torch, like us, then plans
    2R − 1 and drops the rest). (We derived the bound; we could not check a printed makespan
    formula in the paper.)"""
    _, timing = _equal_costs("zb-v", ranks, microbatches)
    assert timing.makespan_s == pytest.approx(6 * microbatches * T + (ranks - 1) * T)


@settings(max_examples=40, deadline=None)
@given(
    ranks=st.sampled_from([2, 4]),
    rounds=st.sampled_from([1, 2, 4]),
    fwd=st.floats(0.1, 3.0),
    bwd=st.floats(0.1, 3.0),
    wgrad_share=st.floats(0.0, 1.0),
)
def test_interleaved_zb_is_never_slower_than_interleaved(ranks, rounds, fwd, bwd, wgrad_share) -> None:
    """Same plan (2 chunks per rank), balanced stages (the same F, B and W on every stage):
    splitting each backward into I and a deferred W (torch's ScheduleInterleavedZeroBubble,
    Qi et al. ICLR 2024) never lengthens interleaved 1F1B (Narayanan et al., SC 2021, §2.2) on
    the contention-free fast path. With unbalanced stages it can: hypothesis found R = 2,
    M = 4 with per-stage costs where interleaved-zb takes 19 s against 18 s, so the property is
    stated for balanced stages only."""
    microbatches, n = ranks * rounds, 2 * ranks
    plain = time_schedule(generate("interleaved", ranks, microbatches, chunks=2), [fwd] * n, [bwd] * n)
    zb = time_schedule(generate("interleaved-zb", ranks, microbatches, chunks=2), [fwd] * n, [bwd] * n,
                       wgrad_s=[bwd * wgrad_share] * n)
    assert zb.makespan_s <= plain.makespan_s * (1 + 1e-9)


def test_overlap_efficiency_must_be_a_fraction() -> None:
    schedule = generate("dualpipe-v", 2, 4)
    with pytest.raises(DappleError, match="overlap_efficiency"):
        time_schedule(schedule, [T] * 4, [2 * T] * 4, overlap_efficiency=1.5)


# --- the compiled engine ------------------------------------------------------------------


def _v_scenario(name: str, ranks: int, microbatches: int, efficiency: float, **kw):
    n = 2 * ranks
    scenario = synthetic_scenario(fwd_s=[T] * n, bwd_s=[2 * T] * n, ranks=v_stage_ranks(ranks), schedule=name,
                                  microbatches=microbatches, microbatch_size=1, **kw)
    return replace(scenario, plan=replace(scenario.plan, overlap_efficiency=efficiency))


@pytest.mark.parametrize("efficiency", [0.0, 0.5, 1.0])
def test_engine_replays_dualpipe_v_pairs(efficiency) -> None:
    """A pair becomes its forward's ops then its backward's, whose compute shares
    F + B − e·min(F, B); both engines agree with the bare schedule's fast path."""
    ranks, microbatches = 3, 6
    scenario = _v_scenario("dualpipe-v", ranks, microbatches, efficiency)
    workload = compile_workload(scenario)
    schedule = generate("dualpipe-v", ranks, microbatches)
    pairs = sum(type(step) is OverlapFB for acts in schedule.ranks for step in acts)
    compute = sum(op.duration_s for cls in workload.classes for op in cls.ops if op.code == COMPUTE)
    # every F and backward once: 2R·M·(F + B), less e·min(F, B) per pair
    assert compute == pytest.approx(2 * ranks * microbatches * 3 * T - pairs * efficiency * T)
    n = 2 * ranks
    bare = time_schedule(schedule, [T] * n, [2 * T] * n, wgrad_s=[T] * n, overlap_efficiency=efficiency)
    fast, engine = replay(workload), simulate(workload)
    assert engine.iteration_time_s == pytest.approx(fast.iteration_time_s)
    assert fast.iteration_time_s == pytest.approx(bare.makespan_s)


def test_engine_pair_memory_forward_allocates_backward_frees() -> None:
    """Stash of 1 byte per micro-batch: a stage holds at most what the bare schedule's
    in-flight count says, pairs included (the forward's stash comes at the pair's start)."""
    ranks, microbatches = 2, 4
    workload = compile_workload(_v_scenario("dualpipe-v", ranks, microbatches, 0.0))
    schedule = generate("dualpipe-v", ranks, microbatches)
    bare = time_schedule(schedule, [T] * 4, [2 * T] * 4, wgrad_s=[T] * 4)
    result = simulate(workload)
    alloc = sum(op.alloc_bytes for cls in workload.classes for op in cls.ops)
    free = sum(op.free_bytes for cls in workload.classes for op in cls.ops)
    assert alloc == pytest.approx(free) == pytest.approx(2 * ranks * microbatches * 1.0)
    assert result.iteration_time_s == pytest.approx(bare.makespan_s)


def test_plan_rejects_an_overlap_efficiency_outside_zero_one() -> None:
    scenario = _v_scenario("dualpipe-v", 2, 4, 0.0)
    with pytest.raises(SpecError, match="overlap_efficiency"):
        replace(scenario.plan, overlap_efficiency=1.5)
