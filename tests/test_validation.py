"""The validation loop: the comparison arithmetic, and a real CPU run against its prediction."""

from __future__ import annotations

import json

import pytest

from conftest import SCENARIOS
from runtime.validation.loop import combine_rounds
from sim.core import jsonio
from sim.core.events import EventRow
from sim.core.validation_report import (
    ActionComparison,
    DeviceError,
    MemoryErrorByKind,
    StageError,
    ValidationReport,
)
from sim.core.validation_sides import DeviceSide, MemoryByKind, StageCompute
from sim.report.analysis.validation import compare, format_report, measured_view, run_side

GPT = str(SCENARIOS / "gpt_tiny_cpu.yaml")


def _row(kind, start, end, action=None, stream="compute"):
    return EventRow(device=0, stage=0, kind=kind, microbatch=0, action=action or f"0{kind}0", stream=stream,
                    start_s=start, end_s=end)


def _toy_report():
    """One device, one F and one B on each side (times in eighths, so every error is exact);
    the measurement from a run summary's JSON, with a send the prediction does not have."""
    predicted = run_side(
        iteration_time_s=0.875, events=[_row("F", 0.0, 0.25), _row("B", 0.25, 0.75)],
        devices=[DeviceSide(device=0, stages=(0,), peak_memory_bytes=136.0, peak_activation_bytes=8.0,
                            memory_breakdown_bytes=MemoryByKind(parameters=64.0, gradients=32.0, optimizer=32.0,
                                                                activations=8.0))])
    summary = {"median_iteration_time_s": 1.0, "iteration_times_s": [0.75, 1.0, 1.25],
               "devices": [{"device": 0, "stages": [0], "peak_memory_bytes": 128.0, "peak_activation_bytes": 16.0,
                            "memory_breakdown_bytes": {"parameters": 64.0, "gradients": 32.0, "optimizer": 16.0,
                                                       "activations": 16.0, "buffers": None}}],
               "events": [r.to_json() for r in (_row("F", 0.125, 0.625), _row("B", 0.625, 1.0),
                                                 _row("SEND_F", 0.625, 0.75, stream="send"))]}
    return compare(predicted, measured_view(summary), scenario="toy", schedule="gpipe", memory="counted")


def test_a_report_holds_every_error_as_typed_fields():
    report = _toy_report()
    assert report.predicted.devices[0].compute_s == 0.75 and report.measured.devices[0].compute_s == 0.875
    assert report.predicted.stages == (StageCompute(stage=0, compute_s=0.75),)
    error = report.error
    assert error.iteration_time_frac == -0.125
    assert error.peak_memory_frac == 0.0625 and error.memory_by_kind_frac == 1.0
    assert error.devices == (DeviceError(device=0, peak_memory_frac=0.0625, compute_frac=-1 / 7,
                                         memory_by_kind_frac=MemoryErrorByKind(parameters=0.0, gradients=0.0,
                                                                               optimizer=1.0, activations=-0.5)),)
    assert error.stages == (StageError(stage=0, compute_frac=-1 / 7),)
    actions = error.actions
    assert (actions.matched, actions.unmatched) == (2, 1)  # the send has no predicted twin
    assert actions.start_mean_abs_s == (0.125 + 0.375) / 2 and actions.start_mean_abs_frac_of_iteration == 0.25
    assert actions.duration_mean_abs_frac == (0.25 / 0.5 + 0.125 / 0.375) / 2
    assert actions.by_stage_and_kind == (
        ActionComparison(stage=0, kind="B", count=1, predicted_mean_s=0.5, measured_mean_s=0.375, frac=1 / 3),
        ActionComparison(stage=0, kind="F", count=1, predicted_mean_s=0.25, measured_mean_s=0.5, frac=-0.5))
    text = format_report(report)
    assert "-12.5%" in text and "    optimizer" in text and "+100.0%" in text


