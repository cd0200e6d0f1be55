"""The summary is a type: frozen dataclasses, and one JSON form made from them at the edge."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import SCENARIOS
from sim.core.summary import DeviceSummary, Summary, metrics_row
from sim.engine.run import run_scenario
from sim.input.scenario import load_scenario

SUMMARY_KEYS = {"name", "engine", "contention", "iteration_time_s", "throughput_samples_per_s", "bubble_fraction",
                "peak_memory_bytes", "mfu", "oom", "oom_detail", "schedule", "num_stages", "num_microbatches",
                "num_devices", "device_classes", "devices", "parallelism", "tokens_per_s",
                "model_flops_per_device_per_s", "exposed_communication_s", "overlap_fraction"}
DEVICE_KEYS = {"device", "stage", "stages", "busy_s", "idle_s", "peak_memory_bytes", "peak_memory_time_s",
               "peak_activation_microbatches", "peak_activation_bytes", "bytes_sent", "bytes_received",
               "memory_breakdown_bytes", "communication_s", "exposed_communication_s", "overlap_fraction"}


def test_summary_json_has_the_documented_keys_and_matches_the_fields():
    result = run_scenario(load_scenario(SCENARIOS / "bert48_v100_2x8.yaml"))
    summary = result.summarize()
    data = summary.to_json()
    assert set(data) == SUMMARY_KEYS and all(set(d) == DEVICE_KEYS for d in data["devices"])
    assert data == result.summary()
    assert data["iteration_time_s"] == summary.iteration_time_s == result.iteration_time_s
    assert [d["device"] for d in data["devices"]] == [d.device for d in summary.devices] == list(range(16))
    assert summary.device(9) == summary.devices[9] and summary.device(9).stages == (1,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        summary.iteration_time_s = 0.0  # type: ignore[misc]
    with pytest.raises(KeyError):
        summary.device(16)
    row = metrics_row(summary)
    assert row["min_peak_memory_bytes"] == min(d.peak_memory_bytes for d in summary.devices)
    assert row["oom"] is False and row["oom_device"] is None


def test_faults_add_their_sections_only_when_there_are_faults():
    plain = run_scenario(load_scenario(SCENARIOS / "bert48_v100_2x8.yaml")).summarize()
    slow = run_scenario(load_scenario(SCENARIOS / "bert48_v100_straggler.yaml")).summarize()
    assert plain.fault_impact is None and "fault_impact" not in plain.to_json()
    impact = slow.fault_impact
    assert impact is not None and impact.slowdown == pytest.approx(slow.iteration_time_s /
                                                                   impact.fault_free_iteration_time_s)
    assert set(slow.to_json()) == SUMMARY_KEYS | {"fault_impact"}
    assert [d.device for d in impact.devices] == [d.device for d in slow.devices]


def test_summary_types_are_frozen_slotted_and_keyword_only():
    for cls in (Summary, DeviceSummary):
        params = cls.__dataclass_params__
        assert params.frozen and cls.__dataclass_fields__ and hasattr(cls, "__slots__")
        assert all(f.kw_only for f in dataclasses.fields(cls))
