"""``dapple-plan --objective``: the cluster-size ladder, the choice under a deadline or budget, the command."""

from __future__ import annotations

import json

import pytest

from conftest import REPO
from planner.cli import main
from planner.search.capacity import SizeRow, choose, size_ladder
from sim.core.errors import DappleError
from sim.core.run_estimate import RunEstimate, RunTotals
from sim.input.scenario import load_scenario

DAY_S = 86400.0
TINY = str(REPO / "scenarios" / "gpt_tiny_cpu.yaml")


def test_the_ladder_is_powers_of_two_of_servers_plus_the_largest_and_its_smooth_subset():
    bert = REPO / "scenarios" / "bert48_v100_2x8.yaml"
    assert size_ladder(load_scenario(bert, {"cluster.nodes": "8"})) == (8, 16, 32, 64)
    assert size_ladder(load_scenario(bert, {"cluster.nodes": "12"})) == (8, 16, 32, 64, 96)
    # 11 servers is prime: 10 (2 x 5) is planned too, as planner.search.subsets would
    assert size_ladder(load_scenario(bert), max_devices=88) == (8, 16, 32, 64, 80, 88)
    assert size_ladder(load_scenario(TINY)) == (1, 2)  # one server: its GPUs
    with pytest.raises(DappleError, match="--max-gpus 20: give whole servers of 8 GPUs"):
        size_ladder(load_scenario(bert), max_devices=20)


def _row(devices: int, days: float, cost: float | None, mwh: float = 1.0) -> SizeRow:
    totals = RunTotals(time_s=days * DAY_S, gpu_hours=devices * days * 24, cost=cost, energy_kwh=mwh * 1e3,
                       carbon_kg=None)
    estimate = RunEstimate(steps=1, tokens=None, iteration_time_s=1.0, devices=devices, busy_share=1.0,
                           failure_free=totals, expected=totals)
    return SizeRow(devices=devices, nodes=devices // 8, best=None, planner="dapple", estimate=estimate)


ROWS = (_row(8, 60.0, 100.0, 5.0), _row(16, 31.0, 105.0, 4.0), _row(32, 16.0, 120.0, 4.5), _row(64, 9.0, 160.0, 6.0))


def test_cost_picks_the_cheapest_size_that_meets_the_deadline_and_names_the_next_smaller():
    choice = choose(ROWS, "cost", deadline_s=30 * DAY_S)
    assert choice.chosen.devices == 32  # 16 GPUs is cheaper but takes 31 days
    assert choice.reason == ("32 GPUs: 16 days within the 30 d deadline, at the lowest cost, 120; "
                             "16 GPUs would take 31 days for 105")
    assert choose(ROWS, "cost").chosen.devices == 8  # no deadline: the cheapest of all


def test_time_picks_the_fastest_within_budget_and_energy_the_least_within_deadline():
    assert choose(ROWS, "time").chosen.devices == 64
    within = choose(ROWS, "time", budget=130.0)
    assert within.chosen.devices == 32 and within.reason.endswith("64 GPUs would take 9 days for 160")
    assert choose(ROWS, "energy").chosen.devices == 16  # 4.0 MWh, the least; ties would go to fewer GPUs
    assert choose(ROWS, "energy", deadline_s=20 * DAY_S).chosen.devices == 32


def test_an_infeasible_deadline_or_budget_says_so_in_one_line():
    late = choose(ROWS, "cost", deadline_s=5 * DAY_S)
    assert late.chosen is None and late.reason == "no size meets the 5 d deadline: the fastest, 64 GPUs, takes 9 days"
    poor = choose(ROWS, "time", budget=50.0)
    assert poor.chosen is None and poor.reason.startswith("no size meets the budget of 50: the cheapest, 8 GPUs")
    with pytest.raises(DappleError, match="--budget needs a price: set cluster.price_per_gpu_hour"):
        choose([_row(8, 1.0, None)], "time", budget=10.0)


def test_the_command_plans_each_size_prints_the_choice_and_writes_its_plan(tmp_path, capsys):
    args = [TINY, "--set", "training.tokens=100M", "--set", "cluster.nodes=4", "--set",
            "cluster.price_per_gpu_hour=1", "--planner", "dapple", "--objective", "time", "-q"]
    assert main(args + ["--json", "--out", str(tmp_path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["devices"] for s in data["sizes"]] == [2, 4, 8]
    fastest = min(data["sizes"], key=lambda s: s["run"]["failure_free"]["time_s"])
    assert data["chosen_devices"] == fastest["devices"]
    for size in data["sizes"]:  # the run is the core's: steps x the plan's iteration
        run = size["run"]
        assert run["failure_free"]["time_s"] == pytest.approx(run["steps"] * size["metrics"]["iteration_time_s"])
    assert json.loads((tmp_path / "best_plan.json").read_text()) == \
        next(s["plan"] for s in data["sizes"] if s["devices"] == data["chosen_devices"])
    assert main(args + ["--deadline", "1s"]) == 2
    assert capsys.readouterr().out.splitlines()[-1].startswith("no size meets the 1s deadline: the fastest, ")
    assert main([TINY, "--objective", "cost", "-q"]) == 2  # no run length: one line on stderr
    assert "needs a run length" in capsys.readouterr().err