def test_a_report_writes_the_json_it_always_wrote_and_reads_it_back():
    report = _toy_report()
    kinds = ("device", "stage", "kind", "microbatch", "action", "stream", "start_s", "end_s")
    rows = lambda *times: [dict(zip(kinds, (0, 0, k, 0, f"0{k}0", s, a, b))) for k, s, a, b in times]  # noqa: E731
    expected = {
        "scenario": "toy", "schedule": "gpipe", "memory": "counted",
        "predicted": {
            "iteration_time_s": 0.875, "stages": [{"stage": 0, "compute_s": 0.75}],
            "devices": [{"device": 0, "stages": [0], "peak_memory_bytes": 136.0, "peak_activation_bytes": 8.0,
                         "memory_breakdown_bytes": {"parameters": 64.0, "gradients": 32.0, "optimizer": 32.0,
                                                    "activations": 8.0}, "compute_s": 0.75}],
            "events": rows(("F", "compute", 0.0, 0.25), ("B", "compute", 0.25, 0.75))},
        "measured": {
            "iteration_time_s": 1.0, "iteration_times_s": [0.75, 1.0, 1.25], "stages": [{"stage": 0, "compute_s": 0.875}],
            # the run summary's "buffers" (always None: a run does not count them) is not carried over
            "devices": [{"device": 0, "stages": [0], "peak_memory_bytes": 128.0, "peak_activation_bytes": 16.0,
                         "memory_breakdown_bytes": {"parameters": 64.0, "gradients": 32.0, "optimizer": 16.0,
                                                    "activations": 16.0}, "compute_s": 0.875}],
            "events": rows(("F", "compute", 0.125, 0.625), ("B", "compute", 0.625, 1.0),
                           ("SEND_F", "send", 0.625, 0.75))},
        "error": {
            "iteration_time_frac": -0.125, "peak_memory_frac": 0.0625, "memory_by_kind_frac": 1.0,
            "devices": [{"device": 0, "peak_memory_frac": 0.0625, "compute_frac": -1 / 7,
                         "memory_by_kind_frac": {"parameters": 0.0, "gradients": 0.0, "optimizer": 1.0,
                                                 "activations": -0.5}}],
            "stages": [{"stage": 0, "compute_frac": -1 / 7}],
            "actions": {"matched": 2, "unmatched": 1, "start_mean_abs_s": 0.25, "start_mean_abs_frac_of_iteration": 0.25,
                        "duration_mean_abs_frac": (0.5 + 1 / 3) / 2,
                        "by_stage_and_kind": [
                            {"stage": 0, "kind": "B", "count": 1, "predicted_mean_s": 0.5, "measured_mean_s": 0.375,
                             "frac": 1 / 3},
                            {"stage": 0, "kind": "F", "count": 1, "predicted_mean_s": 0.25, "measured_mean_s": 0.5,
                             "frac": -0.5}]}},
    }
    assert report.to_json() == expected
    assert ValidationReport.from_json(expected) == report
    assert ValidationReport.from_json(expected).to_json() == expected


def test_rounds_report_the_median_round_and_every_round():
    reports = []
    for predicted, measured in ((1.3, 1.0), (0.9, 1.0), (1.05, 1.0)):
        reports.append(compare(run_side(iteration_time_s=predicted, devices=[], events=[]),
                               measured_view({"median_iteration_time_s": measured, "iteration_times_s": [measured],
                                              "devices": [], "events": []}), scenario="toy", schedule="gpipe"))
    combined = combine_rounds(reports)
    assert combined.median_round == 3 and combined.predicted.iteration_time_s == pytest.approx(1.05)
    assert combined.error.iteration_time_frac_median == pytest.approx(0.05)
    assert [r.iteration_time_frac for r in combined.rounds] == pytest.approx([0.3, -0.1, 0.05])
    assert "3 rounds: iteration-time error median +5.0% (from -10.0% to +30.0%); this table is round 3" in format_report(combined)
    document = combined.to_json()
    assert [r["round"] for r in document["rounds"]] == [1, 2, 3] and document["median_round"] == 3
    assert document["error"]["iteration_time_frac_median"] == pytest.approx(0.05)
    assert "rounds" not in reports[0].to_json() and "iteration_time_frac_median" not in reports[0].to_json()["error"]
    assert ValidationReport.from_json(document) == combined


