"""The planner's answer depends on the scenario only: budgets count work, never seconds; a
candidate that cannot run is a rejection of a kind, counted by kind in the report."""

from __future__ import annotations

import io
import itertools
import json
import time
from contextlib import redirect_stdout
from dataclasses import replace

import pytest

from conftest import SCENARIOS
from planner.cli import main as plan_main
from planner.planners.dapple import dapple_planner
from planner.search.evaluation import RejectionKind, count_rejections, evaluate, evaluation_row
from planner.search.ranking import settle
from planner.search.space import Candidate, PlannerOptions
from sim.input.scenario import load_scenario

VGG = str(SCENARIOS / "vgg19_v100_16x1.yaml")
BERT = str(SCENARIOS / "bert48_v100_2x8.yaml")
TIMING = ("search_time_s", "wall_s")


def _plan_json(argv) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert plan_main(argv) == 0
    return json.loads(out.getvalue())


def _without_timing(value):
    if isinstance(value, dict):
        return {k: _without_timing(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [_without_timing(v) for v in value]
    return value


def test_plan_json_is_the_same_on_a_fast_and_a_very_slow_machine(monkeypatch):
    # VGG-19 on 16 V100s: with a budget of seconds, a machine 10^4 times slower replayed only
    # the first few candidates and chose a different plan (layers 0-12 x 11 | 13-19 x 4 | 20-25 x 1)
    fast = _plan_json([VGG, "--planner", "dapple", "--json"])
    ticks = itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: 10.0 * next(ticks))  # every look at the clock: +10 s
    slow = _plan_json([VGG, "--planner", "dapple", "--json"])
    assert slow["search_time_s"] >= 20.0  # the fake clock did reach the planner
    assert json.dumps(_without_timing(slow), sort_keys=True) == json.dumps(_without_timing(fast), sort_keys=True)


def test_the_fast_path_budget_counts_replayed_actions():
    scenario = load_scenario(VGG)
    none = dapple_planner(scenario, PlannerOptions(fast_budget_ops=0))
    some = dapple_planner(scenario, PlannerOptions(fast_budget_ops=5_000))
    more = dapple_planner(scenario, PlannerOptions())
    # the settling rounds' fast replays: those before the first engine verdict (the schedule
    # variants of the leader come after)
    ranked = [r.evaluations[:next(i for i, e in enumerate(r.evaluations) if e.engine == "simpy")]
              for r in (none, some, more)]
    replays = [len(fast) for fast in ranked]
    assert replays[0] < replays[1] < replays[2]
    assert "replayed actions (5,000)" in some.spend.reached
    # beyond the must-replay set, replays stop at the first one that reaches the budget
    beyond = [e.replayed_ops for e in ranked[1]][replays[0]:]
    assert sum(beyond[:-1]) < 5_000 <= sum(beyond)
    assert all(e.replayed_ops > 0 for e in some.evaluations if e.ok)


def test_rejections_have_a_kind_and_the_report_counts_them(tmp_path):
    scenario = load_scenario(BERT)
    layers = scenario.model.num_layers
    tiny = replace(scenario, cluster=replace(scenario.cluster, device=replace(scenario.cluster.device,
                                                                              memory_bytes=2**30,
                                                                              memory_reserved_bytes=0.0)))
    fits = Candidate(bounds=(0, 27, layers), replicas=(8, 8), microbatch_size=16)
    oom = evaluate(tiny, fits)
    assert oom.rejection.kind is RejectionKind.OUT_OF_MEMORY and "runs out of memory" in oom.rejected
    # counted before any replay (planner.search.memory): no summary, the estimate says how much
    assert oom.summary is None and oom.plan is not None and oom.memory_bytes > 2**30
    too_many = evaluate(scenario, replace(fits, replicas=(16, 16)))
    assert too_many.rejection.kind is RejectionKind.INVALID_PLAN and too_many.summary is None
    assert too_many.iteration_time_s == float("inf") and too_many.peak_memory_bytes == 0.0
    # six stages over three device sets make two chunks, not the three the schedule names
    chunked = Candidate(bounds=(0, 9, 18, 27, 36, 45, layers), replicas=(5, 5, 5, 5, 5, 5), microbatch_size=16,
                        schedule="interleaved", chunks=2, params=(("chunks", 3),))
    bad_schedule = evaluate(scenario, chunked)
    assert bad_schedule.rejection.kind is RejectionKind.INVALID_SCHEDULE, bad_schedule.rejected
    good = evaluate(scenario, fits)
    assert good.ok and good.rejection is None and good.summary.iteration_time_s == good.iteration_time_s
    assert count_rejections([oom, too_many, bad_schedule, good, oom]) == {
        "invalid_plan": 1, "invalid_schedule": 1, "out_of_memory": 2}
    nothing = settle("dapple", tiny, [fits], PlannerOptions(), started=time.perf_counter())
    assert nothing.best is None and nothing.note.startswith("no plan fits: the smallest peak found is 4.999GiB per device of 1GiB")
    assert nothing.note.endswith("(1 out of memory)")


@pytest.mark.slow  # a plan and a one-point sweep of it: 7 s; the plan JSON's determinism tests stay in the default suite
def test_the_command_line_and_the_sweep_share_one_row_of_an_evaluation():
    scenario = load_scenario(BERT)
    found = dapple_planner(scenario, PlannerOptions(fast_budget_ops=0))
    report = _plan_json([BERT, "--planner", "dapple", "--json", "--set", "training.global_batch_size=128"])
    assert report["planners"]["dapple"]["rejected_by_kind"] == count_rejections(
        dapple_planner(scenario, PlannerOptions()).evaluations)
    row = evaluation_row(found.best)
    # the plan alone, and beside it the metrics
    assert set(row.plan) - {"sharding", "tensor_parallel", "sequence_parallel", "context_parallel"} == {
        "schedule", "num_microbatches", "microbatch_size", "recompute", "stages"}
    assert set(row.to_json()["metrics"]) == {"description", "layout", "placement", "iteration_time_s",
                                             "throughput_samples_per_s", "peak_memory_bytes", "speedup_over_dp",
                                             "summary", "tokens_per_s", "mfu", "tensor_parallel", "context_parallel",
                                             "pipeline_parallel", "chunks", "data_parallel", "data_parallel_min",
                                             "devices_used", "idle_devices"}
    assert row.metrics.iteration_time_s == found.best.summary.iteration_time_s
    assert row.plan == found.best.plan_file() and row.metrics.speedup_over_dp is None


@pytest.mark.parametrize("field", ["fast_budget_s"])
def test_a_sweep_naming_the_old_time_budget_is_told_what_replaced_it(field):
    from planner.sweeps.run import SweepError, sweep_from_dict

    with pytest.raises(SweepError, match="fast_budget_ops"):
        sweep_from_dict({"base": BERT, "mode": "plan", "options": {field: 0.5},
                         "axes": {"training.global_batch_size": [64]}})
