"""Scenario files: every shipped scenario checks, and every malformed one is rejected in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import BAD_SCENARIOS, REPO, SCENARIOS
from sim.app.cli import main
from sim.core.errors import ScenarioError
from sim.input.scenario import load_scenario, parse_scenario

BAD = sorted(BAD_SCENARIOS.glob("*.yaml"))
GOOD = sorted(SCENARIOS.glob("*.yaml"))


def _expected(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} must start with '# expect: <key>'"
    return first.removeprefix("# expect: ")


def test_corpus_is_large_enough():
    assert len(BAD) >= 25


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_scenario_exits_2_with_one_line_naming_the_key(path, capsys):
    assert main(["check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0].startswith(f"dapple-sim: error: {path}: ")
    assert _expected(path) in lines[0]
    if "schedule_file" not in _expected(path):
        assert len(lines) == 1, err
    assert "Traceback" not in err


def test_console_script_exit_code_and_no_traceback():
    bad = BAD_SCENARIOS / "device_key_typo.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "sim.app.cli", "check", str(bad)], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "did you mean 'memory'?" in result.stderr


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_shipped_scenarios_check(path, capsys):
    assert main(["check", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["num_layers"] > 0 and info["num_devices"] > 0
    assert info["num_microbatches"] == info["global_batch_size"] // info["microbatch_size"]
    assert all(d["memory_at_rest_bytes"] > 0 for d in info["devices"])


def test_default_scenario_description(capsys):
    assert main(["check", str(SCENARIOS / "bert48_v100_2x8.yaml"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["num_layers"], info["num_devices"], info["num_stages"], info["num_microbatches"]) == (53, 16, 2, 8)
    scenario = load_scenario(SCENARIOS / "bert48_v100_2x8.yaml")
    params = scenario.model.param_bytes(0, 27)
    # fp32 Adam: parameters + gradients + two fp32 moments = 4 x parameter bytes
    assert info["stages"][0]["memory_at_rest_bytes"] == pytest.approx(4 * params)
    assert info["stages"][0]["samples_per_replica"] == [2] * 8
    assert [d["device"] for d in info["devices"]] == list(range(16))
    assert info["warnings"] == []


ARCHITECTURE_EXAMPLE = """
name: bert48-v100-2x8
cluster:
  nodes: 2
  devices_per_node: 8
  device: {name: V100-16GB, memory: 16GiB, peak_flops: 125TFLOP/s}
  intra_node: {bandwidth: 25GB/s, latency: 5us}     # per-GPU NVLink port
  inter_node: {bandwidth: 25Gb/s, latency: 25us}    # per-node NIC
model:                     # a measured profile ...
  profile: profiles/dapple-v100/bert-48-pbs-2.txt
  profile_batch_size: 2
  optimizer: adam
training:
  global_batch_size: 128
  microbatch_size: 2
plan:                      # optional: without it the planner decides
  schedule: dapple
  stages:
    - {layers: [0, 27], devices: [0, 1, 2, 3, 4, 5, 6, 7]}
    - {layers: [27, 53], devices: [8, 9, 10, 11, 12, 13, 14, 15]}
  recompute: false
