"""Faults: stragglers, jitter, slow links and failures change replays as specified; same
seed, same bytes."""

from __future__ import annotations

import json

import pytest

from conftest import SCENARIOS, synthetic_scenario
from sim.app.report import write_outputs
from sim.core.errors import DappleError, ScenarioError
from sim.core.faults import Failure, Jitter, SlowLink, Straggler, jitter_factors
from sim.engine.compile import compile_workload
from sim.engine.replay import simulate
from sim.engine.run import run_scenario
from sim.input.scenario import load_scenario

STRAGGLER = SCENARIOS / "bert48_v100_straggler.yaml"


def _with(scenario, *faults):
    from dataclasses import replace

    return replace(scenario, faults=tuple(faults))


def _pipeline(**kw):
    return synthetic_scenario(fwd_s=[1.0, 1.0, 1.0], bwd_s=[2.0, 2.0, 2.0], microbatches=4, **kw)


def test_straggler_slows_its_compute_from_its_start_time():
    base = run_scenario(_pipeline())
    slow = run_scenario(_with(_pipeline(), Straggler(device=1, slowdown=2.0)))
    assert slow.summary()["devices"][1]["busy_s"] == pytest.approx(2 * base.summary()["devices"][1]["busy_s"])
    assert slow.iteration_time_s > base.iteration_time_s
    impact = slow.summary()["fault_impact"]
    assert impact["fault_free_iteration_time_s"] == pytest.approx(base.iteration_time_s)
    assert impact["slowdown"] == pytest.approx(slow.iteration_time_s / base.iteration_time_s)
    late = run_scenario(_with(_pipeline(), Straggler(device=1, slowdown=2.0, from_s=1e6)))
    assert late.iteration_time_s == pytest.approx(base.iteration_time_s)
    # the fast path applies stragglers too
    fast = run_scenario(_with(_pipeline(), Straggler(device=1, slowdown=2.0)), engine="fast")
    assert fast.iteration_time_s == pytest.approx(slow.iteration_time_s)


def test_jitter_is_seeded():
    jitter = Jitter(distribution="normal", spread=0.2, seed=5)
    assert jitter_factors(jitter, 3, 10) == jitter_factors(jitter, 3, 10)
    assert jitter_factors(jitter, 3, 10) != jitter_factors(Jitter(spread=0.2, seed=6), 3, 10)
    a = run_scenario(_with(_pipeline(), jitter)).iteration_time_s
    b = run_scenario(_with(_pipeline(), jitter)).iteration_time_s
    c = run_scenario(_with(_pipeline(), Jitter(spread=0.2, seed=6))).iteration_time_s
    assert a == b and a != c
    for dist in ("uniform", "lognormal"):
        factors = jitter_factors(Jitter(distribution=dist, spread=0.3, seed=1), 0, 2000)
        assert min(factors) > 0 and sum(factors) / len(factors) == pytest.approx(1.0, abs=0.03)


def test_slow_nic_limits_an_inter_node_transfer():
    scenario = synthetic_scenario(fwd_s=[0.0, 0.0], bwd_s=[0.0, 0.0], microbatches=1, devices_per_node=1,
                                  boundary_bytes=1e9, inter_bandwidth=1e9)
    healthy = simulate(compile_workload(scenario)).iteration_time_s
    slowed = simulate(compile_workload(_with(scenario, SlowLink(nic=0, factor=0.5)))).iteration_time_s
    # a degraded card is slow both ways: the activations leave through NIC 0, the gradients enter it
    assert healthy == pytest.approx(2.0)
    assert slowed == pytest.approx(2 * 1.0 / 0.5)


def test_failure_stops_the_iteration_and_reports_what_is_lost():
    scenario = _with(_pipeline(), Failure(device=2, at_s=4.5))
    result = run_scenario(scenario)
    summary = result.summary()
    assert result.iteration_time_s is None and summary["iteration_time_s"] is None
    failure = summary["failure"]
    assert failure["device"] == 2 and failure["time_s"] == 4.5
    assert failure["action"].startswith("2")
    assert 0 < failure["lost_compute_s"] <= 3 * 4.5
    assert "device 2 failed at 4500.000 ms" in failure["message"]
    with pytest.raises(DappleError, match="need the SimPy engine"):
        run_scenario(scenario, engine="fast")
    after = run_scenario(_with(_pipeline(), Failure(device=2, at_s=1e6)))
    assert after.iteration_time_s == pytest.approx(run_scenario(_pipeline()).iteration_time_s)


