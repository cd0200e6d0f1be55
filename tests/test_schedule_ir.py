"""The schedule IR: action text, schedule text, and agreement with torch's parser."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.errors import ScheduleError
from sim.schedule import generate, lower, parse_action, parse_schedule
from sim.schedule.ir import Action, ActionKind, Schedule

KINDS = list(ActionKind)


@st.composite
def actions(draw) -> Action:
    kind = draw(st.sampled_from(KINDS))
    mb = None if kind is ActionKind.REDUCE_GRAD else draw(st.integers(0, 10_000))
    return Action(stage=draw(st.integers(0, 10_000)), kind=kind, microbatch=mb)


@given(actions())
def test_action_text_round_trips(action: Action) -> None:
    assert parse_action(str(action)) == action


@pytest.mark.parametrize(
    ("action", "text"),
    [
        (Action(stage=2, kind=ActionKind.F, microbatch=0), "2F0"),
        (Action(stage=1, kind=ActionKind.SEND_F, microbatch=3), "1SEND_F3"),
        (Action(stage=0, kind=ActionKind.REDUCE_GRAD, microbatch=None), "0REDUCE_GRAD"),
        (Action(stage=12, kind=ActionKind.W, microbatch=105), "12W105"),
        (Action(stage=3, kind=ActionKind.RECV_B, microbatch=7), "3RECV_B7"),
    ],
)
def test_action_text_matches_torch_form(action: Action, text: str) -> None:
    assert str(action) == text
    assert parse_action(text) == action


@pytest.mark.parametrize(
    "text", ["", "F0", "2X0", "2F", "2B-1", "2REDUCE_GRAD3", "2SEND_F", "a2F0", "2F0 1B0", "2f0"]
)
def test_bad_action_text_is_rejected_naming_token_and_form(text: str) -> None:
    with pytest.raises(ScheduleError) as err:
        parse_action(text)
    message = str(err.value)
    assert repr(text) in message
    assert "\n" not in message


def test_bad_action_message_shows_valid_form() -> None:
    with pytest.raises(ScheduleError, match=r"e\.g\. 2F0"):
        parse_action("2X0")


def test_reduce_grad_alone_has_no_microbatch() -> None:
    with pytest.raises(ScheduleError):
        Action(stage=0, kind=ActionKind.F, microbatch=None)
    with pytest.raises(ScheduleError):
        Action(stage=0, kind=ActionKind.REDUCE_GRAD, microbatch=1)


@pytest.mark.parametrize("name", ["gpipe", "dapple", "zb-h1", "interleaved"])
@pytest.mark.parametrize("lowered", [False, True])
def test_schedule_text_round_trips(name: str, lowered: bool) -> None:
    schedule = generate(name, 3, 6)
    schedule = lower(schedule) if lowered else schedule
    back = parse_schedule(str(schedule), name=schedule.name)
    assert back == schedule
    assert schedule.to_text() == str(schedule)
    assert len(str(schedule).splitlines()) == schedule.num_ranks


def test_parse_schedule_reads_comments_and_blank_lines() -> None:
    text = """
    # a hand-written 2-stage GPipe
    0F0 0F1 0B0 0B1   # rank 0

    1F0 1F1 1B0 1B1
    """
    schedule = parse_schedule(text)
    assert schedule.name == "file"
    assert (schedule.num_stages, schedule.num_microbatches, schedule.num_ranks) == (2, 2, 2)
    assert schedule.stage_ranks == (0, 1)
    assert str(schedule) == "0F0 0F1 0B0 0B1\n1F0 1F1 1B0 1B1"


def test_parse_schedule_derives_interleaved_stage_ranks() -> None:
    schedule = parse_schedule("0F0 2F0 2B0 0B0\n1F0 3F0 3B0 1B0")
    assert schedule.stage_ranks == (0, 1, 0, 1)
    assert schedule.num_stages == 4


def test_parse_schedule_rejects_stage_on_two_ranks() -> None:
    with pytest.raises(ScheduleError, match=r"stage 1 .*ranks \[0, 1\]"):
        parse_schedule("0F0 1F0 0B0\n1B0")


def test_parse_schedule_rejects_stage_without_compute() -> None:
    with pytest.raises(ScheduleError, match=r"stage 1 .*no rank"):
        parse_schedule("0F0 0B0 2F0 2B0")


def test_parse_schedule_names_line_of_bad_token() -> None:
    with pytest.raises(ScheduleError, match=r"plan\.txt line 2: bad action '1Q0'"):
        parse_schedule("0F0 0B0\n1F0 1Q0", name="plan.txt")


def test_schedule_shape_is_checked() -> None:
    a = Action(stage=0, kind=ActionKind.F, microbatch=0)
    with pytest.raises(ScheduleError, match="stage_ranks"):
        Schedule(name="x", num_stages=2, num_microbatches=1, stage_ranks=(0,), ranks=((a,),))
    with pytest.raises(ScheduleError, match="rank 3"):
        Schedule(name="x", num_stages=1, num_microbatches=1, stage_ranks=(3,), ranks=((a,),))


@pytest.fixture(scope="module")
def torch_schedules():
    return pytest.importorskip("torch.distributed.pipelining.schedules")


@settings(deadline=None)
@given(action=actions())
def test_torch_parses_our_action_text(torch_schedules, action: Action) -> None:
    schedules = torch_schedules
    theirs = schedules._Action.from_str(str(action))
    assert theirs.stage_index == action.stage
    assert theirs.computation_type.value == action.kind.value
    assert theirs.microbatch_index == action.microbatch
    assert str(theirs) == str(action)
