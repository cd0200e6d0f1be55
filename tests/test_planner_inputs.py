"""What the planner takes from a scenario: not its plan; and the data-parallel baseline's order."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

from conftest import SCENARIOS
from planner.cli import main as plan_main
from planner.planners.baselines import dp_planner
from planner.search.space import PlannerOptions
from sim.core.parallelism import Sharding
from sim.input.scenario import load_scenario

BERT = str(SCENARIOS / "bert48_v100_2x8.yaml")


def test_the_planner_ignores_the_scenarios_plan_and_says_so(capsys):
    # the scenario's plan uses devices 8-15, which one server does not have
    out = io.StringIO()
    with redirect_stdout(out):
        assert plan_main([BERT, "--set", "cluster.nodes=1", "--planner", "dp", "--json"]) == 0
    report = json.loads(out.getvalue())
    assert max(max(stage["devices"]) for stage in report["best"]["stages"]) == 7
    assert report["scenario_plan_ignored"] is True
    out = io.StringIO()
    with redirect_stdout(out):
        assert plan_main([BERT, "--planner", "dp"]) == 0
    assert "the scenario's own plan is ignored" in out.getvalue().splitlines()[0]
    assert load_scenario(BERT, ignore_plan=True).plan is None and load_scenario(BERT, ignore_plan=True).ignored_plan


def test_data_parallelism_accumulates_one_forward_and_one_backward_at_a_time():
    # 10 GiB per V100: BERT-48's states leave room for half the batch's activations at once
    # (unsharded: ZeRO would make room for the whole batch)
    found = dp_planner(load_scenario(BERT, {"cluster.device.memory": "10GiB", "cluster.device.memory_reserved": "0B"}, ignore_plan=True),
                       PlannerOptions(sharding=(Sharding.NONE,)))
    summary = found.best.summary
    assert found.best.candidate.num_stages == 1 and summary.num_microbatches > 1
    # 1F1B on one stage: only one micro-batch's activations are alive at a time
    assert all(d.peak_activation_microbatches == 1 for d in summary.devices)


def test_a_non_positive_microbatch_size_is_one_line(capsys):
    assert plan_main([BERT, "--microbatch-size", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "dapple-plan: error: --microbatch-size 0: give a positive number of samples per micro-batch"


def test_an_unwritable_out_file_is_one_line(tmp_path, capsys):
    (tmp_path / "best_plan.json").mkdir()
    assert plan_main([BERT, "--planner", "dp", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("best_plan.json: cannot write plan file (it is a folder, not a file; remove it or "
                            "choose another --out)")
