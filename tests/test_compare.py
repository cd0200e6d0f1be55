"""``dapple-sim compare``: one plan replayed under several schedules, each on its placement."""

from __future__ import annotations

import json

import pytest

from conftest import SCENARIOS
from sim.app.cli import main
from sim.app.compare import plan_variants, run_variants
from sim.input.scenario import load_scenario
from sim.schedule.vshape import v_stage_ranks

BERT48 = str(SCENARIOS / "bert48_v100_2x8.yaml")
ASKED = ["gpipe", "dapple", "interleaved", "zb-h1", "zb-v", "dualpipe-v"]


@pytest.fixture(scope="module")
def bert48():
    scenario = load_scenario(BERT48)
    variants = plan_variants(scenario, ASKED)
    rows, results = run_variants(scenario, variants, engine="fast")
    return scenario, variants, rows, results


def test_rows_have_the_schedules_asked_for(bert48) -> None:
    _, _, rows, results = bert48
    assert [row["schedule"] for row in rows] == ASKED
    assert all(row["error"] is None and row["iteration_time_s"] > 0 for row in rows)
    assert set(results) == set(ASKED)
    assert all(row["oom"] is False and row["peak_memory_bytes"] > 0 for row in rows)


def test_dapple_is_no_slower_than_gpipe(bert48) -> None:
    rows = {row["schedule"]: row for row in bert48[2]}
    # on two stages the two can tie; 1e-9 absorbs the summation order (as tests/test_dapple_auto.py)
    assert rows["dapple"]["iteration_time_s"] <= rows["gpipe"]["iteration_time_s"] * (1 + 1e-9)


def test_each_schedule_gets_its_placement(bert48) -> None:
    scenario, variants, _, _ = bert48
    num_ranks = len(scenario.plan.device_groups)
    plans = {v.schedule: v.plan for v in variants}
    for name in ("zb-v", "dualpipe-v"):
        assert plans[name].schedule == name
        assert plans[name].stage_ranks == v_stage_ranks(num_ranks) == (0, 1, 1, 0)
        assert plans[name].device_groups == scenario.plan.device_groups
    assert plans["interleaved"].stage_ranks == (0, 1, 0, 1)
    # one stage per device set keeps the plan's own layer cuts
    assert plans["gpipe"].stages == scenario.plan.stages


def test_an_impossible_schedule_is_a_row_with_its_reason(capsys) -> None:
    # M = 128 / 64 = 2 micro-batches, but dualpipe-v needs M >= 2R = 4
    args = ["compare", BERT48, "--schedules", "dapple,dualpipe-v", "--set", "training.microbatch_size=64",
            "--engine", "fast", "--json"]
    assert main(args) == 0
    rows = {row["schedule"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["dapple"]["error"] is None
    assert rows["dualpipe-v"]["iteration_time_s"] is None
    assert "fewer than the 4 stages" in rows["dualpipe-v"]["error"]


def test_out_writes_the_figure_and_the_rows(tmp_path, capsys) -> None:
    out = tmp_path / "cmp"
    assert main(["compare", BERT48, "--schedules", "gpipe,zb-v", "--engine", "fast", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "gpipe" in text and "zb-v" in text
    assert (out / "schedules.png").stat().st_size > 0
    assert [row["schedule"] for row in json.loads((out / "compare.json").read_text())] == ["gpipe", "zb-v"]


def test_an_unknown_schedule_exits_2_with_one_line(capsys) -> None:
    assert main(["compare", BERT48, "--schedules", "dapple,zb-x"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "'zb-x'" in err and "dualpipe-v" in err and "gpipe" in err


def test_a_looped_plan_keeps_its_chunks_and_its_own_schedule_runs():
    # GPT-3 175B, interleaved with 3 chunks on 8 ranks: 24 stages, not 16, and its own schedule not refused
    scenario = load_scenario(SCENARIOS / "gpt3_175b_a100_tp8_pp8.yaml")
    variants = {v.schedule: v for v in plan_variants(scenario, ("interleaved", "looped-bfs", "gpipe"))}
    assert all(v.error is None for v in variants.values()), {k: v.error for k, v in variants.items()}
    assert variants["interleaved"].plan == scenario.plan  # the scenario's own plan, unchanged
    assert variants["looped-bfs"].plan.num_stages == 24 and dict(variants["looped-bfs"].plan.schedule_params) == {
        "chunks": 3}
    assert variants["gpipe"].plan.num_stages == 8


def test_compare_takes_no_contention_as_simulate_does(capsys):
    assert main(["compare", BERT48, "--schedules", "gpipe,dapple", "--no-contention", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["schedule"] for r in rows] == ["gpipe", "dapple"] and all(r["error"] is None for r in rows)