def test_faulty_devices_leave_their_symmetry_class():
    scenario = synthetic_scenario(fwd_s=[1.0, 1.0], bwd_s=[2.0, 2.0], replicas=[4, 4], boundary_bytes=1e6,
                                  param_bytes=1e6)
    assert len(compile_workload(scenario).classes) == 2
    faulty = _with(scenario, Straggler(device=1, slowdown=1.3), SlowLink(device=6, factor=0.5))
    reduced = simulate(compile_workload(faulty))
    full = simulate(compile_workload(faulty, symmetric=False))
    assert len(reduced.workload.classes) > 2
    assert reduced.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-12)
    for a, b in zip(reduced.summary()["devices"], full.summary()["devices"]):
        assert a["busy_s"] == pytest.approx(b["busy_s"], rel=1e-12)


def test_straggler_scenario_loads_and_reports_its_impact(tmp_path):
    result = run_scenario(load_scenario(STRAGGLER))
    summary = result.summary()
    assert summary["fault_impact"]["slowdown"] > 1.05
    files = write_outputs(result, tmp_path)
    assert (tmp_path / "faults.png") in files and (tmp_path / "faults.png").stat().st_size > 5000


@pytest.mark.parametrize(
    ("faults", "key"),
    [
        ("[{type: straggler, device: 99, slowdown: 2}]", "faults[0].device"),
        ("[{type: straggler, device: 1}]", "faults[0].slowdown"),
        ("[{type: straggler, device: 1, slowdown: -1}]", "faults[0].slowdown"),
        ("[{type: jitter, distribution: gaussian}]", "faults[0].distribution"),
        ("[{type: jitter, spread: 1.5, distribution: uniform}]", "faults[0].spread"),
        ("[{type: slow_link, factor: 0.5}]", "faults[0].nic"),
        ("[{type: slow_link, nic: 7, factor: 0.5}]", "faults[0].nic"),
        ("[{type: failure, device: 2, at: 3}]", "faults[0].at"),
        ("[{type: meteor}]", "faults[0].type"),
        ("{type: straggler}", "faults"),
    ],
)
def test_bad_faults_name_their_key(faults, key):
    with pytest.raises(ScenarioError, match=key.replace("[", r"\[").replace("]", r"\]")):
        load_scenario(SCENARIOS / "bert48_v100_2x8.yaml", {"faults": faults})


def test_same_seed_gives_byte_identical_summary_and_trace(tmp_path):
    overrides = {"faults": "[{type: jitter, spread: 0.1, seed: 11}, {type: straggler, device: 3, slowdown: 1.2}]"}
    outputs = []
    for folder in ("a", "b"):
        result = run_scenario(load_scenario(SCENARIOS / "bert48_v100_2x8.yaml", overrides))
        write_outputs(result, tmp_path / folder)
        outputs.append({name: (tmp_path / folder / name).read_bytes() for name in ("summary.json", "trace.json")})
    assert outputs[0] == outputs[1]
    other = run_scenario(load_scenario(SCENARIOS / "bert48_v100_2x8.yaml",
                                       {"faults": overrides["faults"].replace("seed: 11", "seed: 12")}))
    assert json.loads(outputs[0]["summary.json"])["iteration_time_s"] != other.iteration_time_s


def test_a_failed_iteration_still_writes_its_timeline(tmp_path):
    result = run_scenario(_with(_pipeline(), Failure(device=2, at_s=4.5)))
    files = write_outputs(result, tmp_path)
    names = {path.name for path in files}
    assert {"summary.json", "trace.json", "gantt.png", "memory.png"} <= names and "faults.png" not in names
    assert json.loads((tmp_path / "summary.json").read_text())["failure"]["device"] == 2
