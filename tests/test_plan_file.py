"""A plan file holds the plan alone; its metrics sit beside it; old files with metrics still read."""

from __future__ import annotations

import contextlib
import io
import json
import logging

import pytest

from conftest import SCENARIOS
from planner.cli import main as plan_main
from sim.app.cli import main as sim_main
from sim.core.errors import ScenarioError
from sim.engine.run import run_scenario
from sim.input.plan_file import LEGACY_METRIC_KEYS, PLAN_KEYS, plan_to_dict, read_plan_file
from sim.input.scenario import load_scenario

BERT = SCENARIOS / "bert48_v100_2x8.yaml"
METRIC_KEYS = {"description", "layout", "placement", "planner", "iteration_time_s", "throughput_samples_per_s",
               "peak_memory_bytes", "speedup_over_dp", "summary", "tokens_per_s", "mfu", "tensor_parallel",
               "context_parallel", "pipeline_parallel", "chunks", "data_parallel", "data_parallel_min", "devices_used",
               "idle_devices"}


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """``dapple-plan --out`` and ``--json`` of one quick planner on BERT-48."""
    out = tmp_path_factory.mktemp("plan")
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert plan_main([str(BERT), "--planner", "even", "--json", "--out", str(out), "-q"]) == 0
    return out, json.loads(text.getvalue())


def test_a_new_plan_file_holds_the_plan_alone_and_its_metrics_beside_it(planned):
    out, report = planned
    plan = json.loads((out / "best_plan.json").read_text())
    metrics = json.loads((out / "best_plan_metrics.json").read_text())
    assert set(plan) <= PLAN_KEYS and not set(plan) & LEGACY_METRIC_KEYS
    assert set(metrics) == METRIC_KEYS and metrics["planner"] == "even"
    assert report["best"] == plan and report["best_metrics"] == metrics
    entry = report["planners"]["even"]
    assert entry["plan"] == plan and set(entry["metrics"]) == METRIC_KEYS - {"planner"}


def test_plan_file_to_scenario_replays_to_the_planners_time(planned, tmp_path, capsys):
    out, report = planned
    plan = read_plan_file(out / "best_plan.json")
    scenario = load_scenario(BERT, plan=plan)
    # the plan read back is the plan written: plan_to_dict of the merged scenario gives it again
    assert plan_to_dict(scenario.plan, scenario.training) == plan
    replayed = run_scenario(scenario).summarize()
    assert replayed.iteration_time_s == pytest.approx(report["best_metrics"]["iteration_time_s"], rel=1e-12)
    # and the command line reads the same file (and the whole --json output) to the same result
    assert sim_main(["simulate", str(BERT), "--plan", str(out / "best_plan.json"), "--json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    whole = tmp_path / "report.json"
    whole.write_text(json.dumps(report))
    assert sim_main(["simulate", str(BERT), "--plan", str(whole), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == from_file
    assert from_file["iteration_time_s"] == replayed.iteration_time_s


def test_an_old_plan_file_with_metrics_reads_with_a_note(planned, tmp_path, caplog):
    out, report = planned
    plan = report["best"]
    old = tmp_path / "plan.json"
    old_metrics = {k: v for k, v in report["best_metrics"].items() if k in LEGACY_METRIC_KEYS}
    old.write_text(json.dumps({**plan, **old_metrics}))  # as dapple-plan wrote best_plan.json before
    with caplog.at_level(logging.INFO, logger="sim.input.plan_file"):
        assert read_plan_file(old) == plan
    notes = [r.getMessage() for r in caplog.records if r.name == "sim.input.plan_file"]
    assert len(notes) == 1
    assert notes[0].startswith(f"{old}: metrics keys description, iteration_time_s, layout, peak_memory_bytes, "
                               "placement, planner, speedup_over_dp, throughput_samples_per_s are ignored; "
                               "plan files now hold the plan alone (metrics are in best_plan_metrics.json")
    # an old --json output (best held its metrics) reads as its plan too
    old.write_text(json.dumps({"best": {**plan, "iteration_time_s": 1.0}, "planners": {}}))
    assert read_plan_file(old) == plan
    # a new file reads without a note
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sim.input.plan_file"):
        read_plan_file(out / "best_plan.json")
    assert not [r for r in caplog.records if r.name == "sim.input.plan_file"]


def test_a_metric_key_handed_to_the_scenario_directly_is_an_unknown_plan_key(planned):
    _, report = planned
    with pytest.raises(ScenarioError, match="iteration_time_s: unknown plan key"):
        load_scenario(BERT, plan={**report["best"], "iteration_time_s": 1.0})
