"""Overlapped forward-backward pairs, ``(0F7;7B3)OVERLAP_F_B``: text, checker and lowering."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.core.errors import ScheduleError
from sim.schedule import check_schedule, generate, lower, parse_schedule, strip_communication
from sim.schedule.ir import Action, ActionKind, OverlapFB, positions, wait_lists
from sim.schedule.text import parse_action

F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W

indices = st.integers(0, 10_000)


@st.composite
def pairs(draw) -> OverlapFB:
    return OverlapFB(
        forward=Action(stage=draw(indices), kind=F, microbatch=draw(indices)),
        backward=Action(stage=draw(indices), kind=draw(st.sampled_from([B, I])), microbatch=draw(indices)),
    )


@given(pairs())
def test_pair_text_round_trips(pair: OverlapFB) -> None:
    assert parse_action(str(pair)) == pair
    assert pair.parts == (pair.forward, pair.backward)


def test_pair_text_is_torch_s() -> None:
    pair = OverlapFB(forward=Action(stage=0, kind=F, microbatch=7), backward=Action(stage=7, kind=B, microbatch=3))
    assert str(pair) == "(0F7;7B3)OVERLAP_F_B"
    assert pair.kind == "OVERLAP_F_B" and pair.is_compute


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("(7B3;0F7)OVERLAP_F_B", r"a forward then a backward"),
        ("(0F7;7W3)OVERLAP_F_B", r"a forward then a backward"),
        ("(0F7;7Q3)OVERLAP_F_B", r"bad action '7Q3' \(in '\(0F7;7Q3\)OVERLAP_F_B'\)"),
        ("(0F7;7B3;1B2)OVERLAP_F_B", r"bad action"),
        ("(0F7;7B3)OVERLAP", r"bad action"),
        ("3OVERLAP_F_B", r"bad action"),
    ],
)
def test_bad_pairs_are_rejected(text: str, pattern: str) -> None:
    with pytest.raises(ScheduleError, match=pattern):
        parse_action(text)


def test_dualpipe_v_text_round_trips() -> None:
    schedule = generate("dualpipe-v", 4, 8)
    assert any(isinstance(step, OverlapFB) for acts in schedule.ranks for step in acts)
    for form in (schedule, lower(schedule)):
        assert parse_schedule(str(form), name=form.name) == form


def test_both_parts_of_a_pair_sit_at_its_place() -> None:
    schedule = parse_schedule("0F0 0F1 0B0 0B1\n1F0 (1F1;1B0)OVERLAP_F_B 1B1")
    where = positions(schedule)
    assert where[(1, F, 1)] == where[(1, B, 0)] == (1, 1)
    waits = wait_lists(schedule, where)
    # the pair waits for 0F1 (its forward's input) and 1F0 (its backward's forward)
    assert sorted(waits[1][1]) == [(0, 1), (1, 0)]
    check_schedule(schedule)


def test_a_pair_may_not_wait_for_itself() -> None:
    schedule = parse_schedule("0F0 0F1 0B0 0B1\n1F0 1B0 (1F1;1B1)OVERLAP_F_B")
    with pytest.raises(ScheduleError, match=r"rank 1 step 2: \(1F1;1B1\)OVERLAP_F_B pairs 1B1 with the forward 1F1"):
        check_schedule(schedule)


def test_a_misplaced_part_is_named() -> None:
    good = parse_schedule("0F0 0F1 0B0 0B1\n1F0 1F1 1F2 1B0 1B1")
    pair = parse_action("(0F2;1B2)OVERLAP_F_B")
    schedule = replace(good, ranks=(good.ranks[0] + (pair,), good.ranks[1]))
    with pytest.raises(ScheduleError, match=r"its part 1B2 is on rank 0 but stage 1 runs on rank 1"):
        check_schedule(schedule)


def test_lowering_puts_receives_before_a_pair_and_sends_after_it() -> None:
    # two ranks, one stage each; rank 1 pairs the forward of mb 1 with the backward of mb 0
    schedule = parse_schedule("0F0 0F1 0B0 0B1\n1F0 (1F1;1B0)OVERLAP_F_B 1B1")
    lowered = lower(schedule)
    assert str(lowered).splitlines()[1] == (
        "1RECV_F0 1F0 1RECV_F1 (1F1;1B0)OVERLAP_F_B 1SEND_B0 1B1 1SEND_B1 1REDUCE_GRAD"
    )
    check_schedule(lowered)
    assert strip_communication(lowered) == schedule
    assert lower(lowered) == lowered


def test_lowered_dualpipe_v_pairs_take_both_parts_communication() -> None:
    rank0 = str(lower(generate("dualpipe-v", 2, 4))).splitlines()[0].split()
    # (0F3;3B1): stage 0 sends its activation on, stage 3 sends its gradient back; stage 3's
    # input arrives from rank 1 and stage 0's gradient is not needed (its B is 0B0 later)
    at = rank0.index("(0F3;3B1)OVERLAP_F_B")
    assert rank0[at - 2:at + 3] == ["3RECV_F1", "3F1", "(0F3;3B1)OVERLAP_F_B", "0SEND_F3", "3SEND_B1"]
    at = rank0.index("(3F2;0B0)OVERLAP_F_B")
    assert rank0[at - 2:at] == ["3RECV_F2", "0RECV_B0"]  # the forward's receive first
    assert rank0[rank0.index("3B3") + 1:rank0.index("3B3") + 3] == ["3SEND_B3", "3REDUCE_GRAD"]
    assert rank0[-2:] == ["0W3", "0REDUCE_GRAD"]


def test_the_v_turn_is_a_local_hand_off() -> None:
    # S=2: stages 1 and 2 are both on rank 1, so 1F→2F and 2B→1B need no transfer
    lowered = lower(generate("zb-v", 2, 4))
    words = str(lowered).split()
    for m in range(4):
        assert f"1SEND_F{m}" not in words and f"2RECV_F{m}" not in words
        assert f"2SEND_B{m}" not in words and f"1RECV_B{m}" not in words
        assert f"0SEND_F{m}" in words and f"1SEND_B{m}" in words  # the cuts between ranks
    check_schedule(lowered)
