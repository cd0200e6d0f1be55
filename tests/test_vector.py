"""The vectorised fast path (``sim.engine.vector``) equals the scalar one.

Classes that share their ops run as one numpy array; forced on (the thresholds lowered) it
must give the scalar fast path's summary on random plans with faults, on 4D plans with
tensor, context and FSDP groups, and explain a plan that cannot run the same way.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine import _assert_close, random_plans

from conftest import SCENARIOS, synthetic_scenario
from sim.core.errors import ScheduleError
from sim.core.faults import Jitter, SlowLink, Straggler
from sim.engine import vector
from sim.engine.compile import compile_workload
from sim.engine.fastpath import replay
from sim.input.scenario import load_scenario


def _both(workload, monkeypatch) -> tuple[dict, dict]:
    """(vectorised, scalar) summaries of one workload."""
    with monkeypatch.context() as patch:
        patch.setattr(vector, "MIN_CLASSES", 0)
        patch.setattr(vector, "MIN_BUNDLE", 0)
        assert vector.worth_vectorising(workload)
        fast = replay(workload).summary()
    with monkeypatch.context() as patch:
        patch.setattr(vector, "MIN_CLASSES", 10**9)
        slow = replay(workload).summary()
    return fast, slow


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(random_plans(), st.integers(0, 2**16), st.booleans())
def test_vectorised_equals_scalar_on_random_faulted_plans(monkeypatch, scenario, seed, symmetric):
    rng = random.Random(seed)
    devices = scenario.cluster.num_devices
    faults = []
    if rng.random() < 0.5:
        faults.append(Straggler(device=rng.randrange(devices), slowdown=rng.choice([1.25, 2.0]),
                                from_s=rng.choice([0.0, 0.5])))
    if rng.random() < 0.5:
        faults.append(Jitter(spread=0.1, seed=seed, per=rng.choice(["device", "replica", "stage"])))
    if rng.random() < 0.3:
        faults.append(SlowLink(device=rng.randrange(devices), factor=0.5))
    workload = compile_workload(replace(scenario, faults=tuple(faults)), symmetric=symmetric, contention=False)
    fast, slow = _both(workload, monkeypatch)
    _assert_close(fast, slow)


@pytest.mark.parametrize("name", ["llama3_70b_h100_fsdp.yaml", "llama3_8b_h100_context_parallel.yaml",
                                  "gpt3_175b_a100_tp8_pp8.yaml", "gpt1.3b_h100_interleaved.yaml"])
def test_vectorised_equals_scalar_on_4d_plans_without_symmetry(name, monkeypatch):
    scenario = load_scenario(SCENARIOS / name)
    scenario = replace(scenario, faults=(Jitter(spread=0.05, seed=4),))
    workload = compile_workload(scenario, symmetric=False, contention=False)
    assert len(vector.bundles_of(workload)) < len(workload.classes)
    fast, slow = _both(workload, monkeypatch)
    _assert_close(fast, slow)


@pytest.mark.parametrize("name", ["llama3_70b_h100_fsdp.yaml", "llama3_8b_h100_context_parallel.yaml"])
def test_vectorised_collectives_beside_the_compute_can_outlast_it(name, monkeypatch):
    """On slow links FSDP's gathers and the context ring outlast the compute they run beside:
    the action ends with them, in both paths."""
    scenario = load_scenario(SCENARIOS / name)
    cluster = scenario.cluster
    slow = replace(cluster, intra_node=replace(cluster.intra_node, bandwidth_bytes_per_s=1e9),
                   inter_node=replace(cluster.inter_node, bandwidth_bytes_per_s=1e8))
    workload = compile_workload(replace(scenario, cluster=slow, faults=(Jitter(spread=0.05, seed=4),)),
                                symmetric=False, contention=False)
    fast, slow_path = _both(workload, monkeypatch)
    _assert_close(fast, slow_path)
    ops = workload.classes[0].ops
    record = replay(workload).records[0]
    beside = [i for i, op in enumerate(ops) if op.code == 4 and op.overlap]  # GROUP ops beside the compute
    assert beside and any(record.op_times[i][1] > record.op_times[i + 1][0] + ops[i + 1].duration_s
                          for i in beside if ops[i + 1].code == 0)


def test_large_distinct_clusters_take_the_vectorised_path():
    scenario = synthetic_scenario(fwd_s=[1.0] * 4, bwd_s=[2.0] * 4, replicas=[64] * 4, microbatches=4,
                                  boundary_bytes=1e6, param_bytes=1e6)
    workload = compile_workload(replace(scenario, faults=(Jitter(spread=0.1, seed=1),)), contention=False)
    assert len(workload.classes) == 256 and len(vector.bundles_of(workload)) == 4
    assert vector.worth_vectorising(workload)
    assert not vector.worth_vectorising(compile_workload(scenario, contention=False))  # 4 classes: scalar


def test_a_vectorised_replay_that_cannot_progress_says_so(monkeypatch):
    from sim.engine.workload import SEND

    scenario = synthetic_scenario(fwd_s=[1.0, 1.0], bwd_s=[1.0, 1.0], replicas=[2, 2], boundary_bytes=1e3)
    workload = compile_workload(scenario, symmetric=False)
    broken = []
    for cls in workload.classes:
        if cls.rank == 0:
            kept = [i for i, op in enumerate(cls.ops) if op.code != SEND]
            cls = replace(cls, ops=tuple(cls.ops[i] for i in kept), durations=[cls.durations[i] for i in kept])
        broken.append(cls)
    # the two rank-0 classes keep sharing one tuple of ops
    shared = broken[0].ops
    broken = [replace(c, ops=shared) if c.rank == 0 else c for c in broken]
    monkeypatch.setattr(vector, "MIN_CLASSES", 0)
    monkeypatch.setattr(vector, "MIN_BUNDLE", 0)
    with pytest.raises(ScheduleError, match="cannot make progress"):
        replay(replace(workload, classes=tuple(broken)))
