"""The validation loop: the comparison arithmetic, and a real CPU run against its prediction."""

from __future__ import annotations

import pytest

from conftest import SCENARIOS
from sim.report.analysis.validation import compare, format_report

GPT = str(SCENARIOS / "gpt_tiny_cpu.yaml")


def _rows(device, times):
    return [{"device": device, "stage": device, "kind": kind, "microbatch": 0, "action": f"{device}{kind}0",
             "stream": "compute", "start_s": start, "end_s": end} for kind, (start, end) in times.items()]


def test_compare_reports_relative_errors_per_iteration_stage_device_and_action():
    predicted = {"iteration_time_s": 1.1,
                 "devices": [{"device": 0, "stages": [0], "peak_memory_bytes": 102.0, "peak_activation_bytes": 2.0}],
                 "events": _rows(0, {"F": (0.0, 0.4), "B": (0.4, 1.0)})}
    measured = {"median_iteration_time_s": 1.0, "iteration_times_s": [1.0, 1.0],
                "devices": [{"device": 0, "stages": [0], "peak_memory_bytes": 100.0, "peak_activation_bytes": 0.0}],
                "events": _rows(0, {"F": (0.1, 0.6), "B": (0.6, 1.0)})}
    report = compare(predicted, measured, scenario="toy", schedule="gpipe")
    error = report["error"]
    assert error["iteration_time_frac"] == pytest.approx(0.1)
    assert error["peak_memory_frac"] == pytest.approx(0.02)
    assert error["devices"][0]["compute_frac"] == pytest.approx(1.0 / 0.9 - 1)
    assert error["stages"][0]["compute_frac"] == pytest.approx(1.0 / 0.9 - 1)
    actions = error["actions"]
    assert actions["matched"] == 2 and actions["unmatched"] == 0
    assert actions["start_mean_abs_s"] == pytest.approx(0.1 / 2 + 0.2 / 2)
    assert actions["duration_mean_abs_frac"] == pytest.approx((0.1 / 0.5 + 0.2 / 0.4) / 2)
    assert "+10.0%" in format_report(report)


def test_rounds_report_the_median_round_and_every_round():
    pytest.importorskip("torch")
    from runtime.validation.loop import combine_rounds

    reports = []
    for predicted, measured in ((1.3, 1.0), (0.9, 1.0), (1.05, 1.0)):
        report = compare({"iteration_time_s": predicted, "devices": [], "events": []},
                         {"median_iteration_time_s": measured, "iteration_times_s": [measured], "devices": [],
                          "events": []}, scenario="toy", schedule="gpipe")
        reports.append(report)
    combined = combine_rounds(reports)
    assert combined["median_round"] == 3 and combined["predicted"]["iteration_time_s"] == pytest.approx(1.05)
    assert combined["error"]["iteration_time_frac_median"] == pytest.approx(0.05)
    assert [r["iteration_time_frac"] for r in combined["rounds"]] == pytest.approx([0.3, -0.1, 0.05])
    assert "3 rounds: iteration-time error median +5.0% (from -10.0% to +30.0%); this table is round 3" in format_report(combined)


