"""A plan's schedule: the new generators on a plan's device sets, V-shaped placement, and
hand-written schedule files in torch's CSV as well as in our text."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import SCENARIOS
from sim.core.errors import ScenarioError, ScheduleError, SpecError
from sim.core.plan import PlanSpec, StageSpec, check_plan
from sim.schedule import generate, lower, to_csv
from sim.schedule.plan_schedule import parse_schedule_for_plan, schedule_for_plan


def _plan(sets: list[int], schedule: str, **params) -> PlanSpec:
    """One layer per stage; stage s on device set ``sets[s]`` (devices 2k and 2k+1)."""
    stages = tuple(StageSpec(layers=(s, s + 1), devices=(2 * k, 2 * k + 1)) for s, k in enumerate(sets))
    return PlanSpec(stages=stages, schedule=schedule, schedule_params=tuple(sorted(params.items())))


V3 = [0, 1, 2, 2, 1, 0]  # 3 device sets, 6 stages in a V


@pytest.mark.parametrize("name", ["zb-v", "dualpipe-v"])
def test_a_v_shaped_plan_runs_its_generator(name) -> None:
    plan = _plan(V3, name)
    check_plan(plan, num_layers=6, num_devices=6)
    assert plan.stage_ranks == (0, 1, 2, 2, 1, 0)
    assert schedule_for_plan(plan, 6) == generate(name, 3, 6)


@pytest.mark.parametrize("name", ["zb-v", "dualpipe-v"])
def test_a_v_shaped_schedule_needs_the_v(name) -> None:
    with pytest.raises(SpecError, match=r"stage s on device set s and stage 2R-1-s .* order \[0, 1, 2, 2, 1, 0\]"):
        check_plan(_plan([0, 1, 2, 0, 1, 2], name), num_layers=6, num_devices=6)
    with pytest.raises(SpecError, match=r"3 device sets take 6 stages"):
        check_plan(_plan([0, 1, 2], name), num_layers=3, num_devices=6)


@pytest.mark.parametrize("name", ["interleaved-zb", "looped-bfs"])
def test_looped_plans_imply_their_chunks(name) -> None:
    plan = _plan([0, 1, 0, 1, 0, 1], name)
    check_plan(plan, num_layers=6, num_devices=4)
    assert schedule_for_plan(plan, 4) == generate(name, 2, 4, chunks=3)
    with pytest.raises(ScheduleError, match=r"chunks: 2 given, but the plan's 6 stages over 2 device sets make 3"):
        schedule_for_plan(_plan([0, 1, 0, 1, 0, 1], name, chunks=2), 4)


def test_only_multi_chunk_schedules_share_device_sets() -> None:
    with pytest.raises(SpecError, match=r"only the interleaved schedule \(or dualpipe-v, interleaved-zb, looped-bfs, "
                                        r"zb-v, or a schedule_file\) supports, not 'zb-h1'"):
        check_plan(_plan([0, 1, 0, 1], "zb-h1"), num_layers=4, num_devices=4)


def test_auto_needs_the_stage_policies_its_caller_chose() -> None:
    plan = _plan([0, 1, 2], "dapple", policy="auto")
    with pytest.raises(ScheduleError, match=r"policy 'auto' picks s-i or 2\(s-i\)-1 per stage"):
        schedule_for_plan(plan, 8)
    chosen = ("2(s-i)-1", "2(s-i)-1", "s-i")
    assert schedule_for_plan(plan, 8, stage_policies=chosen) == generate("dapple", 3, 8, policy=chosen)
    with pytest.raises(ScheduleError, match=r"stage_policies given, but the plan's policy is 's-i'"):
        schedule_for_plan(_plan([0, 1, 2], "dapple", policy="s-i"), 8, stage_policies=chosen)


@pytest.mark.parametrize("lowered", [False, True])
@pytest.mark.parametrize("path", ["v.csv", "v.txt", None])
def test_a_schedule_file_may_be_torch_s_csv(path, lowered) -> None:
    schedule = generate("dualpipe-v", 3, 6)
    schedule = lower(schedule) if lowered else schedule
    plan = replace(_plan(V3, "file"), schedule_file=path)
    text = to_csv(schedule)  # told apart by its suffix, or by its commas
    assert parse_schedule_for_plan(plan, 6, text).ranks == schedule.ranks
    if path != "v.csv":
        assert parse_schedule_for_plan(plan, 6, str(schedule)).ranks == schedule.ranks
    else:  # a .csv file is read as CSV, and a line of the text form is one bad cell
        with pytest.raises(ScheduleError, match=r"v\.csv row 1 column 1: .* holds several actions; a CSV cell"):
            parse_schedule_for_plan(plan, 6, str(schedule))


def test_a_csv_schedule_file_that_does_not_fit_names_rows() -> None:
    plan = replace(_plan([0, 1], "file"), schedule_file="two.csv")
    with pytest.raises(ScheduleError, match=r"two\.csv has 3 rows \(ranks\) but the plan has 2 device sets"):
        parse_schedule_for_plan(plan, 4, to_csv(generate("gpipe", 3, 4)))


def test_a_scenario_reads_a_csv_schedule_file(tmp_path) -> None:
    from sim.input.scenario import load_scenario

    source = SCENARIOS / "bert48_v100_hand_written.yaml"
    text = source.read_text().replace("schedules/gpipe_then_1f1b_4x4.txt", "gpipe_then_1f1b_4x4.csv")
    written = (SCENARIOS / "schedules" / "gpipe_then_1f1b_4x4.txt").read_text()
    from sim.schedule import parse_schedule

    (tmp_path / "gpipe_then_1f1b_4x4.csv").write_text(to_csv(parse_schedule(written)), newline="")
    (tmp_path / "profiles").symlink_to(SCENARIOS.parent / "profiles")
    scenario_path = tmp_path / "hand_written.yaml"
    scenario_path.write_text(text)
    scenario = load_scenario(scenario_path)
    assert str(scenario.plan.custom_schedule) == str(parse_schedule(written))
    (tmp_path / "gpipe_then_1f1b_4x4.csv").write_text("0F0,0F1\n", newline="")
    with pytest.raises(ScenarioError, match=r"plan\.schedule_file: gpipe_then_1f1b_4x4\.csv has 1 rows"):
        load_scenario(scenario_path)
