"""Measured collectives (issue 34 item 8): the profile's fit, the link key, the cost module
pricing from it (the context-parallel ring from its ring-shift fit too), and the planner
avoiding full sharding when gathers are slow."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from conftest import REPO
from planner.cli import main as plan_main
from planner.search.costs import CostTables
from runtime.measure.collectives import collectives_key, fit_collective, fsdp_call_overhead
from sim.core.errors import ScenarioError
from sim.core.measured_collectives import CollectiveFit, MeasuredCollectives
from sim.core.parallelism import Sharding
from sim.core.specs import LinkSpec
from sim.cost.comm import fsdp_gather, gradient_sync, ring_collective
from sim.cost.context_comm import context_ring, context_ring_s
from sim.cost.measured_comm import measured_ring_terms, measured_terms
from sim.engine.run import run_scenario
from sim.engine.workload import GROUP
from sim.input.scenario import load_scenario

TINY = REPO / "scenarios" / "gpt_tiny_cpu.yaml"
TINY_CP = REPO / "scenarios" / "gpt_tiny_cp_cpu.yaml"


def test_the_fit_is_the_least_squares_line():
    exact = fit_collective("all-gather", 2, [4096, 65536, 524288], [2e-4 + b / 1e9 for b in (4096, 65536, 524288)])
    assert exact.latency_s == pytest.approx(2e-4, rel=1e-9)
    assert exact.bandwidth_bytes_per_s == pytest.approx(1e9, rel=1e-9)
    # x = 0, 1e6, 2e6; y = 1, 3, 2 ms: slope Σ(x−x̄)(y−ȳ)/Σ(x−x̄)² = 1e3/2e12 s/B, intercept 2 − 0.5 = 1.5 ms
    noisy = fit_collective("all-reduce", 4, [0.0, 1e6, 2e6], [1e-3, 3e-3, 2e-3])
    assert noisy.latency_s == pytest.approx(1.5e-3)
    assert noisy.bandwidth_bytes_per_s == pytest.approx(2e9)
    # falling times (noise): the largest size's bandwidth, no negative latency
    flat = fit_collective("broadcast", 2, [1e3, 1e6], [2e-3, 1e-3])
    # (the intercept of the falling line: 1.5 ms + 1e-3 / 999e3 · 500.5e3 s)
    assert flat.latency_s == pytest.approx(1.5e-3 + 1e-3 / 999e3 * 500.5e3)
    assert flat.bandwidth_bytes_per_s == pytest.approx(1e6 / 1e-3)
    assert fsdp_call_overhead(0.030, 0.010, 0.008, 12) == pytest.approx(0.001)
    assert fsdp_call_overhead(0.010, 0.010, 0.008, 12) == 0.0


def _measured(ag_latency: float = 1e-3, overhead: float = 5e-4) -> MeasuredCollectives:
    fits = [CollectiveFit(kind="all-gather", ranks=2, latency_s=ag_latency, bandwidth_bytes_per_s=1e9),
            CollectiveFit(kind="all-reduce", ranks=2, latency_s=2e-4, bandwidth_bytes_per_s=2e9),
            CollectiveFit(kind="broadcast", ranks=2, latency_s=1e-4, bandwidth_bytes_per_s=4e9),
            CollectiveFit(kind="reduce-scatter", ranks=2, latency_s=ag_latency, bandwidth_bytes_per_s=1e9)]
    return MeasuredCollectives(fits=tuple(fits), fsdp_call_overhead_s=overhead)


def test_measured_terms_scale_a_fit_as_a_ring_scales():
    measured = _measured()
    # over 2 members, 3 FSDP calls of 1 MB in all: 3 · (1 ms + 0.5 ms) and 1e6 / 1e9 s
    assert measured_terms(measured, "all-gather", 2, 1e6, calls=3, fsdp=True) == pytest.approx((4.5e-3, 1e-3))
    # over 4 (measured over 2): steps (4−1)/(2−1) = 3, share (3/4)/(1/2) = 1.5
    assert measured_terms(measured, "all-gather", 4, 1e6) == pytest.approx((3e-3, 1.5e-3))
    assert measured_terms(measured, "point-to-point", 2, 1e6) is None
    assert measured_terms(None, "all-gather", 2, 1e6) is None


def test_the_cost_module_prices_collectives_from_the_measured_terms():
    plain = LinkSpec(bandwidth_bytes_per_s=2e9, latency_s=30e-6)
    link = LinkSpec(bandwidth_bytes_per_s=2e9, latency_s=30e-6, collectives=_measured())
    cluster = load_scenario(TINY).cluster
    measured_cluster = replace(cluster, intra_node=link, inter_node=link)
    # a ring over the plain link: 1e6 B · (2−1)/2 / 2e9 + 1 step · 30 us
    assert ring_collective("all-gather", 2, 1e6, plain, cluster).seconds == pytest.approx(0.5e6 / 2e9 + 30e-6)
    # six FSDP units' gathers of 1 MB: 6 · (1 ms + 0.5 ms) + 1e6 / 1e9
    assert fsdp_gather(2, 1e6, link, measured_cluster, units=6).seconds == pytest.approx(9e-3 + 1e-3)
    # plain data parallelism: one all-reduce, 0.2 ms + 1e6 / 2e9
    none, = gradient_sync([2], 1e6, Sharding.NONE, measured_cluster, units=6)
    assert none.seconds == pytest.approx(2e-4 + 5e-4)
    # ZeRO-1: the all-reduce and a broadcast per unit, 6 · 0.1 ms + 1e6 / 4e9
    zero1, = gradient_sync([2], 1e6, Sharding.OPTIMIZER, measured_cluster, units=6)
    assert zero1.seconds == pytest.approx(7e-4 + 6e-4 + 2.5e-4)
    # FSDP2 full: a reduce-scatter per unit with FSDP2's overhead
    full, = gradient_sync([2], 1e6, Sharding.FULL, measured_cluster, units=6)
    assert full.seconds == pytest.approx(9e-3 + 1e-3)


def _tiny_with(tmp_path, collectives: dict | None, path=TINY):
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if collectives is not None:
        doc["cluster"]["intra_node"]["collectives"] = collectives
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def test_the_collectives_key_is_read_strictly_and_old_scenarios_still_load(tmp_path):
    assert load_scenario(TINY).cluster.intra_node.collectives is None
    key = collectives_key(_measured())
    scenario = load_scenario(_tiny_with(tmp_path, key))
    read = scenario.cluster.intra_node.collectives
    assert [(f.kind, f.ranks) for f in read.fits] == [(f.kind, f.ranks) for f in _measured().fits]
    assert [f.latency_s for f in read.fits] == pytest.approx([1e-3, 2e-4, 1e-4, 1e-3])
    assert read.fsdp_call_overhead_s == pytest.approx(5e-4)
    with pytest.raises(ScenarioError, match=r"intra_node\.collectives\.fits\[0\]\.speed: unknown key"):
        load_scenario(_tiny_with(tmp_path, {"fits": [{**key["fits"][0], "speed": 1}]}))
    with pytest.raises(ScenarioError, match=r"collectives\.fits\[0\]\.kind: unknown value 'all-to-all'"):
        load_scenario(_tiny_with(tmp_path, {"fits": [{**key["fits"][0], "kind": "all-to-all"}]}))
    with pytest.raises(ScenarioError, match=r"collectives\.fits\[0\]\.latency: must be from 0s to 1s"):
        load_scenario(_tiny_with(tmp_path, {"fits": [{**key["fits"][0], "latency": "2s"}]}))


def test_the_engine_charges_the_measured_all_reduce(tmp_path):
    slow = {"fits": [{"kind": "all-reduce", "ranks": 2, "latency": "50ms", "bandwidth": "1GB/s"}]}
    overrides = {"plan.stages": "[{layers: [0, 6], devices: [0, 1]}]"}
    base = run_scenario(load_scenario(TINY, overrides), engine="simpy").iteration_time_s
    measured = run_scenario(load_scenario(_tiny_with(tmp_path, slow), overrides), engine="simpy").iteration_time_s
    assert measured > base + 0.045  # the 50 ms latency is in the step (some bytes' time was there before)


def _best_sharding(path, capsys) -> str:
    assert plan_main([str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["best"].get("sharding", "none")


def test_slow_measured_gathers_steer_the_planner_off_full_sharding(tmp_path, capsys):
    assert _best_sharding(TINY, capsys) == "full"  # the made-up links: a hair faster than plain DP
    fits = [{"kind": kind, "ranks": 2, "latency": latency, "bandwidth": "2GB/s"}
            for kind, latency in (("all-gather", "2ms"), ("reduce-scatter", "2ms"), ("all-reduce", "30us"),
                                  ("broadcast", "30us"))]
    assert _best_sharding(_tiny_with(tmp_path, {"fsdp_call_overhead": "1ms", "fits": fits}), capsys) != "full"


RING_SHIFT = CollectiveFit(kind="ring-shift", ranks=2, latency_s=2e-3, bandwidth_bytes_per_s=5e8)


def test_the_context_ring_is_priced_from_the_measured_ring_shift():
    measured = MeasuredCollectives(fits=(RING_SHIFT,))
    link = LinkSpec(bandwidth_bytes_per_s=2e9, latency_s=30e-6, collectives=measured)
    plain = LinkSpec(bandwidth_bytes_per_s=2e9, latency_s=30e-6)
    # 3 layers' rings over c = 2, 1 MB in all: 3 · (2 − 1) shifts at 2 ms, 1e6 / 5e8 s
    assert measured_ring_terms(measured, 2, 1e6, 3) == pytest.approx((6e-3, 2e-3))
    assert context_ring_s(1e6, 2, link, rings=3) == pytest.approx(6e-3 + 2e-3)
    assert context_ring_s(1e6, 2, plain, rings=3) == pytest.approx(1e6 / 2e9 + 30e-6)  # as before: unmeasured
    cluster = replace(load_scenario(TINY_CP).cluster, intra_node=link)
    forward, backward = context_ring(1e5, 10, 2, link, cluster, rings=3)
    assert forward.seconds == pytest.approx(6e-3 + 1e6 / 5e8)
    assert backward.seconds == pytest.approx(6e-3 + 2e6 / 5e8)  # keys, values and their gradients


def test_the_planner_and_the_engine_charge_the_measured_ring(tmp_path):
    fit = {"kind": "ring-shift", "ranks": 2, "latency": "20ms", "bandwidth": "500MB/s"}
    scenario = load_scenario(_tiny_with(tmp_path, {"fits": [fit]}, TINY_CP))
    tables = CostTables(scenario, context_parallel=2)
    samples = scenario.training.microbatch_size
    fwd, bwd = tables.context_ring_s(0, tables.num_layers, samples)
    # 4 blocks, each its own ring of c − 1 = 1 shift: 4 · 20 ms, every block's bytes at 500 MB/s
    # each block's keys and values of s/c = 16 positions, hidden 64, fp32, c − 1 = 1 step, a sample
    ring = 4 * (2 - 1) * 2 * 4 * 16 * 64
    assert sum(layer.cp_ring_bytes for layer in tables.model.layers) == ring
    assert fwd == pytest.approx(4 * 20e-3 + ring * samples / 5e8, rel=1e-9)
    assert bwd == pytest.approx(4 * 20e-3 + 2 * ring * samples / 5e8, rel=1e-9)
    # the engine's ring beside each forward and backward takes the same seconds
    engine = run_scenario(scenario, engine="simpy", contention=True)
    rings = [end - start for cls, rec in zip(engine.workload.classes, engine.records)
             for op, (start, end) in zip(cls.ops, rec.op_times) if op.code == GROUP and op.overlap]
    assert rings and sorted({round(r, 9) for r in rings}) == pytest.approx(sorted({round(fwd, 9), round(bwd, 9)}))
