"""Partial symmetry: a fault splits only the classes that wait for it, and the replay stays exact.

Without contention (the fast path, the SimPy engine with ``contention=False``) the classes of
``sim.engine.classes.Symmetry.behaviour`` must give the same summary as replaying every
device (``symmetric=False``): iteration time, bubbles, every device's busy and idle time,
memory and bytes, and the fault's impact. With contention the equitable classes must too.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import _assert_close

from conftest import SCENARIOS, synthetic_scenario
from sim.core.errors import ScenarioError
from sim.core.faults import Failure, Jitter, SlowLink, Straggler, jitter_factors
from sim.engine.compile import compile_workload
from sim.engine.replay import simulate
from sim.engine.run import run_scenario
from sim.input.scenario import load_scenario

ENGINES = [("fast", False), ("simpy", False), ("simpy", True)]
"""(engine, contention) of every replay the tests compare."""


def _summaries(scenario, engine: str, contention: bool) -> tuple[dict, dict]:
    """The summary with symmetry and without, ``device_classes`` taken out of both."""
    out = []
    for symmetric in (True, False):
        summary = run_scenario(scenario, engine=engine, contention=contention, symmetric=symmetric).summary()
        out.append(summary)
    classes = out[0].pop("device_classes"), out[1].pop("device_classes")
    assert classes[0] <= classes[1] == out[1]["num_devices"]
    return out[0], out[1]


def _with(scenario, *faults):
    return replace(scenario, faults=tuple(faults))


def _grid(replicas=(4, 4, 4, 4), devices_per_node=4, **kw):
    return synthetic_scenario(fwd_s=[1.0, 1.2, 0.9, 1.1][:len(replicas)], bwd_s=[2.0, 2.1, 1.8, 2.2][:len(replicas)],
                              replicas=list(replicas), microbatches=6, devices_per_node=devices_per_node,
                              boundary_bytes=4e8, param_bytes=2e8, latency_s=1e-5, **kw)


FAULTS = {
    "straggler": (Straggler(device=5, slowdown=1.7, from_s=0.5),),
    "slow-nic": (SlowLink(nic=1, factor=0.2),),
    "slow-port": (SlowLink(device=6, factor=0.3),),
    "jitter-device": (Jitter(spread=0.1, seed=3, devices=(4, 9)),),
    "jitter-replica": (Jitter(spread=0.1, seed=3, per="replica"),),
    "jitter-stage": (Jitter(spread=0.1, seed=3, per="stage"),),
    "mixed": (Straggler(device=2, slowdown=1.3), SlowLink(nic=2, factor=0.5), Jitter(spread=0.05, seed=1, devices=(12,))),
}


@pytest.mark.parametrize("engine, contention", ENGINES)
@pytest.mark.parametrize("name", sorted(FAULTS))
def test_faulted_replay_with_classes_equals_every_device(name, engine, contention):
    with_classes, every = _summaries(_with(_grid(), *FAULTS[name]), engine, contention)
    assert with_classes == every


@pytest.mark.parametrize("contention", [False, True])
def test_a_failure_with_classes_equals_every_device(contention):
    with_classes, every = _summaries(_with(_grid(), Failure(device=9, at_s=3.0)), "simpy", contention)
    assert with_classes == every and with_classes["failure"]["device"] == 9


def test_one_straggler_splits_only_what_waits_for_it():
    """16 replicas of 4 stages, one straggler in stage 1: without contention its own replica
    chain through the pipeline and the devices beside it on its server are split off (they
    send together without it), a few classes per stage, not one per device."""
    scenario = _with(_grid(replicas=(16, 16, 16, 16)), Straggler(device=21, slowdown=2.0))
    free = compile_workload(scenario, contention=False)
    exact = compile_workload(scenario, contention=True)
    healthy = compile_workload(_grid(replicas=(16, 16, 16, 16)), contention=False)
    assert len(healthy.classes) == 4
    assert len(free.classes) <= 4 * 4 < len(exact.classes)
    alone = [c for c in free.classes if 21 in c.devices]
    assert alone[0].devices == (21,) and alone[0].slowdown == 2.0
    result = run_scenario(scenario, engine="fast").summary()
    assert result["device_classes"] == len(free.classes)


@pytest.mark.parametrize("path", ["llama3_70b_h100_fsdp.yaml", "llama3_8b_h100_context_parallel.yaml",
                                  "gpt3_175b_a100_tp8_pp8.yaml"])
@pytest.mark.parametrize("engine", ["fast", "simpy"])
def test_4d_plan_with_a_straggler_and_jitter_is_exact(path, engine):
    """Tensor, context and FSDP groups wait for their slowest member: the straggler's groups
    split, and the result equals replaying every device."""
    scenario = load_scenario(SCENARIOS / path)
    scenario = _with(scenario, Straggler(device=3, slowdown=1.5), Jitter(spread=0.05, seed=2, per="replica",
                                                                         devices=tuple(range(16, 32))))
    with_classes, every = _summaries(scenario, engine, False)
    assert with_classes == every
    assert compile_workload(scenario, contention=False).classes.__len__() < scenario.cluster.num_devices


@settings(max_examples=40, deadline=None)
@given(
    replicas=st.lists(st.integers(1, 5), min_size=2, max_size=4),
    devices_per_node=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 2**16),
    engine=st.sampled_from(["fast", "simpy", "simpy-contention"]),
)
def test_random_faulted_plans_are_exact(replicas, devices_per_node, seed, engine):
    """Property: on random uneven plans with random stragglers, slow links and jitter, the
    replay with partial symmetry (contention-free, or with contention the optimistic classes
    and the equitable ones when they diverge) equals the one of every device."""
    rng = random.Random(seed)
    scenario = _grid(replicas=replicas, devices_per_node=devices_per_node)
    devices, nics = scenario.cluster.num_devices, scenario.cluster.nodes * scenario.cluster.nics_per_node
    faults = [Straggler(device=rng.randrange(devices), slowdown=rng.choice([1.25, 2.0]),
                        from_s=rng.choice([0.0, 2.0]))]
    if rng.random() < 0.5:
        faults.append(SlowLink(nic=rng.randrange(nics), factor=0.5))
    if rng.random() < 0.5:
        faults.append(SlowLink(device=rng.randrange(devices), factor=0.25))
    if rng.random() < 0.5:
        faults.append(Jitter(spread=0.1, seed=seed, per=rng.choice(["device", "replica", "stage"]),
                             devices=tuple(sorted(rng.sample(range(devices), min(3, devices))))))
    contention = engine == "simpy-contention"
    with_classes, every = _summaries(_with(scenario, *faults), "simpy" if contention else engine, contention)
    if contention:  # shared ports' rates are recomputed at other instants: equal up to rounding
        _assert_close(with_classes, every)
    else:
        assert with_classes == every


def test_jitter_draws_are_named_by_device_replica_or_stage():
    """``per: device`` draws what it always drew (``Random(f"{seed}:{device}")``); ``replica``
    and ``stage`` draw one sequence per replica or device set, named by its lowest device."""
    jitter = Jitter(spread=0.2, seed=9)
    rng = random.Random("9:5")
    assert jitter_factors(jitter, 5, 3) == [max(0.05, 1.0 + 0.2 * rng.gauss(0.0, 1.0)) for _ in range(3)]
    scenario = _grid(replicas=(4, 4, 4, 4))
    for per, expected_classes in (("stage", 4), ("replica", 16)):
        jittered = _with(scenario, Jitter(spread=0.2, seed=9, per=per))
        workload = compile_workload(jittered, contention=False)
        assert len(workload.classes) == expected_classes
        busy = {d["device"]: d["busy_s"] for d in run_scenario(jittered, engine="fast").summary()["devices"]}
        assert busy[4] == busy[5] if per == "stage" else busy[4] != busy[5]
    a = run_scenario(_with(scenario, Jitter(spread=0.2, seed=9, per="replica")), engine="fast").summary()
    b = run_scenario(_with(scenario, Jitter(spread=0.2, seed=9, per="replica")), engine="fast").summary()
    c = run_scenario(_with(scenario, Jitter(spread=0.2, seed=10, per="replica")), engine="fast").summary()
    assert a == b and a["iteration_time_s"] != c["iteration_time_s"]


def test_jitter_per_is_checked():
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.per.*valid: device, replica, stage"):
        load_scenario(SCENARIOS / "bert48_v100_2x8.yaml", {"faults": "[{type: jitter, per: node}]"})
    scenario = load_scenario(SCENARIOS / "bert48_v100_2x8.yaml", {"faults": "[{type: jitter, per: replica}]"})
    assert scenario.faults[0].per == "replica"


def test_contention_free_classes_refuse_a_replay_with_contention():
    workload = compile_workload(_with(_grid(), Straggler(device=5, slowdown=2.0)), contention=False)
    with pytest.raises(ValueError, match="contention=True"):
        simulate(workload, contention=True)
    assert simulate(workload, contention=False).iteration_time_s > 0


def test_a_refinement_still_splitting_after_its_rounds_gives_every_device_its_own_class():
    """A fault on a ring splits one neighbour per round: capped, the refinement returns the
    discrete partition (exact too) instead of passing over every flow n/2 times."""
    from sim.engine.symmetry import refine

    n = 200
    ring = [(d, (d + 1) % n, "AR") for d in range(n)]
    healthy = refine([0] * n, [0] * n, ring, 1)
    assert set(healthy[0]) == {0}  # fault-free: one class, whatever the cap
    assert refine([0] * n, [0] * n, ring, 1, max_rounds=2) == healthy
    faulty = [1] + [0] * (n - 1)
    exact = refine(faulty, [0] * n, ring, 1)
    assert sorted(exact[0]) == list(range(n))
    assert refine(faulty, [0] * n, ring, 1, max_rounds=8) == (list(range(n)), [0])


def test_one_straggler_with_contention_splits_few_classes_and_stays_exact():
    """With contention too, a straggler among 512 devices replays a few classes (the gradient
    rings left out of the refinement, the replay checking that the flows it merges leave
    together), and the summary equals replaying every device."""
    from sim.app.report import format_summary

    scenario = _with(synthetic_scenario(fwd_s=[1.0] * 4, bwd_s=[2.0] * 4, replicas=[128] * 4, microbatches=4,
                                        boundary_bytes=4e8, param_bytes=2e8, latency_s=1e-5),
                     Straggler(device=5, slowdown=1.5))
    contended = run_scenario(scenario)
    assert contended.diverged is None and contended.summarize().device_classes < 32
    every = run_scenario(scenario, symmetric=False).summary()
    reduced = contended.summary()
    assert reduced.pop("device_classes") < every.pop("device_classes") == 512
    assert reduced == every
    assert "own classes" not in format_summary(contended.summarize(), contended)


def test_when_the_merged_flows_diverge_the_equitable_classes_are_replayed(monkeypatch):
    """Force a divergence: the replay falls back to the equitable classes, says so, and the
    result is the exact one."""
    from sim.app.report import format_summary
    from sim.engine import replay as engine_replay

    scenario = _with(synthetic_scenario(fwd_s=[1.0] * 4, bwd_s=[2.0] * 4, replicas=[128] * 4, microbatches=4,
                                        boundary_bytes=4e8, param_bytes=2e8, latency_s=1e-5),
                     Straggler(device=5, slowdown=1.5))
    left = engine_replay._Replay._left

    def diverging(self, kind, sending):
        if self.w.optimistic and kind.sibling >= 0:
            raise engine_replay.Diverged(f"flows {kind.label} of class {kind.src_class} left at different times")
        left(self, kind, sending)

    monkeypatch.setattr(engine_replay._Replay, "_left", diverging)
    result = run_scenario(scenario)
    assert result.diverged and not result.workload.optimistic
    assert result.summarize().device_classes * 2 > 512
    assert "own classes" in format_summary(result.summarize(), result)
    monkeypatch.undo()
    assert result.summary()["iteration_time_s"] == run_scenario(scenario, symmetric=False).summary()["iteration_time_s"]


def test_the_report_has_a_row_per_stage_when_there_are_many_classes():
    from sim.app.report import MAX_CLASS_ROWS, format_summary

    scenario = _with(_grid(replicas=(16, 16, 16, 16)), Jitter(spread=0.1, seed=3))
    result = run_scenario(scenario, contention=False)
    assert len(result.workload.classes) > MAX_CLASS_ROWS
    text = format_summary(result.summarize(), result)
    rows = [line for line in text.splitlines() if line.startswith("  ") and line.split()[0][0].isdigit()]
    assert [row.split()[0] for row in rows] == ["0-15", "16-31", "32-47", "48-63"]
    assert "a row per stage" in text
    few = run_scenario(_grid(), contention=False)
    assert "a row per stage" not in format_summary(few.summarize(), few)


def test_optimistic_classes_refuse_a_replay_without_contention():
    from sim.engine.fastpath import replay

    workload = compile_workload(_with(_grid(replicas=(16, 16, 16, 16)), Straggler(device=5, slowdown=2.0)),
                                optimistic=True)
    assert workload.optimistic and len(workload.classes) < 64
    with pytest.raises(ValueError, match="optimistic"):
        simulate(workload, contention=False)
    with pytest.raises(ValueError, match="optimistic"):
        replay(workload)
    assert simulate(workload).iteration_time_s > 0
