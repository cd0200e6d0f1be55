"""The schedule checker: broken schedules are rejected with one line naming the culprit and a grid."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.core.errors import ScheduleError
from sim.schedule import check_schedule, format_grid, generate, lower, parse_schedule
from sim.schedule.ir import Schedule


def _edit(schedule: Schedule, rank: int, fn) -> Schedule:
    ranks = [list(acts) for acts in schedule.ranks]
    fn(ranks[rank])
    return replace(schedule, ranks=tuple(tuple(acts) for acts in ranks))


def _reject(schedule: Schedule) -> ScheduleError:
    with pytest.raises(ScheduleError) as err:
        check_schedule(schedule)
    assert "\n" not in str(err.value)
    return err.value


def test_generated_and_lowered_schedules_pass_the_check() -> None:
    for schedule in (generate("dapple", 4, 8), generate("zb-h1", 4, 8),
                     generate("interleaved", 4, 8, chunks=2), generate("gpipe", 1, 3)):
        check_schedule(schedule)
        check_schedule(lower(schedule))


def test_backward_before_forward_is_named() -> None:
    bad = parse_schedule("0B0 0F0")
    err = _reject(bad)
    assert str(err) == "rank 0 step 0: 0B0 runs before 0F0 (step 1)"
    assert "[0B0]" in err.detail


def test_swapped_actions_are_rejected() -> None:
    def swap(acts):  # rank 1 of dapple(3, 4): 1F0 1F1 1B0 ... -> 1B0 before 1F0
        acts[0], acts[2] = acts[2], acts[0]

    err = _reject(_edit(generate("dapple", 3, 4), 1, swap))
    assert str(err).startswith("rank 1 step 0: 1B0 runs before 1F0")
    assert "[1B0]" in err.detail


def test_deleted_forward_is_rejected() -> None:
    def delete(acts):
        acts.remove(next(a for a in acts if str(a) == "2F1"))

    err = _reject(_edit(generate("dapple", 4, 4), 2, delete))
    assert str(err) == "stage 2 micro-batch 1: forward missing (no 2F1)"
    assert "[2B1]" in err.detail  # the grid points at the action left without its forward


def test_deleted_weight_gradient_is_rejected() -> None:
    def delete(acts):
        acts.remove(next(a for a in acts if str(a) == "1W2"))

    err = _reject(_edit(generate("zb-h1", 3, 4), 1, delete))
    assert "stage 1 micro-batch 2: weight gradient missing" in str(err)


def test_duplicated_action_is_rejected() -> None:
    err = _reject(_edit(generate("gpipe", 2, 3), 0, lambda acts: acts.insert(3, acts[1])))
    assert str(err) == "rank 0 step 3: 0F1 is a duplicate of step 1"
    assert "[0F1]" in err.detail


def test_action_on_wrong_rank_is_rejected() -> None:
    bad = replace(generate("gpipe", 2, 1), stage_ranks=(0, 0))
    err = _reject(bad)
    assert str(err) == "rank 1 step 0: 1F0 is on rank 1 but stage 1 runs on rank 0"


def test_out_of_range_microbatch_is_rejected() -> None:
    bad = replace(parse_schedule("0F0 0B0 0F1 0B1"), num_microbatches=1)
    err = _reject(bad)
    assert "0F1 names micro-batch 1, valid micro-batches are 0..0" in str(err)


def test_full_and_split_backward_together_are_rejected() -> None:
    err = _reject(parse_schedule("0F0 0B0 0I0 0W0"))
    assert "0I0 splits a backward that 0B0 already runs in full" in str(err)


def test_cross_rank_cycle_is_a_deadlock_marked_in_the_grid() -> None:
    # Rank 1 starts with 1F1, which needs 0F1 — stuck behind 0B0, which needs 1B0.
    bad = parse_schedule("0F0 0B0 0F1 0B1\n1F1 1B1 1F0 1B0")
    err = _reject(bad)
    assert str(err) == (
        "rank 1 step 0: 1F1 waits for 0F1 (rank 0 step 2), which never runs (deadlock)"
    )
    lines = err.detail.splitlines()
    assert lines[0].split() == ["step", "0", "1", "2", "3"]
    assert lines[2].split() == ["rank", "1", "[1F1]", "1B1", "1F0", "1B0"]
    assert lines[3].index("^") == lines[2].index("[1F1]") + 1


def test_same_rank_stages_in_wrong_order_deadlock() -> None:
    # Two stages on one rank: stage 1's forward cannot run before stage 0's.
    err = _reject(parse_schedule("1F0 0F0 1B0 0B0"))
    assert "1F0 waits for 0F0 (rank 0 step 1), which never runs (deadlock)" in str(err)


def test_lowered_deadlock_names_the_receive() -> None:
    bad = lower(parse_schedule("0F0 0B0 0F1 0B1\n1F1 1B1 1F0 1B0"))
    err = _reject(bad)
    assert "RECV" in str(err) and "(deadlock)" in str(err)
    assert "[" in err.detail


def test_lowered_schedule_missing_receive_is_rejected() -> None:
    lowered = lower(generate("dapple", 2, 2))
    err = _reject(_edit(lowered, 1, lambda acts: acts.remove(acts[0])))  # 1RECV_F0
    assert "1SEND_F0" not in str(err)
    assert "0SEND_F0 has no matching 1RECV_F0 on rank 1" in str(err)


def test_lowered_send_before_its_compute_is_rejected() -> None:
    lowered = lower(generate("dapple", 2, 2))

    def swap(acts):  # 0F0 0SEND_F0 -> 0SEND_F0 0F0
        acts[0], acts[1] = acts[1], acts[0]

    err = _reject(_edit(lowered, 0, swap))
    assert str(err) == "rank 0 step 0: 0SEND_F0 is issued before 0F0 (step 1) computes it"


def test_reduce_grad_before_last_backward_is_rejected() -> None:
    lowered = lower(generate("gpipe", 1, 2))  # 0F0 0F1 0B0 0B1 0REDUCE_GRAD
    err = _reject(_edit(lowered, 0, lambda acts: acts.insert(3, acts.pop())))
    assert str(err) == (
        "rank 0 step 3: 0REDUCE_GRAD runs before the stage's last backward 0B1 (step 4)"
    )


def test_send_without_cross_rank_partner_is_rejected() -> None:
    bad = parse_schedule("0F0 0SEND_F0 1F0 1B0 0B0")  # both stages on rank 0
    err = _reject(bad)
    assert "0SEND_F0 has no partner: stage 1 is not on another rank" in str(err)


def test_long_schedules_show_a_window_around_the_culprit() -> None:
    big = generate("dapple", 4, 64)
    bad = _edit(big, 3, lambda acts: acts.insert(100, acts.pop(101)))  # 3B50 before 3F50
    err = _reject(bad)
    assert str(err).startswith("rank 3 step 100: 3B50 runs before 3F50")
    assert "[3B50]" in err.detail
    assert "(steps 88..112 of 0..127)" in err.detail
    assert len(err.detail.splitlines()) == 1 + 4 + 1 + 1


def test_format_grid_has_ranks_as_rows() -> None:
    grid = format_grid(generate("gpipe", 2, 1))
    assert grid.splitlines() == [
        "step     0    1",
        "rank 0  0F0  0B0",
        "rank 1  1F0  1B0",
    ]


def test_dry_run_handles_thousands_of_microbatches() -> None:
    # O(actions): 8 ranks x 4096 micro-batches, compute-only and lowered.
    schedule = generate("dapple", 8, 4096)
    check_schedule(schedule)
    late = _edit(schedule, 7, lambda acts: acts.insert(len(acts) - 1, acts.pop(0)))
    err = _reject(late)  # 7F0 moved to the end: the last stage's 7B0 now comes before it
    assert str(err).startswith("rank 7 step 0: 7B0 runs before 7F0")