def test_validate_rejects_zero_rounds(capsys):
    from runtime.commands.cli import main

    assert main(["validate", GPT, "--nproc", "2", "--rounds", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--rounds" in err


@pytest.mark.dist
@pytest.mark.parametrize("schedule", [pytest.param("gpipe", marks=pytest.mark.slow), "dapple"])  # 7 s a run
def test_cpu_run_peak_memory_within_two_percent_of_the_prediction(tmp_path, schedule):
    pytest.importorskip("torch")
    from runtime.commands.validate import write_report
    from runtime.model.config import load_runnable
    from runtime.validation.loop import validate

    runnable = load_runnable(GPT, {"plan.schedule": schedule})
    report = validate(runnable, nproc=2, backend="gloo", steps=2, warmup=1, slices=2, repeats=4, out=tmp_path)
    # profile and run took turns: two profile slices, each before one of the two measured steps
    assert report.profile.num_turns == 2 and len(report.measured.iteration_times_s) == 2
    # each turn is also simulated on its own profile, against the step run right after it
    assert [t.turn for t in report.turns] == [1, 2]
    assert all(t.predicted_s > 0 and t.measured_s in report.measured.iteration_times_s for t in report.turns)
    assert "2 turns of profile and run" in format_report(report)
    print(format_report(report))  # the iteration-time error, for the log
    assert report.memory == "counted"
    assert len(report.error.devices) == 2
    for device in report.error.devices:
        assert abs(device.peak_memory_frac) <= 0.02, device
    assert report.error.iteration_time_frac is not None
    assert report.error.actions.matched >= 16  # every F and B of 4 micro-batches on 2 devices
    # the measured scenario carries the measured per-action overhead and optimizer bandwidth
    from sim.input.scenario import load_scenario

    measured = load_scenario(report.profile.scenario).cluster.device
    assert report.profile.action_overhead_s >= 0
    assert measured.action_overhead_s == pytest.approx(report.profile.action_overhead_s, rel=1e-4, abs=1e-9)
    assert measured.memory_bandwidth_bytes_per_s == pytest.approx(report.profile.optimizer_bandwidth_bytes_per_s,
                                                                  rel=1e-4)
    for path in write_report(report, tmp_path):
        assert path.stat().st_size > 0
    written = json.loads((tmp_path / "validation.json").read_text())
    assert written == json.loads(jsonio.dumps(report.to_json())) and ValidationReport.from_json(written) == report
    assert sorted(written) == ["backend", "drift", "error", "measured", "memory", "nproc", "predicted", "profile", "scenario",
                               "schedule", "slices", "steps", "traces"]
    assert sorted(written["profile"]) == ["action_overhead_s", "batch_size", "layers", "links", "optimizer",
                                          "scenario", "slice", "slices"]


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
    assert report.collapsed and report.error.iteration_time_frac is not None
    assert sorted(d.device for d in report.error.devices) == [0, 1, 2, 3]
    for device in report.error.devices:
        assert abs(device.peak_memory_frac) <= 0.02, device
        assert all(abs(frac) <= 0.02 for frac in device.memory_by_kind_frac.to_json().values()), device
    assert "    activations" in format_report(report)
    # the measured scenario: one device per tensor-parallel group, one device's share of each layer
    from sim.input.scenario import load_scenario

    measured = load_scenario(report.profile.scenario)
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

    import runtime.commands.validate
    from runtime.commands.cli import main

    def failing(*args, **kwargs):
        raise ProcessRaisedException("Traceback (most recent call last):\n  ...\n"
                                     "runtime.execution.executor.ActionError: rank 1 failed at 1F2 of step 3: boom\n", 1, 4242)

    monkeypatch.setattr(runtime.commands.validate, "validate", failing)
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


@pytest.mark.dist
def test_a_context_parallel_plan_is_profiled_on_its_ring_and_simulated_as_replicas(tmp_path):
    pytest.importorskip("torch")
    import torch
    import yaml

    from runtime.execution.launch import spawn
    from runtime.measure.profile_run import _measured_scenario
    from runtime.measure.profiler import profile_layer
    from runtime.measure.tp_profile import tp_profile_worker
    from runtime.model.config import load_runnable
    from sim.input.scenario import load_scenario

    runnable = load_runnable(SCENARIOS / "gpt_tiny_cp_cpu.yaml")  # c = 2: seq_len 32, hidden 64, fp32
    measured = spawn(tp_profile_worker, 2, runnable, 4, 0, 1)[0]  # rank 0 of one context ring
    assert measured["collectives"] == []
    whole = profile_layer(runnable.model, 1, 4, torch.device("cpu"), warmup=0, repeats=1)
    block = measured["layers"][1]
    # a context rank's block: 4 samples of 32/2 positions, its output and parameters
    assert block.output_bytes == 4 * 16 * 64 * 4 == whole.output_bytes // 2
    assert block.param_bytes == whole.param_bytes and block.fwd_s > 0 and block.bwd_s > 0
    # the measured scenario: each context rank a replica of 4/2 whole sequences, the same stages
    cluster = yaml.safe_load((SCENARIOS / "gpt_tiny_cp_cpu.yaml").read_text(encoding="utf-8"))["cluster"]
    text = _measured_scenario(runnable, cluster, 4)
    doc = yaml.safe_load(text)
    assert doc["model"]["profile_batch_size"] == 2 and "context_parallel" not in doc["plan"]
    assert doc["plan"]["stages"] == [{"layers": [0, 6], "devices": [0, 1]}] and "Context parallel 2" in text
    (tmp_path / "profile.txt").write_text("".join(
        f"node{k + 1} -- l{k} -- forward_compute_time=1.0, backward_compute_time=2.0, activation_size=8.0, "
        f"parameter_size=8.0\n" for k in range(6)) + "".join(f"\tnode{k + 1} -- node{k + 2}\n" for k in range(5)))
    (tmp_path / "scenario.yaml").write_text(text, encoding="utf-8")
    assert load_scenario(tmp_path / "scenario.yaml").plan.num_replicas(0) == 2


def test_a_block_is_profiled_with_the_plans_selective_region_checkpointed():
    # gpt_tiny's block, 2 samples of s = 32, h = 64, a = 4, fp32 (e = 4). Under selective-op the
    # checkpointed block keeps its input e·sh and what torchtitan's policy saves of a block with
    # biases (no aten.mm): the CPU flash kernel's output e·sh and log-sum-exp 4as, so the measured
    # scenario's stash is that, not the whole block's (validate predicted +70% before)
    pytest.importorskip("torch")
    import torch

    from runtime.measure.profiler import profile_layer
    from runtime.model.config import load_runnable
    from sim.core.parallelism import Recompute

    runnable = load_runnable(SCENARIOS / "gpt_tiny_cpu.yaml")
    cpu = torch.device("cpu")
    kept = profile_layer(runnable.model, 1, 2, cpu, warmup=0, repeats=1, recompute=Recompute.SELECTIVE_OP)
    assert kept.stash_bytes == 2 * (4 * 32 * 64 + 4 * 32 * 64 + 4 * 4 * 32) == 33792
    whole = profile_layer(runnable.model, 1, 2, cpu, warmup=0, repeats=1)
    assert whole.stash_bytes > 7 * kept.stash_bytes and whole.param_bytes == kept.param_bytes
    # full recompute re-runs the stage in the executor: the layer is profiled whole
    assert profile_layer(runnable.model, 1, 2, cpu, warmup=0, repeats=1,
                         recompute=Recompute.FULL).stash_bytes == whole.stash_bytes


def test_a_device_of_expert_tensor_parallelism_is_profiled_holding_its_cut_of_its_experts():
    # moe_tiny's block: 4 routed experts of three 32 x 32 fp32 matrices (12,288 B each). On EP 2 x
    # ETP 2 a device holds 2 of them, each half wide: 1/4 of the 49,152 B, so 36,864 B fewer than
    # whole; 37,632 B is what a run on 4 ranks holds per block ((91,776 - 8,192 - 8,320) / 2: its
    # parameters less the embedding's and the head's). validate predicted +18.0% before
    pytest.importorskip("torch")
    import torch

    from runtime.measure.profiler import profile_layer
    from runtime.model.config import load_runnable

    runnable = load_runnable(SCENARIOS / "moe_tiny_cpu.yaml")
    cpu = torch.device("cpu")
    whole = profile_layer(runnable.model, 1, 2, cpu, warmup=0, repeats=1)
    cut = profile_layer(runnable.model, 1, 2, cpu, warmup=0, repeats=1, expert_parallel=2 * 2)
    assert whole.param_bytes - cut.param_bytes == 4 * 3 * 32 * 32 * 4 * 3 // 4 == 36864
    assert cut.param_bytes == 37632


def test_the_runtimes_other_realisations_are_named_where_a_plan_has_them():
    # torch-free: ZeRO-2's (1 + 1/d) parameters at the peak and a split backward's whole stash from I to W
    # (the prediction frees half at I); FSDP2 reduce-scatters each micro-batch's gradients as the plan's
    # plan.fsdp.reduce_every_microbatch (true) says: no note
    from runtime.model.config import load_runnable
    from runtime.model.realisation import realisation_notes

    one = "[{layers: [0, 6], devices: [0, 1]}]"  # data parallelism 2
    full = load_runnable(GPT, {"plan.stages": one, "plan.sharding": "full"}).plan
    assert realisation_notes(full, num_microbatches=4) == ()
    zero2 = load_runnable(GPT, {"plan.stages": one, "plan.sharding": "gradients"}).plan
    (kept,) = realisation_notes(zero2, num_microbatches=4)
    assert "(1 + 1/d) of its parameters" in kept and "\n" not in kept
    (split,) = realisation_notes(load_runnable(GPT, {"plan.schedule": "zb-h1"}).plan, num_microbatches=4)
    assert split.startswith("zb-h1 splits each backward") and "WGRAD_STASH_FRACTION" in split
    assert realisation_notes(load_runnable(GPT).plan, num_microbatches=4) == ()


def test_an_mtp_layer_apart_from_the_embedding_is_profiled_with_its_copy_of_the_table():
    # gpt_tiny untied with mtp_depth 1: layers embedding, 4 blocks, mtp (5), head (6). On a stage without
    # the embedding the mtp layer holds a copy of the 128 x 64 fp32 table (32,768 B), which a measured
    # profile, one number a layer, counts in the mtp layer (validate predicted -3.4% before)
    pytest.importorskip("torch")
    import torch

    from runtime.measure.profiler import mtp_holds_table_copy, profile_layer
    from runtime.model.config import load_runnable

    apart = load_runnable(GPT, {"model.mtp_depth": "1", "plan.stages": "[{layers: [0, 3], devices: [0]}, "
                                                                       "{layers: [3, 7], devices: [1]}]"})
    assert mtp_holds_table_copy(apart.model, apart.plan)
    together = load_runnable(GPT, {"model.mtp_depth": "1", "plan.stages": "[{layers: [0, 7], devices: [0, 1]}]"})
    assert not mtp_holds_table_copy(together.model, together.plan)
    assert not mtp_holds_table_copy(load_runnable(GPT).model, apart.plan)  # no mtp layer
    cpu = torch.device("cpu")
    borrowed = profile_layer(apart.model, 5, 2, cpu, warmup=0, repeats=1)
    copied = profile_layer(apart.model, 5, 2, cpu, warmup=0, repeats=1, table_copy=True)
    assert copied.param_bytes - borrowed.param_bytes == 128 * 64 * 4
    assert profile_layer(apart.model, 4, 2, cpu, warmup=0, repeats=1, table_copy=True).param_bytes == \
        profile_layer(apart.model, 4, 2, cpu, warmup=0, repeats=1).param_bytes  # a block holds no table
