"""``--set`` on a key written as a plain name extends the mapping that name stands for."""

from __future__ import annotations

from conftest import SCENARIOS
from sim.input.scenario import load_scenario, parse_scenario


def test_a_schedule_key_extends_a_schedule_written_as_a_name():
    scenario = load_scenario(SCENARIOS / "bert48_v100_2x8.yaml", {"plan.schedule.policy": "2(s-i)-1"})
    assert scenario.plan.schedule == "dapple" and scenario.plan.params == {"policy": "2(s-i)-1"}


def test_a_device_key_extends_a_device_written_as_a_preset_name():
    text = """
cluster: {nodes: 1, devices_per_node: 2, device: A100-80GB, intra_node: {bandwidth: 300GB/s},
          inter_node: {bandwidth: 200Gb/s}}
model: {preset: mlp, layers: 2, hidden: 16}
training: {global_batch_size: 4, microbatch_size: 2}
"""
    scenario = parse_scenario(text, overrides={"cluster.device.memory": "40GiB"})
    assert scenario.cluster.device.name == "A100-80GB" and scenario.cluster.device.memory_bytes == 40 * 2**30
    assert scenario.cluster.device.peak_flop_per_s == parse_scenario(text).cluster.device.peak_flop_per_s


def test_a_failure_fault_is_one_line_for_the_fast_path_and_the_planner(tmp_path, capsys):
    from planner.cli import main as plan_main
    from sim.app.cli import main as sim_main

    path = tmp_path / "fails.yaml"
    text = (SCENARIOS / "bert48_v100_2x8.yaml").read_text()
    assert "faults: []" in text
    path.write_text(text.replace("faults: []", "faults: [{type: failure, device: 3, at: 100ms}]"))
    assert sim_main(["simulate", str(path), "--engine", "fast"]) == 2
    assert plan_main([str(path), "--planner", "dp"]) == 2
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if "error" in line]
    assert len(lines) == 2 and all(f"{path}: faults[0]: a device failure" in line for line in lines)