faults: []                 # optional: stragglers, slow links, jitter
"""


def test_architecture_example_loads(tmp_path):
    scenario = parse_scenario(ARCHITECTURE_EXAMPLE, source="example.yaml", base_dir=tmp_path)
    assert scenario.cluster.inter_node.bandwidth_bytes_per_s == pytest.approx(25e9 / 8)
    assert scenario.cluster.intra_node.latency_s == pytest.approx(5e-6)
    assert scenario.cluster.device.memory_bytes == 16 * 2**30
    assert scenario.training.num_microbatches == 64
    assert scenario.plan.stages[1].layers == (27, 53)


def test_overrides_are_checked_like_the_file():
    path = SCENARIOS / "bert48_v100_2x8.yaml"
    scenario = load_scenario(path, {"training.microbatch_size": "32", "plan.schedule": "gpipe"})
    assert scenario.training.num_microbatches == 4
    assert scenario.plan.schedule == "gpipe"
    scenario = load_scenario(path, {"plan.stages.1.devices": "[8, 9]"})
    assert scenario.plan.stages[1].devices == (8, 9)
    with pytest.raises(ScenarioError, match=r"training\.micro_batch: unknown key; did you mean 'microbatch_size'"):
        load_scenario(path, {"training.micro_batch": "4"})
    with pytest.raises(ScenarioError, match="not an index"):
        load_scenario(path, {"plan.stages.7.devices": "[0]"})


def test_cli_set_flag(capsys):
    path = str(SCENARIOS / "bert48_v100_2x8.yaml")
    assert main(["check", path, "--set", "cluster.nodes=4", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["num_devices"] == 32
    assert any("not used" in w for w in info["warnings"])
    assert main(["check", path, "--set", "nodes"]) == 2
    assert "write KEY=VALUE" in capsys.readouterr().err


def test_device_ranges_and_presets(tmp_path):
    text = ARCHITECTURE_EXAMPLE.replace("nodes: 2\n  devices_per_node: 8\n", "preset: v100-nvlink-8\n  nodes: 2\n")
    text = text.replace("devices: [8, 9, 10, 11, 12, 13, 14, 15]", "devices: '8-11, 12-15'")
    scenario = parse_scenario(text, source="x.yaml", base_dir=tmp_path)
    assert scenario.plan.stages[1].devices == tuple(range(8, 16))
    assert scenario.cluster.name == "v100-nvlink-8"
    # keys given next to the preset override it; the others come from the preset
    assert scenario.cluster.intra_node.bandwidth_bytes_per_s == pytest.approx(25e9)
    assert scenario.cluster.device.peak_fp32_flop_per_s == pytest.approx(15.7e12)


def test_hand_written_schedule_is_loaded_and_validated():
    scenario = load_scenario(SCENARIOS / "bert48_v100_hand_written.yaml")
    schedule = scenario.plan.custom_schedule
    assert schedule is not None and schedule.num_ranks == 4 and schedule.num_microbatches == 4
    assert str(schedule.ranks[0][0]) == "0F0"


def test_wrong_micro_batch_count_in_schedule_file(tmp_path):
    path = SCENARIOS / "bert48_v100_hand_written.yaml"
    with pytest.raises(ScenarioError, match="runs 4 micro-batches but training gives 8"):
        load_scenario(path, {"training.global_batch_size": "16"})


def test_plan_file_replaces_the_plan(tmp_path, capsys):
    from sim.input.plan_file import plan_to_dict

    source = load_scenario(SCENARIOS / "bert48_v100_15to1.yaml")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps({"best": {**plan_to_dict(source.plan, source.training), "iteration_time_s": 1.0}}))
    target = str(SCENARIOS / "bert48_v100_2x8.yaml")
    assert main(["check", target, "--plan", str(plan_file), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [s["replicas"] for s in info["stages"]] == [15, 1]
    assert info["microbatch_size"] == 32 and info["schedule_params"] == {"policy": "2(s-i)-1"}
    bad = tmp_path / "bad.json"
    bad.write_text('{"stages": [], "speed": 3}')
    assert main(["check", target, "--plan", str(bad)]) == 2
    assert "speed: unknown plan key" in capsys.readouterr().err
    bad.write_text("{not json")
    assert main(["simulate", target, "--plan", str(bad)]) == 2
    assert "not valid JSON at line 1" in capsys.readouterr().err


def test_device_keys_next_to_a_cluster_preset_override_its_device():
    path = SCENARIOS / "bert48_v100_15to1.yaml"
    scenario = load_scenario(path, {"cluster.device": "{memory: 32GiB, efficiency: 0.6}"})
    device = scenario.cluster.device
    assert device.name == "V100-16GB" and device.memory_bytes == 32 * 2**30 and device.efficiency == 0.6
    assert device.peak_flop_per_s == pytest.approx(125e12)  # the rest still comes from the preset
    scenario = load_scenario(path, {"cluster.device.memory": "8GiB"})
    assert scenario.cluster.device.memory_bytes == 8 * 2**30
