"""Usable memory: a device's capacity less what the CUDA context, NCCL and the allocator reserve.

The out-of-memory verdicts (the engine's, ``dapple-sim check``'s at rest, the planner's count
before a replay) compare with ``DeviceSpec.usable_memory_bytes``; the reports show both
numbers. A GPU preset's ``memory_reserved`` is ``sim.cost.reserved.reserved_memory_bytes``
(written out here); a custom device reserves nothing unless it says so.
"""

from __future__ import annotations

import json

import pytest

from planner.search.memory import plan_peak_bytes
from sim.app.check import describe, format_description
from sim.app.cli import main
from sim.core.specs import DeviceSpec
from sim.core.units import format_bytes, parse_bytes
from sim.cost.reserved import reserved_memory_bytes
from sim.engine.run import run_scenario
from sim.input.presets import DEVICE_PRESETS
from sim.input.scenario import load_scenario

TINY = "scenarios/gpt_tiny_cpu.yaml"
MiB, GiB = 2**20, 2**30


def _tiny(reserved_bytes: float | None = None, memory: str | None = None):
    overrides = {"plan.schedule": "gpipe"}  # DAPPLE's warm-up would adapt to the memory left
    if reserved_bytes is not None:
        overrides["cluster.device.memory_reserved"] = f"{reserved_bytes:.17g}B"
    if memory is not None:
        overrides["cluster.device.memory"] = memory
    return load_scenario(TINY, overrides=overrides)


def test_reserved_closed_form():
    # context 300 MiB + cuBLASLt 32 MiB + NCCL's ring 32 channels x 2 connections x 10 MiB
    # + fragmentation 1.83/75.31 of 80 GiB
    assert reserved_memory_bytes(80 * GiB, cublas_workspace_bytes=32 * MiB) == \
        300 * MiB + 32 * MiB + 640 * MiB + 1.83 / 75.31 * 80 * GiB


@pytest.mark.parametrize("name", sorted(DEVICE_PRESETS))
def test_every_gpu_preset_reserves_a_cited_share(name):
    preset = DEVICE_PRESETS[name]
    memory = parse_bytes(preset["memory"])
    reserved = parse_bytes(preset["memory_reserved"])
    assert 1 * GiB < reserved < 0.1 * memory  # 1.3 GiB of 16 GiB, 2.9 of 80, 4.3 of 141
    cublas = 32 * MiB if name.startswith(("H100", "H200", "H800")) else 4 * MiB if name.startswith("A100") else MiB
    assert reserved == pytest.approx(reserved_memory_bytes(memory, cublas_workspace_bytes=cublas), rel=1e-12)


def test_custom_device_reserves_nothing_by_default():
    scenario = _tiny()
    assert scenario.cluster.device.memory_reserved_bytes == 0.0
    assert describe(scenario).device_usable_memory_bytes == scenario.cluster.device.memory_bytes


def test_reserving_all_memory_is_one_line_naming_the_key(tmp_path, capsys):
    with open(TINY) as handle:
        text = handle.read().replace("memory: 4GiB,", "memory: 4GiB, memory_reserved: 4GiB,")
    path = tmp_path / "reserved.yaml"
    path.write_text(text)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "memory_reserved" in err
    with pytest.raises(ValueError, match="memory_reserved"):
        DeviceSpec(name="d", memory_bytes=GiB, peak_flop_per_s=1e12, peak_fp32_flop_per_s=1e12,
                   memory_bandwidth_bytes_per_s=1e9, memory_reserved_bytes=GiB)


def test_a_plan_that_fits_memory_but_not_usable_memory_is_out_of_memory():
    peak = run_scenario(_tiny(), engine="fast").summarize().peak_memory_bytes
    # the whole device is 1 MiB more than the peak; reserving 2 MiB leaves 1 MiB too little
    memory = f"{peak + MiB:.17g}B"
    fits = run_scenario(_tiny(memory=memory), engine="fast").summarize()
    assert not fits.oom
    short = _tiny(reserved_bytes=2 * MiB, memory=memory)
    usable = short.cluster.device.usable_memory_bytes
    assert usable == peak - MiB
    for engine in ("fast", "simpy"):
        summary = run_scenario(short, engine=engine).summarize()
        assert summary.oom
        assert 0 < summary.oom_detail.overshoot_bytes <= MiB  # the first device over it, not always the peak's
        assert f"of its {format_bytes(usable)} usable of {format_bytes(usable + 2 * MiB)}" in summary.oom_detail.message
    # the planner's count before a replay is at most the engine's peak: over the usable share here too
    assert plan_peak_bytes(short.resolved).peak_bytes <= peak


def test_check_shows_both_numbers_and_rests_against_usable():
    scenario = _tiny()
    at_rest = describe(scenario).plan.devices[0].memory_at_rest_bytes
    memory = scenario.cluster.device.memory_bytes
    # reserve all but half the states at rest: they no longer fit
    short = _tiny(reserved_bytes=memory - at_rest / 2)
    description = describe(short)
    info = description.to_json()
    assert info["device_memory_bytes"] == memory
    assert info["device_usable_memory_bytes"] == at_rest / 2
    assert not description.plan.devices[0].fits_at_rest
    text = format_description(description)
    assert "usable)" in text and "more than their 4GiB (" in text
    assert json.loads(json.dumps(info))["device_usable_memory_bytes"] == at_rest / 2
