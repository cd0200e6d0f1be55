"""Compute slows down beside overlapped communication (``DeviceSpec.overlap_slowdown``,
``sim.cost.overlap.contended_s``; issue 29 item 1's last clause): the collective's kernels hold SMs
of their own, so compute beside them runs ``1 + s`` times longer while they run.

Closed forms written out; the engine's compute op beside FSDP's gather is stretched by exactly
that, and the presets carry the measured average (Lee et al. 2025, arXiv 2507.03114: 18.9%).
"""

from __future__ import annotations

import pytest

from sim.core.errors import DappleError
from sim.cost.overlap import contended_s, unit_count
from sim.engine.run import run_scenario
from sim.engine.workload import COMPUTE, GROUP
from sim.input.presets import DEVICE_PRESETS, OVERLAP_SLOWDOWN
from sim.input.scenario import parse_scenario

TEXT = """
name: contention
cluster: {preset: a100-nvlink-8, nodes: 1, devices_per_node: 4, nics_per_node: 1}
model: {preset: gpt, layers: 4, hidden: 256, heads: 4, seq_len: 128, vocab: 512, dtype: fp16}
training: {global_batch_size: 8, microbatch_size: 8}
plan: {pipeline_parallel: 1, data_parallel: 4, sharding: full}
"""


def test_closed_forms_written_out():
    # compute A = 2 s beside G = 1 s of collectives slowed by s = 0.2: G/(1 + s) of it done while
    # they run, the rest at full speed: 1 + (2 − 1/1.2) = 2 + 1 × 0.2/1.2
    assert contended_s(2.0, 1.0, 0.2) == pytest.approx(1.0 + (2.0 - 1.0 / 1.2), rel=1e-15)
    assert contended_s(2.0, 1.0, 0.2) == pytest.approx(2.0 + 0.2 / 1.2, rel=1e-15)
    # the collectives outlast the slowed compute (G ≥ (1 + s)·A): all of it slowed, (1 + s)·A
    assert contended_s(2.0, 10.0, 0.2) == pytest.approx(2.4, rel=1e-15)
    assert contended_s(2.0, 2.4, 0.2) == pytest.approx(2.4, rel=1e-15)  # the boundary: both forms agree
    # nothing beside it, or no slowdown: the compute's own time
    assert contended_s(2.0, 0.0, 0.2) == 2.0 and contended_s(2.0, 1.0, 0.0) == 2.0


def test_the_presets_carry_the_measured_average():
    assert OVERLAP_SLOWDOWN == 0.189  # arXiv 2507.03114's abstract: "an average computational slowdown of 18.9%"
    for name in ("A100-80GB", "H100-80GB", "H800-80GB", "H200-141GB"):
        assert DEVICE_PRESETS[name]["overlap_slowdown"] == OVERLAP_SLOWDOWN
    assert DEVICE_PRESETS["V100-16GB"]["overlap_slowdown"] == 0.0  # no measurement covers it


def _compute_beside_gather(slowdown: float | None):
    overrides = {} if slowdown is None else {"cluster.device.overlap_slowdown": str(slowdown)}
    scenario = parse_scenario(TEXT, source="contention.yaml", overrides=overrides)
    result = run_scenario(scenario, engine="fast")
    cls = result.workload.classes[0]
    ops = {(op.kind.value, op.code): op for op in cls.ops if op.code in (COMPUTE, GROUP) and op.kind.value in "FB"}
    return result, ops, scenario.cluster.device.overlap_slowdown


@pytest.mark.parametrize("slowdown", [None, 0.5])
def test_the_engine_stretches_compute_beside_fsdp_gathers(slowdown):
    plain_result, plain, _ = _compute_beside_gather(0.0)
    result, slowed, s = _compute_beside_gather(slowdown)
    assert s == (OVERLAP_SLOWDOWN if slowdown is None else slowdown)
    units = unit_count(6, 1)  # the embedding, 4 blocks and the head, one FSDP unit each
    for kind in ("F", "B"):
        own = plain[(kind, COMPUTE)].duration_s
        group = slowed[(kind, GROUP)]
        alone = group.lead_s * units  # the gather's alone seconds: one unit's piece leads
        assert alone > 0 and group.tail_s == pytest.approx(slowed[(kind, COMPUTE)].duration_s / units, rel=1e-12)
        assert slowed[(kind, COMPUTE)].duration_s == pytest.approx(own + min(alone * s / (1 + s), s * own), rel=1e-12)
    assert result.summarize().iteration_time_s > plain_result.summarize().iteration_time_s


def test_the_key_is_checked():
    with pytest.raises(DappleError, match="overlap_slowdown"):
        parse_scenario(TEXT, source="contention.yaml", overrides={"cluster.device.overlap_slowdown": "1.5"})
