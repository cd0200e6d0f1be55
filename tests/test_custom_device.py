"""A custom device needs only its memory and its peak: the rest takes documented defaults.

The contract (``sim.input.cluster``): ``peak_fp32_flops`` is ``peak_flops / 16`` and
``memory_bandwidth`` is ``peak_flops × 2039 GB/s / 312 TFLOP/s`` (the A100 SXM datasheet's
ratios), the kernel model's numbers are ``DeviceSpec``'s defaults, and ``dapple-sim check``
names every key it filled in.
"""

from __future__ import annotations

import json

import pytest

from sim.app.cli import main
from sim.input.scenario import load_scenario, parse_scenario

HELD_OUT = "{name: held-out, memory: 80GiB, peak_flops: 100TFLOP/s}"

PROFILE_MODEL = "{profile: profiles/dapple-v100/bert-48-pbs-2.txt, profile_batch_size: 2}"
PROFILE_PLAN = """
plan:
  stages:
  - {layers: [0, 27], devices: [0, 1, 2, 3]}
  - {layers: [27, 53], devices: [4, 5, 6, 7]}
"""
GPT_MODEL = "{preset: gpt, layers: 4, hidden: 256, heads: 4, seq_len: 128, vocab: 1000}"
GPT_PLAN = """
plan:
  stages:
  - {layers: [0, 3], devices: [0, 1, 2, 3]}
  - {layers: [3, 6], devices: [4, 5, 6, 7]}
"""

ALL_DEFAULTS = ["peak_fp32_flops", "memory_bandwidth", "efficiency", "matmul_half_dim", "memory_efficiency",
                "kernel_overhead", "kernel_issue", "action_overhead", "memory_reserved", "default_attention",
                "attention_efficiency", "attention_backward_efficiency", "sdpa_efficiency", "sdpa_backward_efficiency",
                "cudnn_efficiency", "cudnn_backward_efficiency"]


def _scenario(device: str = HELD_OUT, model: str = PROFILE_MODEL, plan: str = PROFILE_PLAN) -> str:
    return f"""
cluster:
  nodes: 1
  devices_per_node: 8
  device: {device}
  intra_node: {{bandwidth: 300GB/s, latency: 3us}}
  inter_node: {{bandwidth: 200Gb/s, latency: 5us}}
model: {model}
training: {{global_batch_size: 64, microbatch_size: 8}}
{plan}"""


def _write(tmp_path, text, name="held_out.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("model", "plan"), [(PROFILE_MODEL, PROFILE_PLAN), (GPT_MODEL, GPT_PLAN)],
                         ids=["profile", "gpt"])
def test_minimal_custom_device_is_read_with_derived_rates_and_simulates(tmp_path, capsys, model, plan):
    path = _write(tmp_path, _scenario(model=model, plan=plan))
    device = load_scenario(path).cluster.device
    assert device.memory_bytes == 80 * 2**30 and device.peak_flop_per_s == pytest.approx(100e12)
    assert device.peak_fp32_flop_per_s == pytest.approx(100e12 / (312 / 19.5))
    assert device.memory_bandwidth_bytes_per_s == pytest.approx(100e12 * 2039e9 / 312e12)
    assert (device.efficiency, device.matmul_half_dim, device.memory_efficiency) == (0.5, 0.0, 1.0)
    assert (device.kernel_overhead_s, device.kernel_issue_s, device.action_overhead_s) == (0.0, 0.0, 0.0)

    assert main(["simulate", path, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["iteration_time_s"] > 0 and not summary["oom"]
    assert len(summary["devices"]) == 8


def test_check_lists_the_defaults_it_used(tmp_path, capsys):
    path = _write(tmp_path, _scenario())
    assert main(["check", path, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["device_defaults"] == ALL_DEFAULTS
    assert info["device_default_values"]["peak_fp32_flops"].startswith("6.25TFLOP/s (peak_flops / 16")
    assert info["device_default_values"]["memory_bandwidth"].startswith("653.5GB/s")

    assert main(["check", path]) == 0
    text = capsys.readouterr().out
    line = next(line for line in text.splitlines() if line.startswith("device defaults"))
    assert "peak_fp32_flops 6.25TFLOP/s" in line and "memory_bandwidth 653.5GB/s" in line
    assert "efficiency 0.5" in line and "action_overhead 0s" in line


def test_keys_the_file_gives_are_not_defaults(tmp_path, capsys):
    device = "{name: held-out, memory: 80GiB, peak_flops: 100TFLOP/s, peak_fp32_flops: 20TFLOP/s, efficiency: 0.6}"
    path = _write(tmp_path, _scenario(device=device))
    assert main(["check", path, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["device_defaults"] == [k for k in ALL_DEFAULTS if k not in ("peak_fp32_flops", "efficiency")]
    assert load_scenario(path).cluster.device.peak_fp32_flop_per_s == pytest.approx(20e12)


def test_a_preset_device_takes_no_defaults(tmp_path, capsys):
    path = _write(tmp_path, _scenario(device="A100-80GB"))
    assert main(["check", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["device_defaults"] == []
    assert main(["check", path]) == 0
    assert "device defaults" not in capsys.readouterr().out
    scenario = parse_scenario(_scenario(device="{name: A100-80GB, peak_flops: 200TFLOP/s}"))
    # overriding the preset's peak keeps its other numbers: nothing is derived
    assert scenario.device_defaults == () and scenario.cluster.device.peak_fp32_flop_per_s == pytest.approx(19.5e12)


@pytest.mark.parametrize("missing", ["peak_flops", "memory"])
def test_a_custom_device_without_memory_or_peak_is_one_line_naming_the_key(tmp_path, capsys, missing):
    given = {"memory": "80GiB", "peak_flops": "100TFLOP/s"}
    del given[missing]
    device = "{name: held-out, " + ", ".join(f"{k}: {v}" for k, v in given.items()) + "}"
    path = _write(tmp_path, _scenario(device=device))
    assert main(["check", path]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"dapple-sim: error: {path}: cluster.device.{missing}: missing for device 'held-out'")
    assert "a custom device needs memory and peak_flops" in err
    assert main(["simulate", path]) == 2
