"""Issue 35's rough edges, each as a new user met it: what a log, a usage line, a doc, a CSV,
an override, a sweep file's typo and a sweep table's schedule column say now."""

from __future__ import annotations

import csv
import io
import re

import pytest

from conftest import REPO, SCENARIOS
from planner.cli import USAGE, _parser
from planner.cli import main as plan_main
from planner.sweeps.command import sweep_parser
from planner.sweeps.file import SweepError, schedule_column, sweep_from_dict
from runtime.model.config import RUNNABLE_PRESETS
from sim.engine.run import run_scenario
from sim.input.plan_file import schedule_text
from sim.input.scenario import load_scenario

BERT = str(SCENARIOS / "bert48_v100_2x8.yaml")
SWEEP_BASE = BERT  # a sweep's base scenario (absolute: read from anywhere)


def test_dapple_plan_v_says_the_device_classes_a_few_times_not_once_per_replay(capsys):
    # the dp planner alone replays 8 candidates on the fast path and 2 in SimPy: 10 INFO lines before
    assert plan_main([BERT, "-v", "--planner", "dp"]) == 0
    err = capsys.readouterr().err
    assert "plan with dp" in err  # -v did turn INFO on
    assert sum("devices in" in line for line in err.splitlines()) <= 2


def test_dapple_plans_usage_lines_name_every_option_its_parsers_take():
    plan_usage, sweep_usage = USAGE.split("dapple-plan sweep")
    for parser, usage in ((_parser(), plan_usage), (sweep_parser(), sweep_usage)):
        words = set(usage.replace("[", " ").replace("]", " ").replace("|", " ").split())
        missing = [action.option_strings for action in parser._actions
                   if action.option_strings and not words.intersection(action.option_strings)]
        assert not missing, (usage, missing)


def test_scenario_md_names_the_presets_dapple_run_runs_for_real():
    text = " ".join((REPO / "docs" / "scenario.md").read_text().split())
    sentence = text[text.index("`dapple-run` runs the "):].split(" presets for real")[0]
    assert set(re.findall(r"`(\w+)`", sentence)) == set(RUNNABLE_PRESETS)


def test_events_csv_writes_micro_batch_numbers_as_integers():
    result = run_scenario(load_scenario(BERT), engine="fast")
    rows = list(csv.DictReader(io.StringIO(result.events().to_csv(index=False))))
    numbers = {row["microbatch"] for row in rows}
    # BERT-48's plan runs micro-batches 0..M-1; OPTIM and the all-reduces have none (an empty cell)
    expected = {str(m) for m in range(result.summarize().num_microbatches)} | {""}
    assert numbers == expected
    assert any(row["kind"] == "OPTIM" and row["microbatch"] == "" for row in rows)


def test_set_creates_the_optimizer_mapping_a_file_leaves_out():
    path = SCENARIOS / "bert48_v100_15to1.yaml"
    assert "optimizer" not in path.read_text()
    model = load_scenario(path, {"model.optimizer.implementation": "foreach"}).model
    assert (model.optimizer, model.optimizer_implementation) == ("adam", "foreach")
    # a mapping without a name keeps the model's default optimizer: the vgg preset's is momentum
    vgg = load_scenario(path, {"model": "{preset: vgg, depth: 19, optimizer: {implementation: foreach}}"},
                        ignore_plan=True).model
    assert (vgg.optimizer, vgg.optimizer_implementation) == ("momentum", "foreach")


@pytest.mark.parametrize(("data", "message"), [
    ({"base": SWEEP_BASE, "axis": {}}, "axis: unknown key; did you mean 'axes'?"),
    ({"base": SWEEP_BASE, "mode": "simulat"}, "mode: unknown value 'simulat'; did you mean 'simulate'?"),
    ({"base": SWEEP_BASE, "axes": {"clustr.inter_node.bandwidth": ["10Gb/s"]}},
     "is not a scenario key (sections: name, cluster, model, training, plan, faults, reliability) nor engine; "
     "did you mean 'cluster.inter_node.bandwidth'?"),
    ({"base": SWEEP_BASE, "engine": "fats"}, "engine: unknown value 'fats'; did you mean 'fast'?"),
    ({"base": SWEEP_BASE, "mode": "plan", "options": {"max_candidate": 10}},
     "options.max_candidate: unknown planner option; did you mean 'max_candidates'?"),
    ({"base": SWEEP_BASE, "mode": "plan", "axes": {"planner": ["dapple", "megatorn"]}},
     "axes.planner[1]: unknown planner 'megatorn'; did you mean 'megatron'?"),
    ({"base": SWEEP_BASE, "plots": [{"figure": "oom_frontier", "gpu": "x"}]},
     "plots[0].gpu: unknown argument of oom_frontier; did you mean 'gpus'?"),
])
def test_a_sweep_key_or_name_typo_gets_a_did_you_mean(data, message):
    with pytest.raises(SweepError) as info:
        sweep_from_dict(data, source="test.yaml")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_sweeps_schedule_column_writes_every_schedule_as_the_planners_table_does():
    sweep = sweep_from_dict({"base": SWEEP_BASE, "axes": {"plan.schedule": [
        "gpipe", {"name": "dapple", "policy": "2(s-i)-1"}, {"name": "interleaved", "chunks": 2}]}}, source="t.yaml")
    assert [dict(p.columns)["plan.schedule"] for p in sweep.points] == [
        "gpipe", "dapple/2(s-i)-1", "interleaved/chunks=2"]
    # a plan-mode row's schedule is a plan file's (plan_to_dict): a name, or a name and its parameters
    assert schedule_column("zb-h1") == "zb-h1"
    assert schedule_column({"name": "interleaved", "chunks": 3}) == "interleaved/chunks=3" == schedule_text(
        {"chunks": 3, "name": "interleaved"})
    assert schedule_column([1, 2]) == "[1, 2]"  # no schedule: its JSON, for the reader to refuse