def test_validate_rejects_zero_rounds(capsys):
    from runtime.commands.cli import main

    assert main(["validate", GPT, "--nproc", "2", "--rounds", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--rounds" in err


@pytest.mark.dist
@pytest.mark.parametrize("schedule", ["gpipe", "dapple"])
def test_cpu_run_peak_memory_within_two_percent_of_the_prediction(tmp_path, schedule):
    pytest.importorskip("torch")
    from runtime.model.config import load_runnable
    from runtime.validation.loop import validate, write_report

    runnable = load_runnable(GPT, {"plan.schedule": schedule})
    report = validate(runnable, nproc=2, backend="gloo", steps=2, warmup=1, slices=2, repeats=4, out=tmp_path)
    # profile and run took turns: two profile slices, each before one of the two measured steps
    assert report["profile"]["slices"] == 2 and len(report["measured"]["iteration_times_s"]) == 2
    # each turn is also simulated on its own profile, against the step run right after it
    assert [t["slice"] for t in report["slices"]] == [1, 2]
    assert all(t["predicted_s"] > 0 and t["measured_s"] in report["measured"]["iteration_times_s"]
               for t in report["slices"])
    assert "2 turns of profile and run" in format_report(report)
    print(format_report(report))  # the iteration-time error, for the log
    assert report["memory"] == "counted"
    assert len(report["error"]["devices"]) == 2
    for device in report["error"]["devices"]:
        assert abs(device["peak_memory_frac"]) <= 0.02, device
    assert report["error"]["iteration_time_frac"] is not None
    assert report["error"]["actions"]["matched"] >= 16  # every F and B of 4 micro-batches on 2 devices
    # the measured scenario carries the measured per-action overhead and optimizer bandwidth
    from sim.input.scenario import load_scenario

    measured = load_scenario(report["profile"]["scenario"]).cluster.device
    assert report["profile"]["action_overhead_s"] >= 0
    assert measured.action_overhead_s == pytest.approx(report["profile"]["action_overhead_s"], rel=1e-4, abs=1e-9)
    assert measured.memory_bandwidth_bytes_per_s == pytest.approx(
        report["profile"]["optimizer"]["implied_bandwidth_bytes_per_s"], rel=1e-4)
    for path in write_report(report, tmp_path):
        assert path.stat().st_size > 0


@pytest.mark.slow
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp2-pp2", "tp2-pp2-sp"])
def test_a_tensor_parallel_run_memory_by_kind_within_two_percent_of_the_prediction(tmp_path, sequence_parallel):
    pytest.importorskip("torch")
    from runtime.model.config import load_runnable
    from runtime.validation.loop import validate

    runnable = load_runnable(GPT, {"cluster.devices_per_node": "4", "plan.tensor_parallel": "2",
                                   "plan.sequence_parallel": str(sequence_parallel).lower(),
                                   "plan.stages": "[{layers: [0, 3], devices: [0, 1]}, {layers: [3, 6], devices: [2, 3]}]"})
    report = validate(runnable, nproc=4, backend="gloo", steps=2, warmup=1, slices=2, repeats=4, out=tmp_path)
    print(format_report(report))  # the iteration-time error, for the log
    assert "collapsed" in report and report["error"]["iteration_time_frac"] is not None
    assert sorted(d["device"] for d in report["error"]["devices"]) == [0, 1, 2, 3]
    for device in report["error"]["devices"]:
        assert abs(device["peak_memory_frac"]) <= 0.02, device
        assert set(device["memory_by_kind_frac"]) == {"parameters", "gradients", "optimizer", "activations"}
        assert all(abs(frac) <= 0.02 for frac in device["memory_by_kind_frac"].values()), device
    assert "    activations" in format_report(report)
    # the measured scenario: one device per tensor-parallel group, one device's share of each layer
    from sim.input.scenario import load_scenario

    measured = load_scenario(report["profile"]["scenario"])
    assert [list(stage.devices) for stage in measured.plan.stages] == [[0], [1]]
    assert measured.plan.tensor_parallel == 1


def test_validate_rejects_zero_slices(capsys):
    from runtime.commands.cli import main

    assert main(["validate", GPT, "--nproc", "2", "--slices", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--slices" in err


def test_validate_reports_a_failed_run_in_one_line(monkeypatch, capsys, tmp_path):
    pytest.importorskip("torch")
    from torch.multiprocessing import ProcessRaisedException

    import runtime.validation.loop
    from runtime.commands.cli import main

    def failing(*args, **kwargs):
        raise ProcessRaisedException("Traceback (most recent call last):\n  ...\n"
                                     "runtime.execution.executor.ActionError: rank 1 failed at 1F2 of step 3: boom\n", 1, 4242)

    monkeypatch.setattr(runtime.validation.loop, "validate", failing)
    assert main(["validate", GPT, "--nproc", "2", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rank 1 failed at 1F2 of step 3: boom" in err


def test_validate_rejects_a_plan_that_does_not_fit_the_processes(capsys):
    from runtime.commands.cli import main

    assert main(["validate", GPT, "--nproc", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--nproc 2" in err


@pytest.mark.parametrize("schedule", ["gpipe", "dapple"])
def test_single_device_stage_timing_matches_predicted_memory(schedule, tmp_path):
    pytest.importorskip("torch")
    import torch

    from runtime.measure.stage_timing import predict_stages, profiled_scenario, time_stage
    from runtime.model.config import load_runnable

    torch.set_num_threads(1)
    # time_stage runs generate(schedule) with no parameters, i.e. dapple's s-i: predict that order
    written = "{name: dapple, policy: s-i}" if schedule == "dapple" else schedule
    runnable = load_runnable(GPT, {"plan.schedule": written})
    scenario = profiled_scenario(runnable, torch.device("cpu"), tmp_path, repeats=2)
    predicted = predict_stages(scenario, memory="counted")
    for stage in range(2):
        measured = time_stage(runnable, stage, schedule, 4, torch.device("cpu"), repeats=1)
        assert measured["compute_s"] > 0
        assert measured["peak_memory_bytes"] == pytest.approx(predicted[stage]["peak_memory_bytes"], rel=0.02)


def test_each_layer_is_timed_on_the_ranks_that_run_it():
    pytest.importorskip("torch")
    from runtime.model.config import load_runnable
    from runtime.validation.loop import _owners

    plan = load_runnable(GPT, {}).plan  # layers [0, 3) on device 0, [3, 6) on device 1
    assert _owners(plan, 6) == [[0], [0], [0], [1], [1], [1]]
    uneven = load_runnable(GPT, {"cluster.devices_per_node": "3", "training.microbatch_size": "3",
                                 "training.global_batch_size": "12",
                                 "plan.stages": "[{layers: [0, 2], devices: [0, 1]}, {layers: [2, 6], devices: [2]}]"}).plan
    assert _owners(uneven, 6) == [[0, 1], [0, 1], [2], [2], [2], [2]]
