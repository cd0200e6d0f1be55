"""Schedule generators: every output is valid, and each follows its paper's rule."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.errors import ScheduleError
from sim.schedule import GENERATORS, check_schedule, generate, lower, strip_communication
from sim.schedule.generators import LOOPED_SCHEDULES, V_SCHEDULES, stage_ranks_for
from sim.schedule.ir import ActionKind, OverlapFB, Schedule

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W

sizes = st.tuples(st.integers(1, 8), st.integers(1, 32))


def _check_valid(schedule: Schedule) -> None:
    check_schedule(schedule)
    lowered = lower(schedule)
    check_schedule(lowered)
    assert strip_communication(lowered) == schedule
    assert lower(lowered) == lowered


@settings(max_examples=40, deadline=None)
@given(sizes, st.sampled_from(["gpipe", "dapple", "1f1b", "zb-h1"]))
def test_single_stage_per_rank_generators_are_valid(size, name) -> None:
    num_stages, num_microbatches = size
    schedule = generate(name, num_stages, num_microbatches)
    assert schedule.num_ranks == schedule.num_stages == num_stages
    _check_valid(schedule)


@settings(max_examples=40, deadline=None)
@given(sizes, st.sampled_from(["s-i", "2(s-i)-1"]))
def test_dapple_policies_are_valid(size, policy) -> None:
    _check_valid(generate("dapple", *size, policy=policy))


@settings(max_examples=60, deadline=None)
@given(sizes, st.integers(1, 4))
def test_interleaved_is_valid_or_rejects_microbatches(size, chunks) -> None:
    num_ranks, num_microbatches = size
    rounds = max(1, num_microbatches // num_ranks)
    if num_microbatches % rounds:
        with pytest.raises(ScheduleError, match=r"multiple of the number of rounds"):
            generate("interleaved", num_ranks, num_microbatches, chunks=chunks)
        return
    schedule = generate("interleaved", num_ranks, num_microbatches, chunks=chunks)
    assert schedule.num_ranks == num_ranks
    assert schedule.num_stages == num_ranks * chunks
    assert schedule.stage_ranks == tuple(s % num_ranks for s in range(num_ranks * chunks))
    _check_valid(schedule)


def _forwards_before_first_backward(actions) -> int:
    count = 0
    for a in actions:
        if a.kind in (B, I):
            return count
        count += a.kind is F
    return count


@pytest.mark.parametrize("num_stages", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("num_microbatches", [1, 2, 3, 5, 8, 16])
def test_dapple_warmup_is_k_i(num_stages: int, num_microbatches: int) -> None:
    s, m = num_stages, num_microbatches
    default = generate("dapple", s, m)
    heavy = generate("dapple", s, m, policy="2(s-i)-1")
    for i in range(s):
        assert _forwards_before_first_backward(default.ranks[i]) == min(s - i, m)
        assert _forwards_before_first_backward(heavy.ranks[i]) == min(2 * (s - i) - 1, m)


def test_dapple_steady_state_alternates_backward_and_forward() -> None:
    schedule = generate("dapple", 4, 6)
    assert str(schedule).splitlines() == [
        "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0B3 0B4 0B5",
        "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1B4 1B5",
        "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2B5",
        "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5",
    ]
    assert generate("1f1b", 4, 6).ranks == schedule.ranks


def test_gpipe_runs_all_forwards_then_all_backwards() -> None:
    schedule = generate("gpipe", 3, 4)
    for rank, actions in enumerate(schedule.ranks):
        assert [str(a) for a in actions] == [f"{rank}F{m}" for m in range(4)] + [
            f"{rank}B{m}" for m in range(4)
        ]


def test_zb_h1_delays_weight_gradients_by_stage() -> None:
    schedule = generate("zb-h1", 4, 6)
    assert str(schedule).splitlines() == [
        "0F0 0F1 0F2 0F3 0I0 0W0 0F4 0I1 0W1 0F5 0I2 0W2 0I3 0W3 0I4 0W4 0I5 0W5",
        "1F0 1F1 1F2 1I0 1F3 1I1 1W0 1F4 1I2 1W1 1F5 1I3 1W2 1I4 1W3 1I5 1W4 1W5",
        "2F0 2F1 2I0 2F2 2I1 2F3 2I2 2W0 2F4 2I3 2W1 2F5 2I4 2W2 2I5 2W3 2W4 2W5",
        "3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3W3 3W4 3W5",
    ]


@pytest.mark.parametrize("num_stages", [1, 2, 4, 7])
@pytest.mark.parametrize("num_microbatches", [1, 3, 7, 16])
def test_zb_h1_stage_i_holds_at_most_i_pending_weight_gradients(num_stages, num_microbatches):
    schedule = generate("zb-h1", num_stages, num_microbatches)
    for i, actions in enumerate(schedule.ranks):
        assert _forwards_before_first_backward(actions) == min(num_stages - i, num_microbatches)
        pending = peak = 0
        for a in actions:
            if a.kind is F:  # the rule has been applied before every forward
                peak = max(peak, pending)
            pending += (a.kind is I) - (a.kind is W)
        assert peak <= i
        if num_microbatches >= 2 * num_stages:
            assert peak == i  # the last stage really defers S-1 W's
        assert pending == 0


def test_interleaved_small_example() -> None:
    schedule = generate("interleaved", 2, 4, chunks=2)
    assert str(schedule).splitlines() == [
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3",
    ]


def test_unknown_schedule_lists_valid_names() -> None:
    with pytest.raises(ScheduleError) as err:
        generate("pipedream", 2, 4)
    for name in GENERATORS:
        assert name in str(err.value)


@pytest.mark.parametrize(
    ("name", "params", "pattern"),
    [
        ("gpipe", {"chunks": 2}, r"no parameter 'chunks'; valid parameters: none"),
        ("dapple", {"chunks": 2}, r"no parameter 'chunks'; valid parameters: policy"),
        ("dapple", {"policy": "greedy"}, r"unknown policy 'greedy'; valid: s-i, 2\(s-i\)-1"),
        ("interleaved", {"chunks": 0}, r"chunks=0 must be an integer >= 1"),
        ("interleaved", {"chunks": 1.5}, r"chunks=1.5"),
    ],
)
def test_bad_parameters_are_named(name, params, pattern) -> None:
    with pytest.raises(ScheduleError, match=pattern):
        generate(name, 4, 8, **params)


@pytest.mark.parametrize("name", sorted(GENERATORS))
@pytest.mark.parametrize(("s", "m"), [(0, 4), (4, 0), (-1, 2), (True, 2)])
def test_bad_sizes_are_rejected(name, s, m) -> None:
    with pytest.raises(ScheduleError, match=r"must be an integer >= 1"):
        generate(name, s, m)


def test_interleaved_rejects_microbatches_not_divisible_into_rounds() -> None:
    # S=4, M=10 works (2 rounds of 5); M=9 has 2 rounds and 9 % 2 != 0.
    generate("interleaved", 4, 10, chunks=2)
    with pytest.raises(ScheduleError, match=r"num_microbatches=9 .* rounds .* = 2"):
        generate("interleaved", 4, 9, chunks=2)


# --- zero bubble across chunks, looped BFS, the V-shaped schedules, per-stage DAPPLE ----------


def _v_placement(num_ranks: int) -> tuple[int, ...]:
    return tuple(range(num_ranks)) + tuple(reversed(range(num_ranks)))


@settings(max_examples=40, deadline=None)
@given(sizes, st.sampled_from(["zb-v", "dualpipe-v"]))
def test_v_shaped_generators_are_valid_or_reject_microbatches(size, name) -> None:
    num_ranks, num_microbatches = size
    if name == "dualpipe-v" and num_microbatches < 2 * num_ranks:
        with pytest.raises(ScheduleError, match=r"needs M >= 2·S"):
            generate(name, num_ranks, num_microbatches)
        return
    schedule = generate(name, num_ranks, num_microbatches)
    assert schedule.num_ranks == num_ranks and schedule.num_stages == 2 * num_ranks
    assert schedule.stage_ranks == _v_placement(num_ranks)  # rank r holds r and 2S-1-r
    _check_valid(schedule)


@settings(max_examples=40, deadline=None)
@given(sizes, st.integers(1, 4), st.sampled_from(["interleaved-zb", "looped-bfs"]))
def test_looped_generators_are_valid_or_reject_microbatches(size, chunks, name) -> None:
    num_ranks, num_microbatches = size
    rounds = max(1, num_microbatches // num_ranks)
    if name == "interleaved-zb" and num_microbatches % rounds:
        with pytest.raises(ScheduleError, match=r"multiple of the number of rounds"):
            generate(name, num_ranks, num_microbatches, chunks=chunks)
        return
    schedule = generate(name, num_ranks, num_microbatches, chunks=chunks)
    assert schedule.stage_ranks == tuple(s % num_ranks for s in range(num_ranks * chunks))
    _check_valid(schedule)


def test_looped_bfs_small_example() -> None:
    # every micro-batch through chunk 0, then chunk 1; backwards from the last chunk and mb
    assert str(generate("looped-bfs", 2, 2)).splitlines() == [
        "0F0 0F1 2F0 2F1 2B1 2B0 0B1 0B0",
        "1F0 1F1 3F0 3F1 3B1 3B0 1B1 1B0",
    ]


def test_interleaved_zb_small_example() -> None:
    assert str(generate("interleaved-zb", 2, 4)).splitlines() == [
        "0F0 0F1 2F0 2F1 2I0 2W0 0F2 2I1 2W1 0F3 0I0 0W0 2F2 0I1 0W1 2F3 2I2 2W2 2I3 2W3 0I2 0W2 0I3 0W3",
        "1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 1W1 3F3 3I3 3W2 1I2 3W3 1I3 1W2 1W3",
    ]


def test_zb_v_small_example() -> None:
    assert str(generate("zb-v", 2, 4)).splitlines() == [
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 0W2 0I3 0W3",
        "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 1I3 1W2 2W3 1W3",
    ]


def test_dualpipe_v_overlaps_forward_and_backward_in_its_main_phase() -> None:
    schedule = generate("dualpipe-v", 2, 4)
    assert str(schedule).splitlines() == [
        ("0F0 0F1 0F2 3F0 3I0 3W0 3F1 (0F3;3B1)OVERLAP_F_B (3F2;0B0)OVERLAP_F_B 3B2 (3F3;0B1)OVERLAP_F_B 3B3 "
         "0I2 0W2 0I3 0W3"),
        ("1F0 2F0 1F1 2F1 1F2 2B0 (2F2;1B0)OVERLAP_F_B (1F3;2B1)OVERLAP_F_B (2F3;1B1)OVERLAP_F_B 2B2 1B2 "
         "2I3 1I3 2W3 1W3"),
    ]
    for acts in generate("dualpipe-v", 4, 16).ranks:
        for step in acts:
            if isinstance(step, OverlapFB):  # a pair joins the two legs of the V on one rank
                assert {step.forward.stage, step.backward.stage} in ({r, 7 - r} for r in range(4))


@pytest.mark.parametrize(
    ("name", "params", "pattern"),
    [
        ("zb-v", {"chunks": 3}, r"zb-v: chunks=3, but a V-shaped schedule runs exactly 2 chunks per rank"),
        ("dualpipe-v", {"chunks": 1}, r"chunks=1, .*\(as torch's ScheduleDualPipeV\)"),
        ("looped-bfs", {"chunks": 0}, r"looped-bfs: chunks=0 must be an integer >= 1"),
        ("interleaved-zb", {"chunks": "2"}, r"chunks='2'"),
        ("dapple", {"policy": ("s-i",)}, r"1 per-stage policies for 4 stages"),
        ("dapple", {"policy": "auto"}, r"'auto' is decided per stage from the plan's costs"),
        ("dapple", {"policy": ("s-i", "auto", "s-i", "s-i")}, r"stage 1's policy is 'auto'"),
    ],
)
def test_new_bad_parameters_are_named(name, params, pattern) -> None:
    with pytest.raises(ScheduleError, match=pattern):
        generate(name, 4, 8, **params)


def test_dualpipe_v_needs_as_many_microbatches_as_stages() -> None:
    generate("dualpipe-v", 4, 8)
    with pytest.raises(ScheduleError, match=r"^dualpipe-v: num_microbatches=7 is fewer than the 8 stages"):
        generate("dualpipe-v", 4, 7)


@settings(max_examples=60, deadline=None)
@given(sizes, st.data())
def test_dapple_per_stage_policies_run_when_warmups_do_not_grow(size, data) -> None:
    num_stages, num_microbatches = size
    policy = tuple(data.draw(st.lists(st.sampled_from(["s-i", "2(s-i)-1"]), min_size=num_stages,
                                      max_size=num_stages)))
    heavy = [p == "2(s-i)-1" for p in policy]
    warmups = [min(2 * (num_stages - i) - 1 if h else num_stages - i, num_microbatches) for i, h in enumerate(heavy)]
    if any(a < b for a, b in itertools.pairwise(warmups)):
        with pytest.raises(ScheduleError, match=r"which deadlocks"):
            generate("dapple", num_stages, num_microbatches, policy=policy)
        return
    schedule = generate("dapple", num_stages, num_microbatches, policy=policy)
    assert [_forwards_before_first_backward(acts) for acts in schedule.ranks] == warmups
    _check_valid(schedule)


def test_uniform_per_stage_policies_equal_the_named_policy() -> None:
    for policy in ("s-i", "2(s-i)-1"):
        assert generate("dapple", 4, 8, policy=(policy,) * 4) == generate("dapple", 4, 8, policy=policy)


def test_stage_placement_of_each_family() -> None:
    assert stage_ranks_for("zb-v", 3, 6) == (0, 1, 2, 2, 1, 0)
    assert stage_ranks_for("dualpipe-v", 3, 5) is None
    assert stage_ranks_for("interleaved-zb", 2, 6) == (0, 1, 0, 1, 0, 1)
    assert stage_ranks_for("dapple", 3, 3) == (0, 1, 2)
    assert stage_ranks_for("gpipe", 3, 6) is None
    for name in sorted(GENERATORS):
        schedule = generate(name, 2, 4)
        assert stage_ranks_for(name, 2, schedule.num_stages) == schedule.stage_ranks
    assert LOOPED_SCHEDULES | V_SCHEDULES <= set(GENERATORS)
